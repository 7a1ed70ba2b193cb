#!/bin/sh
# node-init.sh — PID 1 of a lab node container (test/lab/nodes.sh copies it to
# /usr/local/sbin/lab-node-init in the node tree and starts systemd-nspawn with it). It prepares what
# kubelet, containerd and runc need on this kind of host (see /work/shared/LAB.md, "Kubernetes nodes in
# systemd-nspawn"), then execs systemd, which becomes PID 1 in its place.
#
#  1. The cgroup hierarchies under /sys/fs/cgroup (nspawn mounts them read-only) are remounted
#     read-write: systemd (the kubelet's cgroup driver) and runc create the pods' cgroups there. nodes.sh
#     has put the container into a cgroup of its own in every hierarchy (lab-PREFIX-NODE).
#  2. Per-network-namespace sysctls kube-proxy and pod networking need: net.ipv4.ip_forward=1,
#     net.bridge.bridge-nf-call-iptables=1 and bridge-nf-call-ip6tables=1 (per netns since Linux 5.3;
#     the br_netfilter module must already be loaded on the host; this script never loads modules).
#     nspawn leaves /proc/sys/net writable because nodes.sh sets SYSTEMD_NSPAWN_API_VFS_WRITABLE=network.
#  3. The global sysctls kubelet writes at start (vm.overcommit_memory, vm.panic_on_oom, kernel.panic,
#     kernel.panic_on_oops, kernel.keys.root_maxkeys, kernel.keys.root_maxbytes) and the one kube-proxy
#     may write (net.netfilter.nf_conntrack_max, host-wide and read-only in a network namespace) get a
#     private regular file, initialised with the host's value, bind-mounted over them: the node's
#     writes land in /run/lab-node-init/sysctl/NAME and the host kernel is never changed.
#  4. `mount --make-rshared /`: kubelet and containerd need mount propagation for volumes. Propagation
#     from inside never reaches the host: nspawn made the container's mounts slaves of the host's.
#
# Any failure stops the container before systemd starts (nodes.sh then reports "see console.log").
set -eu

log() { echo "lab-node-init: $*"; }
fail() { echo "lab-node-init: error: $*" >&2; exit 1; }

# 1. cgroup hierarchies read-write (every cgroup/cgroup2 mount nspawn made, including nested binds).
for target in $(findmnt -rn -t cgroup,cgroup2 -o TARGET); do
	mount -o remount,rw "$target" 2>/dev/null || mount -o remount,bind,rw "$target" ||
		fail "cannot remount $target read-write (is the container started with --capability=all?)"
done

# 2. Per-netns sysctls.
setsysctl() { # NAME VALUE
	f=/proc/sys/$(echo "$1" | tr . /)
	[ -e "$f" ] || fail "$1: $f missing (net.bridge.* needs the br_netfilter module loaded on the host)"
	echo "$2" >"$f" || fail "cannot set $1 (did nodes.sh set SYSTEMD_NSPAWN_API_VFS_WRITABLE=network?)"
}
setsysctl net.ipv4.ip_forward 1
setsysctl net.bridge.bridge-nf-call-iptables 1
setsysctl net.bridge.bridge-nf-call-ip6tables 1

# 3. Private copies of the global sysctls.
priv=/run/lab-node-init/sysctl
mkdir -p "$priv"
for name in vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops \
	kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.netfilter.nf_conntrack_max; do
	f=/proc/sys/$(echo "$name" | tr . /)
	[ -e "$f" ] || { log "$name: not present on this kernel, nothing to shadow"; continue; }
	if findmnt -rn "$f" >/dev/null; then continue; fi # already shadowed
	cat "$f" >"$priv/$name"
	mount --bind "$priv/$name" "$f" || fail "cannot bind a private file over $f"
done

# 4. Shared mount propagation inside the container.
mount --make-rshared / || fail "mount --make-rshared / failed"

log "cgroups rw, / rshared, ip_forward and bridge-nf-call-ip*tables on, global sysctls shadowed in $priv"

for init in /lib/systemd/systemd /usr/lib/systemd/systemd; do
	[ -x "$init" ] && exec "$init" "$@"
done
fail "systemd not found in the node tree"
