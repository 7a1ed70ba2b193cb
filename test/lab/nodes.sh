#!/usr/bin/env bash
# nodes.sh — turn the lab's node namespaces (test/lab/lab.sh) into hosts.
#
#   nodes.sh up [NODE...]     start nodes (default: every cpI and wI namespace of the lab); idempotent
#   nodes.sh down [NODE...]   stop them (default: all) and unmount everything nodes.sh mounted
#   nodes.sh status           one line per node: state, PIDs, addresses
#   nodes.sh reboot NODE      reboot a pre-installed node (its systemd reboots; nspawn starts it again)
#   nodes.sh ssh NODE CMD...  run CMD on a pre-installed node as root, over SSH from P-boot, host key pinned
#
# Environment: P = LAB_PREFIX (default lab); LAB_DIR (default /var/lib/appliance-lab for the prefix
# "lab", /var/lib/appliance-lab-P for any other, so labs never share node directories; a LAB_DIR that
# already holds running nodes of another prefix is refused); LAB_WORKER_KIND = vm (default) or nspawn,
# the kind wI nodes are started as; LAB_VM_BOOT = kit (default) or pxe, how a VM worker boots
# (test/lab/vm/chassis.sh: the lab kit, or a blank machine that network-boots, with one blank disk
# whose serial is LAB-DISK-<node>, and with LAB_VM_DECOY_GB a second, decoy disk of that size);
# LAB_VM_MEMORY_MB its memory in MiB (default 1024). Each node's
# state lives in LAB_DIR/nodes/<node>, its kind in LAB_DIR/nodes/<node>/kind.
#
# Two kinds of node:
#
#   nspawn — pre-installed host (the appliance reaches it over SSH): every cpI, and wI when
#         LAB_WORKER_KIND=nspawn. A Debian bookworm systemd-nspawn container booted with systemd inside
#         namespace P-<node>, using that namespace's interfaces and addresses as they are
#         (cpI: 10.100.0.1I, 10.200.0.1I; wI: 10.100.0.(20+I), 10.200.0.(20+I)). Its root is an
#         overlayfs: lower = the cached tree of test/fixtures/build-rootfs.sh, upper/work =
#         LAB_DIR/nodes/<node>/{upper,work}, mounted at LAB_DIR/nodes/<node>/root. nodes.sh injects
#         /etc/hostname, /etc/hosts (the node's name -> its control-plane address), a static
#         /etc/resolv.conf (nameserver 10.100.0.2, the bootstrap host), the lab SSH host key
#         (LAB_DIR/ssh/host_ed25519), root's authorized_keys (LAB_DIR/ssh/id_ed25519.pub) and
#         test/lab/node-init.sh as /usr/local/sbin/lab-node-init, masks systemd-modules-load (a node
#         never loads kernel modules into the host) and sets DefaultTimeoutStopSec=10s (pods that ignore
#         SIGTERM would hold a power-off for 90 s). A small supervisor (`nodes.sh _run`, setsid,
#         PID in supervisor.pid, log in console.log) runs systemd-nspawn again when the container
#         reboots (exit status 133) and stops when it powers off.
#         What Kubernetes needs (LAB.md): nspawn runs with SYSTEMD_NSPAWN_API_VFS_WRITABLE=network,
#         --capability=all, --bind=/dev/kmsg (kubelet), --system-call-filter=@keyring (runc),
#         --kill-signal=SIGRTMIN+3, LAB_DIR/nodes/<node>/containerd bound on /var/lib/containerd
#         (containerd's overlayfs snapshotter cannot put its upper directories on the node's overlayfs
#         root: "not supported as upperdir"), and lab-node-init as PID 1 (cgroups read-write, / rshared,
#         per-netns sysctls, private copies of the global sysctls kubelet writes; see node-init.sh),
#         which execs systemd. Before it starts, systemd-nspawn moves into a cgroup of its own,
#         lab-P-<node>, below the supervisor's cgroup in every hierarchy (listed in
#         LAB_DIR/nodes/<node>/cgroups; `down` removes them).
#         Ready = `ssh root@<address> systemctl is-system-running` from P-boot, with the lab key and
#         a strict known_hosts, answers running or degraded.
#
#   vm  — wI (the default LAB_WORKER_KIND): bare metal behind a BMC (the appliance powers it on over
#         IPMI): namespace P-bmcI holds the BMC address 10.100.0.(120+I) on a veth into the fabric's br-cp, and an OpenIPMI ipmi_sim
#         serving IPMI-over-LAN (RMCP+, cipher suite 3) with user admin / LAB_DIR/bmc/wI.password; its
#         PID in ipmi_sim.pid is the process bound to the port, checked with ss -p (setsid(1) may fork).
#         Its chassis_control program is test/lab/vm/chassis.sh, which starts a QEMU VM (TCG) inside
#         P-wI on power-on and kills it on power-off. Inside P-wI, bridges br0 (eth0 + tap0) and br1
#         (eth1 + tap1) hand both planes to the VM, which owns 10.100.0.(20+I) and 10.200.0.(20+I);
#         the namespace keeps no address of its own. `up` starts the BMC only: the VM stays off until
#         someone (the appliance) powers it on. See test/lab/vm/chassis.sh for the boot contract.
#
# Host changes: systemd-nspawn refuses to start unless /run/systemd/nspawn is a tmpfs, so `up` mounts a
# tmpfs there when it is not one (and says so); `down` unmounts it again when nodes.sh mounted it and
# no container still uses it. Nothing else outside LAB_DIR and the lab's namespaces is touched; the root
# network namespace is never changed. Processes are stopped by the PIDs nodes.sh recorded, after
# checking that each PID still runs the program recorded for it.
#
# Needs: systemd-container, debootstrap, openssh-client, openipmi, ipmitool, qemu-system-x86,
# busybox-static, cpio, ignition, iproute2, util-linux (setsid, nsenter, flock, findmnt).
set -euo pipefail

