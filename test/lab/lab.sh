#!/usr/bin/env bash
# lab.sh — the namespace lab: an air-gapped two-plane L2 fabric on one machine.
#
#   lab.sh up [CONTROL_PLANES [WORKERS]]   create (or complete) the lab; default 3 control planes, 1 worker
#   lab.sh down                            delete every namespace of this lab (by its own names only)
#   lab.sh status                          print the lab's namespaces and their addresses
#
# Topology (P = ${LAB_PREFIX:-lab}, at most 6 characters of [a-z0-9], starting with a letter):
#   P-fabric   bridges br-cp (control plane 10.100.0.0/24) and br-wl (workload plane 10.200.0.0/24);
#              no addresses: pure L2
#   P-boot     bootstrap host: eth0 10.100.0.2/24 (br-cp), eth1 10.200.0.2/24 (br-wl)
#   P-cpI      control-plane node I (1..9): eth0 10.100.0.(10+I), eth1 10.200.0.(10+I)
#   P-wI       worker I (1..79): eth0 10.100.0.(20+I), eth1 10.200.0.(20+I)
#
# LAB_WL_SUBNETS=2 splits the workload plane in two subnets joined by a router (issue 13's two-subnet
# lab; the default, 1, is the single segment above):
#   P-fabric   also bridge br-wl2 (workload plane, second subnet 10.201.0.0/24)
#   P-rtr      the router: eth0 10.200.0.1/24 (br-wl), eth1 10.201.0.1/24 (br-wl2), IPv4 forwarding on
#   P-wI       eth1 10.201.0.(20+I) on br-wl2 instead, with a route to 10.200.0.0/24 via 10.201.0.1
#   P-boot, P-cpI  a route to 10.201.0.0/24 via 10.200.0.1
# The control-plane network stays one segment (the appliance reaches every node on it); workload-plane
# traffic between a control plane and a worker crosses the router, as between racks.
#
# LAB_WORKER_KIND (vm, the default, or nspawn) is the kind of host test/lab/nodes.sh makes of P-wI. A
# VM worker's namespace is turned into two bridges by nodes.sh (the VM owns the addresses) and lab.sh
# leaves it so; with LAB_WORKER_KIND=nspawn, `up` turns such a namespace back into a plain one that
# holds the worker's addresses itself, as nspawn nodes need.
#
# Safety (LAB.md): nothing is created in the root network namespace. Each veth pair is created with both
# ends directly inside lab namespaces; no namespace gets a default route (air gap); loopback is up
# everywhere. `down` deletes only namespaces whose names match this lab's exact pattern. Processes
# still running inside a namespace are reported, never killed.
set -euo pipefail

P=${LAB_PREFIX:-lab}
[[ $P =~ ^[a-z][a-z0-9]{0,5}$ ]] || { echo "lab.sh: LAB_PREFIX '$P' must be 1-6 characters of [a-z0-9] starting with a letter" >&2; exit 2; }
WORKER_KIND=${LAB_WORKER_KIND:-vm}
[[ $WORKER_KIND == vm || $WORKER_KIND == nspawn ]] || { echo "lab.sh: LAB_WORKER_KIND '$WORKER_KIND' must be vm or nspawn" >&2; exit 2; }
WL_SUBNETS=${LAB_WL_SUBNETS:-1}
[[ $WL_SUBNETS == 1 || $WL_SUBNETS == 2 ]] || { echo "lab.sh: LAB_WL_SUBNETS '$WL_SUBNETS' must be 1 or 2" >&2; exit 2; }
FABRIC=$P-fabric
BOOT=$P-boot
ROUTER=$P-rtr
CP_NET=10.100.0
WL_NET=10.200.0
WL2_NET=10.201.0
# Exact names this lab owns; `down` never touches anything else.
OWNED_RE="^$P-(fabric|boot|rtr|cp[1-9]|w[1-9][0-9]?|bmc[1-9][0-9]?)\$" # bmcI: made by nodes.sh

die() { echo "lab.sh: $*" >&2; exit 1; }
[[ $(id -u) == 0 ]] || die "must run as root (it creates network namespaces)"
command -v ip >/dev/null || die "ip not found (Debian package iproute2)"

ns_exists() { [[ -e /run/netns/$1 ]]; }
ns_add() {
	ns_exists "$1" && return 0
	ip netns add "$1"
}
# nsip NS CMD...: run an ip(8) command inside NS.
nsip() { local ns=$1; shift; ip -n "$ns" "$@"; }

# port NODE IFNAME BRIDGE FABRIC_PORT ADDR: connect NODE's IFNAME to BRIDGE in the fabric with ADDR.
port() {
	local node=$1 ifname=$2 bridge=$3 fport=$4 addr=$5
	if ! nsip "$node" link show "$ifname" >/dev/null 2>&1; then
		# Remove a stale fabric end whose peer vanished, then create both ends inside namespaces.
		nsip "$FABRIC" link del "$fport" 2>/dev/null || true
		ip link add "$ifname" netns "$node" type veth peer name "$fport" netns "$FABRIC"
	fi
	nsip "$FABRIC" link set "$fport" master "$bridge"
	nsip "$FABRIC" link set "$fport" up
	# nodes.sh bridges a VM node's interfaces to its VM (which owns the address): leave those alone.
	if ! nsip "$node" link show "$ifname" | grep -q ' master '; then
		nsip "$node" addr replace "$addr" dev "$ifname"
		# An earlier `up` of the other workload-plane layout (LAB_WL_SUBNETS) left the other subnet's
		# address here: only ADDR stays.
		local a
		for a in $(nsip "$node" -4 -o addr show dev "$ifname" scope global | awk '{print $4}'); do
			[[ $a == "$addr" ]] || nsip "$node" addr del "$a" dev "$ifname"
		done
	fi
	nsip "$node" link set "$ifname" up
}

