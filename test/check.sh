#!/usr/bin/env bash
# check.sh — `make check` (CHECK_TIER=check, the default) and `make check-full` (CHECK_TIER=full):
# every suite, arranged for a 2-core machine. (test/nodeimage and test/iso are -tags e2e suites.)
#
# The tiers (docs/development.md, "Tests"): `make check` is `make test` without -short (so with the
# tests that boot VMs or run Kubernetes components) plus one end-to-end proof of every capability; `make
# check-full` adds, as phase 3, what proves a capability a second time: the tests named in $FULL_ONLY
# (the Makefile's FULL_ONLY: a go test -run pattern without anchors; make check passes it to -skip),
# then TestMakeDepsOnBareDebian (make deps in a fresh debootstrap, reaching only the Debian mirror),
# then `make bench` (every speed benchmark, the fleet and the soak), so that none of them rots.
#
# One suite after another, most of the time one core idles (the lab tests wait on VRRP timers,
# kubelet, a booting kernel), and the TCG VMs are the only suites that keep both cores busy. So this
# runs, in phases:
#
#   1. the fixtures (make fixtures: the Kubernetes chain, Kubernetes then the bundle with its node
#      image, beside the Debian systems: rootfs, VM kit, ISO system) beside build and compile-tests
#      (every test binary, -race, and the e2e suites' binaries, so phase 2 compiles nothing). The
#      Kubernetes chain is the longest path: from cold caches Kubernetes alone took 1118 s when build
#      ran first and compile-tests beside it at the same priority. So build and compile-tests run at
#      nice 19, below the fixtures (build-kubernetes.sh compiles at nice 10), and take the CPU the
#      fixtures leave while debootstrap and mksquashfs wait on the mirror and dpkg. Measured from cold
#      caches, Kubernetes then ends 286 s sooner but phase 1 is no shorter (1732 s against 1645 s): the
#      bundle build competes with compile-tests instead. All of phase 1 is CPU;
#   2. two lanes side by side:
#        vm lane   (nice 10)  suite-nodeimage (TestBareMetalWorkerJoinsCluster: blank TCG machines
#                             to Kubernetes nodes, PXE and Redfish virtual media), suite-iso-journey
#                             (TestISOJourney: the lab bootstrapped from the ISO), suite-iso
#                             (TestISORefusals), then, not niced, suite-vrrp (pkg/keepalived,
#                             pkg/vipcheck: VRRP failover and pre-flight windows at 250 ms adverts)
#        test lane            suite-test: every other package, one at a time (-p 1: the lab tests
#                             share host-wide resources); then suite-kubernetes-fixture and suite-e2e
#                             (TestKubernetesE2E: nspawn hosts, no VM)
#      The vm lane's own processes are niced, so the test lane's timers keep their CPU; its QEMUs
#      are each the leader of a session of their own (labns.MachineSession), as this kernel shares
#      the CPU between sessions first (CFS autogroups) and nice weighs only within one: a VM in this
#      session at nice 10 got 3 % of a core. Namespaces are per test (test/labns) and lab prefixes per
#      package and per e2e (ke, kiso), so the lanes never share a name; the two Kubernetes labs (ke,
#      kiso) never run at once (test/integration lockK8sLab: together they use up root's inotify
#      instances), so the journey comes right after suite-nodeimage, done or nearly when the test
#      lane reaches the e2e. suite-vrrp ran alone in a
#      third phase while a SIGTERM handover beside the TCG lane once showed two VIP holders in one
#      50 ms sample: the sampler's reads of the nodes one after another were torn by a move, which
#      keepalived's order (priority-0 advert, then the VIP deleted at once, the backup taking over a
#      Skew_Time of >= 150 ms later) cannot produce; the sampler now confirms a double before it
#      counts (pkg/keepalived TestFailover, and the kernel-ordered address events of vipOrder).
#
# Every stage goes through test/stage.sh (timed, a row in $STAGE_TIMES). A failed stage does not stop
# the others: one run shows every failure. The run ends with the stages against the committed figures
# and the budget (test/budget.sh, test/budget.tsv; informational). Exit status: 0 when every stage
# passed, else 1.
#
# Environment: GO (default go), MAKE (default make), APPLIANCE_CACHE (the fixture cache), CHECK_TIER
# (check or full), FULL_ONLY (the second proofs' test names, an alternation).
set -uo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
MAKE=${MAKE:-make}
CHECK_TIER=${CHECK_TIER:-check}
FULL_ONLY=${FULL_ONLY:-TestNodeImageISOInstallUEFI|TestISOBoot}
case $CHECK_TIER in
check | full) ;;
*) echo "check.sh: CHECK_TIER=$CHECK_TIER: want check or full" >&2; exit 2 ;;
esac
STAGE=test/stage.sh
export PATH
failed=()

# The budget: every stage's time lands in $STAGE_TIMES (a file of this run's own when the caller gives
# none); at the end, whatever happened, test/budget.sh compares them and the total with test/budget.tsv.
check_start=$(date +%s)
if [[ -z ${STAGE_TIMES:-} ]]; then
	STAGE_TIMES=$(mktemp /tmp/appliance-check-times.XXXXXX)
	export STAGE_TIMES