P=${LAB_PREFIX:-lab}
[[ $P =~ ^[a-z][a-z0-9]{0,5}$ ]] || { echo "nodes.sh: LAB_PREFIX '$P' must be 1-6 characters of [a-z0-9] starting with a letter" >&2; exit 2; }
if [[ $P == lab ]]; then LABDIR=${LAB_DIR:-/var/lib/appliance-lab}; else LABDIR=${LAB_DIR:-/var/lib/appliance-lab-$P}; fi
WORKER_KIND=${LAB_WORKER_KIND:-vm}
[[ $WORKER_KIND == vm || $WORKER_KIND == nspawn ]] || { echo "nodes.sh: LAB_WORKER_KIND '$WORKER_KIND' must be vm or nspawn" >&2; exit 2; }
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
NSPAWN_RUN=/run/systemd/nspawn
MOUNT_MARK=$NSPAWN_RUN/.mounted-by-appliance-lab
READY_TIMEOUT=${NODES_READY_TIMEOUT:-90} # seconds a node may take to answer SSH (a bound, not an expectation)
STOP_TIMEOUT=${NODES_STOP_TIMEOUT:-30}   # seconds a container may take to power off before SIGKILL
SSH_DIR=$LABDIR/ssh

log() { printf 'nodes.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
[[ $(id -u) == 0 ]] || die "must run as root (it mounts overlays and starts containers in namespaces)"

nodedir() { echo "$LABDIR/nodes/$1"; }
ns_of() { echo "$P-$1"; }
node_index() { echo "${1##*[a-z]}"; } # cp3 -> 3, w12 -> 12
# node_ip NODE [NET]: the node's address on the control plane (10.100.0) or NET; lab.sh's numbering.
node_ip() {
	case $1 in
	cp*) echo "${2:-10.100.0}.$((10 + $(node_index "$1")))" ;;
	*) echo "${2:-10.100.0}.$((20 + $(node_index "$1")))" ;;
	esac
}

# kind_of NODE: nspawn or vm. cpI is always nspawn; wI is what it was started as (LAB_DIR/nodes/wI/kind),
# or what a leftover directory shows, or LAB_WORKER_KIND for a node never started.
kind_of() {
	local d
	[[ $1 == cp* ]] && { echo nspawn; return; }
	d=$(nodedir "$1")
	if [[ -s $d/kind ]]; then cat "$d/kind"
	elif [[ -e $d/chassis.env || -e $d/ipmi_sim.pid ]]; then echo vm
	elif [[ -e $d/root ]]; then echo nspawn
	else echo "$WORKER_KIND"; fi
}
# active NODE: the node's supervisor (nspawn) or BMC (vm) runs.
active() {
	local d
	d=$(nodedir "$1")
	alive "$d/supervisor.pid" "_run $1" || alive "$d/ipmi_sim.pid" ipmi_sim
}

# alive PIDFILE WORD: the PID in PIDFILE runs and its command line contains WORD (guards against reuse).
alive() {
	local pid
	[[ -s $1 ]] || return 1
	pid=$(<"$1")
	[[ $pid =~ ^[0-9]+$ && -r /proc/$pid/cmdline ]] || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$2"
}
pid_of() { cat "$1"; }

# running PID: the process exists and has not exited (not a zombie). Unlike alive, it does not read
# /proc/PID/cmdline, which reads empty while the process is in execve: `nsenter … setsid ipmi_sim`
# execs twice under the PID just started, and alive saw that window as "exited" (the
# TestNodesConverge flake "w1: ipmi_sim exited").
running() {
	local st
	st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null) || return 1
	[[ -n $st && ${st%% *} != Z ]]
}

# wait_gone PID SECONDS: wait until PID has exited (a zombie has: whoever reaps orphans here may
# take a while); 1 if it still runs after SECONDS.
wait_gone() {
	local pid=$1 deadline=$((SECONDS + $2))
	while running "$pid" && ((SECONDS < deadline)); do sleep 0.2; done
	! running "$pid"
}

# All lab nodes: every P-cpI / P-wI namespace lab.sh created.
all_nodes() {
	ip netns list | awk '{print $1}' | sed -nE "s/^$P-((cp|w)[1-9][0-9]?)\$/\1/p" | sort -V
}
check_node() {
	[[ $1 =~ ^(cp[1-9]|w[1-9][0-9]?)$ ]] || die "unknown node '$1' (want cp1..cp9 or w1..w79)"
	[[ -e /run/netns/$(ns_of "$1") ]] || die "namespace $(ns_of "$1") missing: run test/lab/lab.sh up first (LAB_PREFIX=$P)"
}

# ---------------------------------------------------------------------------------------------------
# Pre-installed nodes (systemd-nspawn)