# unbridge NS: undo what nodes.sh does to a VM worker's namespace (eth0/eth1 in bridges br0/br1 with
# tap0/tap1), so the namespace can hold the addresses itself. Only while no VM runs in it.
unbridge() {
	local ns=$1 n
	nsip "$ns" link show br0 >/dev/null 2>&1 || nsip "$ns" link show br1 >/dev/null 2>&1 || return 0
	local node=${ns#"$P"-}
	[[ ! -e /run/netns/$P-bmc${node#w} && -z $(ip netns pids "$ns" 2>/dev/null) ]] ||
		die "$node is a VM worker (its BMC or VM runs): stop it first (LAB_PREFIX=$P test/lab/nodes.sh down $node)"
	for n in 0 1; do
		nsip "$ns" link set "eth$n" nomaster 2>/dev/null || true
		nsip "$ns" link del "tap$n" 2>/dev/null || true
		nsip "$ns" link del "br$n" 2>/dev/null || true
	done
}

node_up() {
	local ns=$1 short=$2 host=$3
	ns_add "$ns"
	nsip "$ns" link set lo up
	[[ $short != w* || $WORKER_KIND != nspawn ]] || unbridge "$ns"
	port "$ns" eth0 br-cp "$short-c" "$CP_NET.$host/24"
	if [[ $WL_SUBNETS == 2 && $short == w* ]]; then
		port "$ns" eth1 br-wl2 "$short-w" "$WL2_NET.$host/24"
		wl_route "$ns" "$WL_NET.0/24" "$WL2_NET.1"
	else
		port "$ns" eth1 br-wl "$short-w" "$WL_NET.$host/24"
		[[ $WL_SUBNETS == 1 ]] || wl_route "$ns" "$WL2_NET.0/24" "$WL_NET.1"
	fi
	# Air gap: no default route, even if something added one.
	nsip "$ns" route del default 2>/dev/null || true
	nsip "$ns" -6 route del default 2>/dev/null || true
}

# wl_route NS PREFIX VIA: NS reaches the other workload-plane subnet through the router. Not for a VM
# worker's bridged namespace (the VM owns the addresses; its own network config routes).
wl_route() {
	nsip "$1" link show eth1 | grep -q ' master ' && return 0
	nsip "$1" route replace "$2" via "$3" dev eth1
}

# router_up: P-rtr, between br-wl and br-wl2, forwarding IPv4 (a per-namespace sysctl).
router_up() {
	ns_add "$ROUTER"
	nsip "$ROUTER" link set lo up
	port "$ROUTER" eth0 br-wl rtr-w "$WL_NET.1/24"
	port "$ROUTER" eth1 br-wl2 rtr-w2 "$WL2_NET.1/24"
	ip netns exec "$ROUTER" sh -c 'echo 1 >/proc/sys/net/ipv4/ip_forward'
}

up() {
	local cps=${1:-3} workers=${2:-1}
	[[ $cps =~ ^[1-9]$ ]] || die "CONTROL_PLANES must be 1-9, got '$cps'"
	[[ $workers =~ ^[0-9]+$ ]] && ((workers <= 79)) || die "WORKERS must be 0-79, got '$workers'"
	ns_add "$FABRIC"
	nsip "$FABRIC" link set lo up
	# The fabric is pure L2: no IPv6 link-local addresses on its bridges and ports (a per-namespace sysctl).
	ip netns exec "$FABRIC" sh -c 'for f in all default; do echo 1 >/proc/sys/net/ipv6/conf/$f/disable_ipv6; done'
	local bridges=(br-cp br-wl)
	[[ $WL_SUBNETS == 1 ]] || bridges+=(br-wl2)
	for br in "${bridges[@]}"; do
		nsip "$FABRIC" link show "$br" >/dev/null 2>&1 || nsip "$FABRIC" link add "$br" type bridge stp_state 0 forward_delay 0
		nsip "$FABRIC" link set "$br" up
	done
	[[ $WL_SUBNETS == 1 ]] || router_up
	node_up "$BOOT" boot 2
	for ((i = 1; i <= cps; i++)); do node_up "$P-cp$i" "cp$i" $((10 + i)); done
	for ((i = 1; i <= workers; i++)); do node_up "$P-w$i" "w$i" $((20 + i)); done
	status
}

owned() { ip netns list | awk '{print $1}' | grep -E "$OWNED_RE" | sort -V || true; }

down() {
	local ns pids
	# Nodes first, the fabric last (deleting the fabric would also drop the veth pairs).
	for ns in $(owned | grep -v -- "-fabric\$") $(owned | grep -- "-fabric\$"); do
		pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
		[[ -z $pids ]] || echo "lab.sh: warning: processes still in $ns (not killed): $pids" >&2
		ip netns del "$ns"
		echo "deleted $ns"
	done
}

status() {
	local ns any=0
	for ns in $(owned); do
		any=1
		echo "$ns:"
		nsip "$ns" -br addr show | awk '$1 != "lo" {print "  " $0}'
	done
	((any)) || echo "no lab namespaces with prefix '$P'"
}

case ${1:-} in
up) shift; up "$@" ;;
down) down ;;
status) status ;;
*) echo "usage: lab.sh up [CONTROL_PLANES [WORKERS]] | down | status   (LAB_PREFIX=$P LAB_WORKER_KIND=$WORKER_KIND LAB_WL_SUBNETS=$WL_SUBNETS)" >&2; exit 2 ;;
esac