fi
trap 'test/budget.sh "$STAGE_TIMES" $(($(date +%s) - check_start)) >&2' EXIT

# phase NAME START: a row for the phase that began at START (epoch seconds) in $STAGE_TIMES, compared
# with the budget like a stage; "failed" once any stage so far has failed.
phase() {
	local state=ok
	((${#failed[@]} == 0)) || state=failed
	printf '%s\t%d\t%s\n' "$1" $(($(date +%s) - $2)) "$state" >>"$STAGE_TIMES"
}

# run NAME CMD...: a stage run in the foreground; records a failure instead of stopping.
run() {
	local name=$1
	shift
	"$@" || failed+=("$name")
}

# verbose GO-TEST-ARGS...: a -tags e2e suite with -v, without the RUN/PAUSE/CONT noise; go test's status.
verbose() {
	set -o pipefail
	"$GO" test -tags e2e -count=1 -p 1 "$@" -v 2>&1 | grep -vE '^=== (RUN|PAUSE|CONT)'
}
export -f verbose
export GO

# compile_tests: every package's test binary with -race (run with -run '^$': it links and starts each),
# then the e2e suites' binaries (-tags e2e, compiled only) with the flags phase 2 runs them with.
compile_tests() {
	set -e
	"$GO" test -race -count=1 -run '^$' ./...
	# Not local: the EXIT trap runs after the function has returned (a local out was gone by then, and
	# every run left its 168 MB of test binaries in /tmp).
	out=$(mktemp -d)
	trap 'rm -rf "$out"' EXIT
	"$GO" test -tags e2e -race -c -o "$out/" ./test/nodeimage/
	"$GO" test -tags e2e -c -o "$out/" ./test/iso/ ./test/integration/ ./test/fixtures/kubernetes/
}
export -f compile_tests

run deps "$MAKE" --no-print-directory deps

# Phase 1: the fixtures beside build and compile-tests (nice 19: off the longest path).
p1=$(date +%s)
nice -n 19 "$MAKE" --no-print-directory build &
build=$!
nice -n 19 "$STAGE" compile-tests -- bash -c compile_tests &
compile=$!
run fixtures "$MAKE" --no-print-directory fixtures
wait "$build" || failed+=(build)
wait "$compile" || failed+=(compile-tests)
if ((${#failed[@]})); then
	echo "check: ${failed[*]} failed; the suites need them: stopping" >&2
	exit 1
fi
phase phase-1-fixtures "$p1"

# Phase 2: the vm lane beside the test lane. The second proofs ($FULL_ONLY) wait for phase 4.
p2=$(date +%s)
mod=github.com/airgap-appliance/appliance
vrrp=("$mod/pkg/keepalived" "$mod/pkg/vipcheck")
(
	rc=0
	nice -n 10 "$STAGE" suite-nodeimage --show -- bash -c 'verbose "$@"' verbose -race -timeout 30m -skip "^($FULL_ONLY)\$" ./test/nodeimage/ || rc=1
	nice -n 10 "$STAGE" suite-iso-journey --show -- bash -c 'verbose "$@"' verbose -timeout 40m -run 'TestISOJourney' ./test/integration/ || rc=1
	nice -n 10 "$STAGE" suite-iso --show -- bash -c 'verbose "$@"' verbose -timeout 30m -skip "^($FULL_ONLY)\$" ./test/iso/ || rc=1
	"$STAGE" suite-vrrp --show -- "$GO" test -race -count=1 -p 1 -timeout 20m "${vrrp[@]}" || rc=1
	exit $rc
) &
vmlane=$!
mapfile -t pkgs < <("$GO" list ./... | grep -vxF -e "${vrrp[0]}" -e "${vrrp[1]}")
run suite-test "$STAGE" suite-test --show -- "$GO" test -race -count=1 -p 1 -timeout 40m "${pkgs[@]}"
run suite-kubernetes-fixture "$STAGE" suite-kubernetes-fixture --show -- "$GO" test -tags e2e -count=1 -p 1 -timeout 60m ./test/fixtures/kubernetes/
run suite-e2e "$STAGE" suite-e2e --show -- bash -c 'verbose "$@"' verbose -timeout 60m -run 'TestKubernetesE2E' ./test/integration/
wait "$vmlane" || failed+=("vm lane")
phase phase-2-suites "$p2"

# Phase 3 (make check-full): the second proofs, make deps on a bare Debian 12, then every benchmark, one at a time.
if [[ $CHECK_TIER == full ]]; then
	p3=$(date +%s)
	run suite-second-proofs "$STAGE" suite-second-proofs --show -- bash -c 'verbose "$@"' verbose -timeout 40m -run "^($FULL_ONLY)\$" ./test/nodeimage/ ./test/iso/
	run suite-deps-bare-debian "$STAGE" suite-deps-bare-debian --show -- bash -c 'verbose "$@"' verbose -timeout 45m -run '^TestMakeDepsOnBareDebian$' ./test/deps/
	run bench "$STAGE" bench --show -- "$MAKE" --no-print-directory bench
	phase phase-3-full "$p3"
fi

if ((${#failed[@]})); then
	echo "check: failed: ${failed[*]}" >&2
	exit 1
fi
echo "check: every stage passed" >&2