ensure_nspawn_run() {
	mkdir -p "$NSPAWN_RUN"
	if [[ $(stat -f -c %T "$NSPAWN_RUN") != tmpfs ]]; then
		mount -t tmpfs -o mode=0755,size=16m appliance-lab-nspawn "$NSPAWN_RUN"
		: >"$MOUNT_MARK"
		log "mounted a tmpfs on the host's $NSPAWN_RUN (systemd-nspawn requires one; 'down' removes it)"
	fi
}

release_nspawn_run() {
	[[ -e $MOUNT_MARK ]] || return 0
	# nspawn keeps a directory per running container under propagate/ (and unix-export/), named after
	# the machine; a systemd-nspawn that was SIGKILLed (a lab whose test run was killed) leaves its
	# directories behind. Those of machines no systemd-nspawn runs any more are removed here, so a dead
	# lab of any prefix never keeps the tmpfs mounted.
	local entry name
	for entry in "$NSPAWN_RUN"/propagate/* "$NSPAWN_RUN"/unix-export/*; do
		[[ -e $entry ]] || continue
		name=$(basename "$entry")
		if ! pgrep -f -- "systemd-nspawn .*--machine=$name( |\$)" >/dev/null; then
			rm -rf "$entry" && log "removed $entry: no systemd-nspawn runs machine $name (a killed lab's)"
		fi
	done
	if compgen -G "$NSPAWN_RUN/propagate/*" >/dev/null || compgen -G "$NSPAWN_RUN/unix-export/*" >/dev/null; then
		log "keeping the tmpfs on $NSPAWN_RUN: containers still use it"
		return 0
	fi
	umount "$NSPAWN_RUN" && log "unmounted the tmpfs on $NSPAWN_RUN"
}

ct_mounted() { mountpoint -q "$(nodedir "$1")/root"; }

# ct_plain_net NODE: the node's namespace must carry its addresses itself (lab.sh puts them there;
# a namespace a VM worker used is bridged instead: LAB_WORKER_KIND=nspawn lab.sh up undoes that).
ct_plain_net() {
	local node=$1 ns
	ns=$(ns_of "$node")
	ip -n "$ns" -br addr show dev eth0 2>/dev/null | grep -qF " $(node_ip "$node")/24" || die \
		"$node: $ns has no $(node_ip "$node") on eth0 (bridged for a VM before?): run LAB_WORKER_KIND=nspawn LAB_PREFIX=$P test/lab/lab.sh up first"
}

ct_prepare() {
	local node=$1 d rootfs
	d=$(nodedir "$node")
	[[ -n ${ROOTFS:-} ]] || ROOTFS=$("$REPO/test/fixtures/build-rootfs.sh") || die "cannot build the node root filesystem"
	rootfs=$ROOTFS
	mkdir -p "$d/upper" "$d/work" "$d/root" "$d/containerd"
	if ! ct_mounted "$node"; then
		mount -t overlay "overlay-$P-$node" -o "lowerdir=$rootfs,upperdir=$d/upper,workdir=$d/work" "$d/root"
	fi
	local r=$d/root
	echo "$node" >"$r/etc/hostname"
	printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n%s\t%s\n' "$(node_ip "$node")" "$node" >"$r/etc/hosts"
	rm -f "$r/etc/resolv.conf" # a symlink in some trees: never write through it
	printf 'nameserver 10.100.0.2\n' >"$r/etc/resolv.conf"
	install -m 0600 "$SSH_DIR/host_ed25519" "$r/etc/ssh/ssh_host_ed25519_key"
	install -m 0644 "$SSH_DIR/host_ed25519.pub" "$r/etc/ssh/ssh_host_ed25519_key.pub"
	install -d -m 0700 "$r/root/.ssh"
	install -m 0600 "$SSH_DIR/id_ed25519.pub" "$r/root/.ssh/authorized_keys"
	ln -sfn /lib/systemd/system/ssh.service "$r/etc/systemd/system/multi-user.target.wants/ssh.service"
	ln -sfn /dev/null "$r/etc/systemd/system/systemd-modules-load.service"
	# Pod containers whose PID 1 ignores SIGTERM would hold a power-off for systemd's default 90 s.
	install -d "$r/etc/systemd/system.conf.d"
	printf '[Manager]\nDefaultTimeoutStopSec=10s\n' >"$r/etc/systemd/system.conf.d/lab-node.conf"
	install -D -m 0755 "$HERE/node-init.sh" "$r/usr/local/sbin/lab-node-init"
}

# ct_cgroups NODE: one line per cgroup hierarchy this process is in: the directory of the node's own
# cgroup, lab-P-NODE, right below this process's cgroup there (mount point + path from /proc/self/cgroup).
ct_cgroups() {
	local node=$1 id ctrls path target fs opts found
	while IFS=: read -r id ctrls path; do
		found=
		while read -r target fs opts; do
			if [[ -z $ctrls && $fs == cgroup2 ]] || [[ -n $ctrls && $fs == cgroup && ,$opts, == *,$ctrls,* ]]; then
				found=$target
				break
			fi
		done < <(findmnt -rn -t cgroup,cgroup2 -o TARGET,FSTYPE,OPTIONS)
		[[ -n $found ]] && echo "$found${path%/}/lab-$P-$node"
	done </proc/self/cgroup
}

# ct_join_cgroups NODE: move this process into the node's own cgroup in every hierarchy (created as
# needed; a v1 cpuset gets its parent's cpus and mems first, or no task may join it); list them in
# LAB_DIR/nodes/NODE/cgroups for `down`.
ct_join_cgroups() {
	local node=$1 dir f dirs
	dirs=$(ct_cgroups "$node")
	echo "$dirs" >"$(nodedir "$node")/cgroups"
	for dir in $dirs; do
		mkdir -p "$dir"
		for f in cpuset.cpus cpuset.mems; do
			[[ -e $dir/$f && -z $(<"$dir/$f") ]] && cat "$(dirname "$dir")/$f" >"$dir/$f"
		done
		echo "$BASHPID" >"$dir/cgroup.procs"
	done
}

# ct_remove_cgroups NODE: remove the node's cgroups, as listed when it started (depth first; busy ones
# are reported and kept, and the list with them). Only directories named lab-P-NODE under
# /sys/fs/cgroup are touched.
ct_remove_cgroups() {
	local node=$1 dir list busy=0
	list=$(nodedir "$node")/cgroups
	[[ -s $list ]] || return 0
	for dir in $(<"$list"); do
		[[ $dir == /sys/fs/cgroup/* && $dir == */lab-$P-$node && -d $dir ]] || continue
		find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || true
		[[ ! -d $dir ]] || { busy=1; log "$node: cgroup $dir still in use (not removed)"; }
	done
	((busy)) || rm -f "$list"
}

