# fleet-lab.sh — sourced by fleet.sh and soak.sh: the lab (LAB_PREFIX), a work directory with the
# appliance's state, the fleet program built into it, and a cleanup that stops the appliance
# (`appliance stop`: serve and its keepalived), takes the lab down and removes the work directory.
# Sets LABDIR, BOOT, WORK, STATE. Needs NAME (the work directory's prefix) set by the caller.
LABDIR=/var/lib/appliance-lab-$LAB_PREFIX
BOOT="ip netns exec ${LAB_PREFIX}-boot"
WORK=$(mktemp -d "/tmp/$NAME.XXXXXX")
STATE=$WORK/state
cleanup() {
	bin/appliance stop --state-dir "$STATE" >/dev/null 2>&1 || true
	test/lab/lab.sh down >/dev/null 2>&1 || true
	rm -rf "$WORK"
}
trap cleanup EXIT

go build -o "$WORK/fleet" ./test/bench/fleet
test/lab/lab.sh up >/dev/null
# The simulated nodes' control-plane addresses (test/bench/fleet: simAddrs) are local in the bootstrap
# namespace (AnyIP: a local route, no address per node), so that each node connects from its own
# address, as a real fleet does: the appliance caps connections per source address (pkg/connlimit).
$BOOT ip route add local 10.110.0.0/16 dev lo
test/lab/creds.sh >/dev/null