# _run NODE: the supervisor (runs detached): systemd-nspawn in the foreground, again after a reboot.
ct_run() {
	local node=$1 d rc pid
	d=$(nodedir "$node")
	stop=0
	# Forward only the first SIGTERM: a second one makes systemd-nspawn kill the container at once.
	trap '((stop)) || { stop=1; [[ -n ${pid:-} ]] && kill -TERM "$pid" 2>/dev/null; }' TERM INT
	while :; do
		rm -f "$d/nspawn.pid"
		(
			ct_join_cgroups "$node"
			SYSTEMD_NSPAWN_API_VFS_WRITABLE=network exec systemd-nspawn --directory="$d/root" \
				--machine="$P-$node" --hostname="$node" \
				--register=no --keep-unit --console=pipe --link-journal=no --resolv-conf=off \
				--timezone=off --capability=all --system-call-filter=@keyring --bind=/dev/kmsg \
				--bind="$d/containerd:/var/lib/containerd" \
				--kill-signal=SIGRTMIN+3 --network-namespace-path="/run/netns/$(ns_of "$node")" \
				/usr/local/sbin/lab-node-init
		) </dev/null &
		pid=$!
		echo "$pid" >"$d/nspawn.pid"
		rc=0
		while :; do
			wait "$pid" && rc=0 || rc=$?
			# wait returns early (>128) when a trapped signal arrives; the container may still run.
			[[ -e /proc/$pid ]] || break
		done
		pid=
		rm -f "$d/nspawn.pid"
		echo "nodes.sh: systemd-nspawn exited with status $rc at $(date -u +%FT%TZ)"
		((stop == 0 && rc == 133)) || break # 133: the container asked for a reboot
	done
}

# inotify_check NODE: warn when the host's inotify instances are nearly used up. The nodes share the
# host's user namespace, so every node's systemd, kubelet, kube-apiserver, controller-manager and
# containerd count against root's fs.inotify.max_user_instances (128 by default; a Kubernetes control
# plane holds about 25, a worker about 15). Past it kubelet exits with "Failed to start cAdvisor"
# err="inotify_init: too many open files" and no static pod starts: a control plane then fails kubeadm
# join with "the etcd member … is not started". Labs running side by side hit it; the host's limit is
# not changed here (LAB.md: the lab never changes the host).
inotify_check() {
	local max used
	max=$(cat /proc/sys/fs/inotify/max_user_instances 2>/dev/null) || return 0
	used=$(find /proc/[0-9]*/fd -lname 'anon_inode:inotify' 2>/dev/null | wc -l)
	if ((used + 25 > max)); then
		log "WARNING: $1: the host's inotify instances are nearly used up ($used in use of fs.inotify.max_user_instances=$max; a control plane needs about 25): kubelet on it may fail with 'inotify_init: too many open files'. Other labs running now hold them: run labs one at a time."
	fi
}

ct_up() {
	local node=$1 d
	d=$(nodedir "$node")
	if alive "$d/supervisor.pid" "_run $node"; then
		return 0
	fi
	ct_plain_net "$node"
	inotify_check "$node"
	ensure_nspawn_run
	ct_prepare "$node"
	echo nspawn >"$d/kind"
	: >"$d/console.log"
	LAB_PREFIX=$P LAB_DIR=$LABDIR setsid "$HERE/nodes.sh" _run "$node" >>"$d/console.log" 2>&1 </dev/null 8>&- &
	echo $! >"$d/supervisor.pid"
	date +%s%N >"$d/started"
}

# ssh_node NODE CMD...: CMD as root on the node, from P-boot (or from the namespace of the node
# $LAB_SSH_FROM, when P-boot holds no address: the ISO journey's VM owns them), with the lab key and the
# pinned host key.
ssh_node() {
	local node=$1
	shift
	ip netns exec "$(ns_of "${LAB_SSH_FROM:-boot}")" ssh -o BatchMode=yes -o StrictHostKeyChecking=yes \
		-o UserKnownHostsFile="$SSH_DIR/known_hosts" -o GlobalKnownHostsFile=/dev/null \
		-o ConnectTimeout=3 -o LogLevel=ERROR -i "$SSH_DIR/id_ed25519" "root@$(node_ip "$node")" "$@"
}

# ct_wait_ready NODE: returns once sshd on the node runs commands with the lab key and the pinned host key.
ct_wait_ready() {
	local node=$1 d state deadline=$((SECONDS + READY_TIMEOUT))
	d=$(nodedir "$node")
	while ((SECONDS < deadline)); do
		running "$(<"$d/supervisor.pid")" || die "$node: systemd-nspawn exited; see $d/console.log"
		state=$(ssh_node "$node" systemctl is-system-running 2>/dev/null || true)
		case $state in
		running | degraded)
			local ms=$((($(date +%s%N) - $(<"$d/started")) / 1000000))
			log "$node ready ($state) $((ms / 1000)).$(printf %03d $((ms % 1000)))s after start"
			return 0
			;;
		esac
		sleep 0.2
	done
	die "$node: no SSH answer within ${READY_TIMEOUT}s (last state '${state:-none}'); see $d/console.log"
}

ct_down() {
	local node=$1 d spid npid
	d=$(nodedir "$node")
	if alive "$d/supervisor.pid" "_run $node"; then
		spid=$(pid_of "$d/supervisor.pid")
		# SIGTERM to systemd-nspawn asks the container to power off; the supervisor then exits.
		kill -TERM "$spid" 2>/dev/null || true
		if ! wait_gone "$spid" "$STOP_TIMEOUT"; then
			log "$node: still running ${STOP_TIMEOUT}s after SIGTERM: SIGKILL"
			alive "$d/nspawn.pid" systemd-nspawn && npid=$(pid_of "$d/nspawn.pid") && kill_tree "$npid"
			kill -KILL "$spid" 2>/dev/null || true
			wait_gone "$spid" 5 || log "$node: supervisor $spid survived SIGKILL"
			# A killed systemd-nspawn leaves its per-machine directories behind (named after the machine).
			rm -rf "${NSPAWN_RUN:?}/propagate/$P-$node" "${NSPAWN_RUN:?}/unix-export/$P-$node"
		fi
	fi
	rm -f "$d/supervisor.pid" "$d/nspawn.pid"
	if ct_mounted "$node"; then
		umount "$d/root" || die "$node: cannot unmount $d/root (still busy?)"
	fi
	ct_remove_cgroups "$node"
}

# kill_tree PID: SIGKILL PID and its descendants (the container's processes are nspawn's descendants).
kill_tree() {
	local child
	for child in $(cat /proc/"$1"/task/*/children 2>/dev/null); do kill_tree "$child"; done
	kill -KILL "$1" 2>/dev/null || true
}

ct_reboot() {
	local node=$1 d npid init
	d=$(nodedir "$node")
	alive "$d/nspawn.pid" systemd-nspawn || die "$node is not running"
	npid=$(pid_of "$d/nspawn.pid")
	init=$(cat "/proc/$npid/task/$npid/children" 2>/dev/null | awk '{print $1}')
	[[ -n $init ]] || die "$node: container init not found"
	date +%s%N >"$d/started"
	# SIGRTMIN+5 to systemd (PID 1 of the container) starts reboot.target, like `systemctl reboot`.
	kill -s RTMIN+5 "$init"
	wait_gone "$init" "$STOP_TIMEOUT" || die "$node: did not go down within ${STOP_TIMEOUT}s"
	ct_wait_ready "$node"
}

ct_status() {
	local node=$1 d
	d=$(nodedir "$node")
	if alive "$d/supervisor.pid" "_run $node"; then
		echo "$node: running (nspawn pid $(cat "$d/nspawn.pid" 2>/dev/null || echo -), ssh root@$(node_ip "$node"))"
	else
		echo "$node: stopped$(ct_mounted "$node" && echo ' (overlay still mounted)')"
	fi
}

# ---------------------------------------------------------------------------------------------------
# BMC-managed nodes (ipmi_sim + QEMU)

bmc_ns() { echo "$P-bmc$(node_index "$1")"; }
bmc_ip() { echo "10.100.0.$((120 + $(node_index "$1")))"; }

bmc_net() {
	local node=$1 ns wns i
	ns=$(bmc_ns "$node")
	wns=$(ns_of "$node")
	i=$(node_index "$node")
	[[ -e /run/netns/$ns ]] || ip netns add "$ns"
	ip -n "$ns" link set lo up
	if ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
		ip -n "$P-fabric" link del "bmc$i-c" 2>/dev/null || true
		ip link add eth0 netns "$ns" type veth peer name "bmc$i-c" netns "$P-fabric"
	fi
	ip -n "$P-fabric" link set "bmc$i-c" master br-cp up
	ip -n "$ns" addr replace "$(bmc_ip "$node")/24" dev eth0
	ip -n "$ns" link set eth0 up
	# The VM owns the node's addresses: its namespace becomes two bridges (eth0+tap0, eth1+tap1).
	local n
	for n in 0 1; do
		ip -n "$wns" link show "br$n" >/dev/null 2>&1 || ip -n "$wns" link add "br$n" type bridge stp_state 0 forward_delay 0
		ip -n "$wns" link show "tap$n" >/dev/null 2>&1 || ip -n "$wns" tuntap add dev "tap$n" mode tap
		ip -n "$wns" addr flush dev "eth$n"
		ip -n "$wns" link set "eth$n" master "br$n" up
		ip -n "$wns" link set "tap$n" master "br$n" up
		ip -n "$wns" link set "br$n" up
	done
}

bmc_up() {
	local node=$1 d i pw
	d=$(nodedir "$node")
	i=$(node_index "$node")
	mkdir -p "$d/ipmi-state"
	bmc_net "$node"
	bmc_serving "$node" && return 0
	# Whatever is left of an earlier BMC (one being killed, or one whose PID file was lost) goes first:
	# it would serve the port beside the new one.
	bmc_stop "$node"
	pw=$(<"$LABDIR/bmc/$node.password")
	[[ ${#pw} -le 20 && $pw =~ ^[A-Za-z0-9+/=._-]+$ ]] || die "$LABDIR/bmc/$node.password: want 1-20 characters of [A-Za-z0-9+/=._-]"
	# What chassis.sh needs to start the VM (no secrets).
	cat >"$d/chassis.env" <<-ENV
		NODE=$node
		NETNS=$(ns_of "$node")
		NODE_DIR=$d
		KIT_SCRIPT=$REPO/test/fixtures/build-vmkit.sh
		APPLIANCE_CACHE=${APPLIANCE_CACHE:-/var/cache/appliance}
		HOSTAGENT=${LAB_HOSTAGENT:-$REPO/bin/hostagent}
		CMDLINE_FILE=${LAB_RENDERED_DIR:-$LABDIR/state/rendered}/$node/kernel-cmdline
		NET_ARGS="ip=10.100.0.$((20 + i))::10.100.0.2:255.255.255.0:$node:eth0:off ip=10.200.0.$((20 + i))::10.200.0.2:255.255.255.0:$node:eth1:off"
		MAC_PREFIX=52:54:00:$(printf %02x "$i")
		MEMORY_MB=${LAB_VM_MEMORY_MB:-1024}
		VM_BOOT=${LAB_VM_BOOT:-kit}
		VM_DISK_SERIAL=LAB-DISK-$node
		VM_DECOY_GB=${LAB_VM_DECOY_GB:-}
	ENV
	(
		umask 077
		cat >"$d/lan.conf" <<-CONF
			# Written by test/lab/nodes.sh: the BMC of lab node $node.
			name "$P-$node"
			set_working_mc 0x20
			  startlan 1
			    addr $(bmc_ip "$node") 623
			    priv_limit admin
			    allowed_auths_callback md5
			    allowed_auths_user md5
			    allowed_auths_operator md5
			    allowed_auths_admin md5
			    guid a1b2c3d4e5f60718293a4b5c6d7e8f$(printf %02x "$i")
			  endlan
			  chassis_control "$HERE/vm/chassis.sh $d"
			  user 1 false "" "" user 1 md5
			  user 2 true "admin" "$pw" admin 10 md5
		CONF
	)
	cat >"$d/bmc.emu" <<-EMU
		mc_setbmc 0x20
		mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr
		mc_enable 0x20
	EMU
	: >"$d/ipmi_sim.log"
	local pid owner rc deadline=$((SECONDS + 10))
	nsenter --net="/run/netns/$(bmc_ns "$node")" -- setsid ipmi_sim -n -p -c "$d/lan.conf" -f "$d/bmc.emu" \
		-s "$d/ipmi-state" >>"$d/ipmi_sim.log" 2>&1 </dev/null 8>&- &
	pid=$!
	echo "$pid" >"$d/ipmi_sim.pid"
	# Ready once the LAN port is bound (bounded wait). $! is nsenter, which execs setsid, which execs
	# ipmi_sim; setsid(1) forks instead when it starts as a process-group leader (a shell with job
	# control), and then $! exits at once while ipmi_sim runs on: so ipmi_sim has exited only when $!
	# is gone and the BMC namespace (emptied by bmc_stop above) holds no process either.
	until owner=$(bmc_owner "$node") && [[ -n $owner ]]; do
		if ! running "$pid" && [[ -z $(bmc_pids "$node") ]]; then
			rc=0
			wait "$pid" || rc=$?
			bmc_fail "$node" "ipmi_sim exited ($(exit_reason "$rc"))"
		fi
		((SECONDS < deadline)) || bmc_fail "$node" "ipmi_sim did not bind $(bmc_ip "$node"):623 within 10 s"
		sleep 0.1
	done
	# The PID file names the process that serves the port (so that down stops that one): $! itself, or
	# the ipmi_sim a forking setsid started.
	[[ $owner =~ ^[0-9]+$ ]] || bmc_fail "$node" "more than one process bound $(bmc_ip "$node"):623 ($(echo $owner))"
	tr '\0' ' ' <"/proc/$owner/cmdline" 2>/dev/null | grep -qF -- "ipmi_sim -n -p -c $d/lan.conf " ||
		bmc_fail "$node" "$(bmc_ip "$node"):623 is bound by process $owner, not by the ipmi_sim started here ($pid)"
	echo "$owner" >"$d/ipmi_sim.pid"
	log "$node: BMC at $(bmc_ip "$node") (ipmi_sim pid $owner); the VM is off"
}

# bmc_pids NODE: the processes in the node's BMC namespace: its ipmi_sim and the chassis.sh that one
# runs (nodes.sh made the namespace, so whatever runs there is the lab's).
bmc_pids() {
	[[ -e /run/netns/$(bmc_ns "$1") ]] || return 0
	ip netns pids "$(bmc_ns "$1")" 2>/dev/null || true
}

# bmc_owner NODE: the PIDs of the processes bound to the BMC's UDP port 623, one a line (ss -p).
bmc_owner() {
	[[ -e /run/netns/$(bmc_ns "$1") ]] || return 0
	nsenter --net="/run/netns/$(bmc_ns "$1")" -- ss -Hlunp "sport = :623" | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -un
}

# bmc_serving NODE: the ipmi_sim that ipmi_sim.pid names runs and is the one process bound to the
# BMC's port (not one being killed, nor one beside an untracked ipmi_sim).
bmc_serving() {
	local d
	d=$(nodedir "$1")
	alive "$d/ipmi_sim.pid" ipmi_sim && [[ $(bmc_owner "$1") == "$(<"$d/ipmi_sim.pid")" ]]
}

# bmc_stop NODE: stop the node's ipmi_sim — the one ipmi_sim.pid names and any other process in its
# namespace — and wait until each is gone, so the port is free and the namespace empty before it is
# deleted or a new ipmi_sim starts. An ipmi_sim left running is not refused by the next one's bind:
# Debian's ipmi_sim binds its LAN port with SO_REUSEADDR, so both would serve 10.100.0.(120+I):623.
bmc_stop() {
	local node=$1 d pids pid
	d=$(nodedir "$node")
	pids=$({ if alive "$d/ipmi_sim.pid" ipmi_sim; then pid_of "$d/ipmi_sim.pid"; fi; bmc_pids "$node"; } | sort -un)
	if [[ -n $pids ]]; then
		kill -TERM $pids 2>/dev/null || true
		for pid in $pids; do
			wait_gone "$pid" 5 || { kill -KILL "$pid" 2>/dev/null || true; wait_gone "$pid" 5 || log "$node: process $pid survived SIGKILL"; }
		done
	fi
	rm -f "$d/ipmi_sim.pid"
}

# bmc_fail NODE MESSAGE: stop with MESSAGE, ipmi_sim's log (with -n it writes only its startup errors
# there; later ones go to syslog, which the lab has not) and what holds the BMC's namespace and port.
# The caller's output is what a test shows when up fails: the log file itself is purged with the lab.
bmc_fail() {
	local node=$1 d tail pids owner
	d=$(nodedir "$node")
	tail=$(tail -n 20 "$d/ipmi_sim.log" 2>/dev/null | sed 's/^/    /')
	pids=$(echo $(bmc_pids "$node"))
	owner=$(echo $(bmc_owner "$node"))
	die "$node: $2; ipmi_sim.log's last lines (${d}/ipmi_sim.log):
${tail:-    (empty)}
  processes in $(bmc_ns "$node"): ${pids:-none}; bound to $(bmc_ip "$node"):623: ${owner:-none}"
}

# exit_reason STATUS: a wait status for people: "status 1" or "killed by SIGKILL".
exit_reason() {
	if (($1 > 128)); then echo "killed by SIG$(kill -l $(($1 - 128)))"; else echo "status $1"; fi
}

bmc_down() {
	local node=$1 d
	d=$(nodedir "$node")
	if [[ -f $d/chassis.env ]]; then
		"$HERE/vm/chassis.sh" "$d" set power 0 || log "$node: chassis power off failed"
	fi
	bmc_stop "$node"
	[[ -e /run/netns/$(bmc_ns "$node") ]] && ip netns del "$(bmc_ns "$node")"
	ip -n "$P-fabric" link del "bmc$(node_index "$node")-c" 2>/dev/null || true
	return 0
}

bmc_status() {
	local node=$1 d power
	d=$(nodedir "$node")
	if alive "$d/ipmi_sim.pid" ipmi_sim; then
		power=$("$HERE/vm/chassis.sh" "$d" get power 2>/dev/null || echo power:?)
		echo "$node: BMC $(bmc_ip "$node") up (ipmi_sim pid $(<"$d/ipmi_sim.pid")), VM ${power/power:1/on}" | sed 's/VM power:0/VM off/'
	else
		echo "$node: BMC down"
	fi
}

# ---------------------------------------------------------------------------------------------------

nodes_or_all() {
	if (($#)); then printf '%s\n' "$@"; else all_nodes; fi
}
dir_nodes() { ls "$LABDIR/nodes" 2>/dev/null | grep -E '^(cp[1-9]|w[1-9][0-9]?)$' | sort -V || true; }

# owner_ok: LAB_DIR/nodes belongs to this lab prefix (recorded in LAB_DIR/nodes/.prefix; a directory
# without the record, or whose nodes all stopped, is claimed by `up`). Two labs sharing one LAB_DIR
# would share node directories: `up` refuses, `down` and `status` leave the other lab's nodes alone.
owner() { cat "$LABDIR/nodes/.prefix" 2>/dev/null || echo "$P"; }
claim_labdir() {
	local o node
	o=$(owner)
	if [[ $o != "$P" ]]; then
		for node in $(dir_nodes); do
			active "$node" && die "$LABDIR holds running nodes of lab '$o' ($node): use another LAB_DIR (default for prefix $P: /var/lib/appliance-lab-$P) or stop them (LAB_PREFIX=$o nodes.sh down)"
		done
		log "$LABDIR/nodes: taking over from lab '$o' (none of its nodes runs)"
	fi
	mkdir -p "$LABDIR/nodes"
	echo "$P" >"$LABDIR/nodes/.prefix"
}

up() {
	local node cts=() nw
	[[ -e /run/netns/$P-boot && -e /run/netns/$P-fabric ]] || die "lab $P not up: run test/lab/lab.sh up first (LAB_PREFIX=$P)"
	mkdir -p "$LABDIR"
	exec 8>"$LABDIR/nodes.lock"
	flock 8
	claim_labdir
	# BMC passwords for every worker namespace (at least w1, as before); host key pins for nspawn workers.
	nw=$(all_nodes | grep -c '^w' || true)
	LAB_DIR=$LABDIR LAB_WORKERS=${LAB_WORKERS:-$((nw > 1 ? nw : 1))} LAB_WORKER_KIND=$WORKER_KIND "$HERE/creds.sh"
	for node in $(nodes_or_all "$@"); do
		check_node "$node"
		mkdir -p "$(nodedir "$node")"
		local kind
		kind=$(kind_of "$node")
		if [[ $node == w* && $kind != "$WORKER_KIND" ]]; then
			active "$node" && die "$node runs as a $kind node: stop it first (LAB_PREFIX=$P nodes.sh down $node), then start it with LAB_WORKER_KIND=$WORKER_KIND"
			rm -f "$(nodedir "$node")/kind" "$(nodedir "$node")/chassis.env"
			kind=$WORKER_KIND
		fi
		case $kind in
		nspawn) ct_up "$node" && cts+=("$node") ;;
		vm) echo vm >"$(nodedir "$node")/kind"; bmc_up "$node" ;;
		esac
	done
	for node in "${cts[@]}"; do ct_wait_ready "$node"; done
}

down() {
	local node
	[[ -d $LABDIR/nodes ]] || { release_nspawn_run; return 0; }
	if [[ $(owner) != "$P" ]]; then
		log "$LABDIR/nodes belongs to lab '$(owner)', not '$P': nothing of lab $P to stop there"
		release_nspawn_run
		return 0
	fi
	mkdir -p "$LABDIR"
	exec 8>"$LABDIR/nodes.lock"
	flock 8
	local list
	if (($#)); then list=("$@"); else mapfile -t list < <(dir_nodes); fi
	# Ask every container to power off first, so they shut down in parallel; ct_down then waits.
	for node in "${list[@]}"; do
		[[ $(kind_of "$node") == nspawn ]] && alive "$(nodedir "$node")/supervisor.pid" "_run $node" &&
			kill -TERM "$(pid_of "$(nodedir "$node")/supervisor.pid")" 2>/dev/null
	done
	local nspawn=$((!$#))
	for node in "${list[@]}"; do
		[[ $node =~ ^(cp[1-9]|w[1-9][0-9]?)$ ]] || die "unknown node '$node'"
		case $(kind_of "$node") in
		nspawn) ct_down "$node"; nspawn=1 ;;
		vm) bmc_down "$node" ;;
		esac
		echo "stopped $node"
	done
	# The host's nspawn tmpfs is shared by every lab: `down` of VM nodes only leaves it alone.
	((nspawn)) && release_nspawn_run
	return 0
}

status() {
	local node any=0
	[[ -d $LABDIR/nodes ]] || { echo "no lab nodes under $LABDIR/nodes"; return 0; }
	[[ $(owner) == "$P" ]] || { echo "no nodes of lab '$P' under $LABDIR/nodes (it holds lab '$(owner)')"; return 0; }
	for node in $(dir_nodes); do
		any=1
		case $(kind_of "$node") in nspawn) ct_status "$node" ;; vm) bmc_status "$node" ;; esac
	done
	((any)) || echo "no lab nodes under $LABDIR/nodes"
}

# need_nspawn VERB NODE: VERB works on pre-installed (nspawn) nodes only.
need_nspawn() {
	[[ $2 =~ ^(cp[1-9]|w[1-9][0-9]?)$ ]] || die "$1: unknown node '$2' (want cp1..cp9 or w1..w79)"
	[[ $(kind_of "$2") == nspawn ]] || die "$1: $2 is not a pre-installed node (a VM worker: use its BMC)"
}

case ${1:-} in
up) shift; up "$@" ;;
down) shift; down "$@" ;;
status) status ;;
reboot) (($# == 2)) || die "usage: nodes.sh reboot NODE"; need_nspawn reboot "$2"; ct_reboot "$2" ;;
ssh) (($# >= 3)) || die "usage: nodes.sh ssh NODE CMD..."; node=$2; shift 2; need_nspawn ssh "$node"; ssh_node "$node" "$@" ;;
_run) ct_run "$2" ;;
*) echo "usage: nodes.sh up [NODE...] | down [NODE...] | status | reboot NODE | ssh NODE CMD...   (LAB_PREFIX=$P LAB_DIR=$LABDIR LAB_WORKER_KIND=$WORKER_KIND)" >&2; exit 2 ;;
esac
