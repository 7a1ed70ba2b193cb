#!/usr/bin/env bash
# fleet.sh — one appliance serving a simulated fleet (issue 16, "Scale and soak").
#
# For each N in NODES (default 100 250 500 1000): the lab's configuration plus N pre-installed
# workers (test/bench/fleet config), bootstrapped with --skip-phases power,converge into one state
# directory (CA, registry and bundle reused; serve restarts for the new node list; upgrade and handoff,
# which need converged nodes, skip themselves and say why, although the previous N's simulated nodes
# reported ready: nothing here can reach them over SSH), then
# test/bench/fleet run for DURATION seconds inside the bootstrap namespace: N simulated nodes
# speaking the real agent protocol through pkg/hostagent (CA against the pin, Ignition, node config,
# a report at every step start and end), each from its own control-plane address as a real fleet
# (fleet-lab.sh: an AnyIP route; the appliance caps connections per source address), plus PULLERS
# pulling the bundle's real image set. Prints
# p50/p99 per endpoint, errors (goal 0), appliance RSS (goal <= 150 MiB at N = 500), appliance CPU
# per report, each with its ratio to the first N, and the load average beside every run.
# Only lab namespaces; bounded by DURATION per N; processes stopped by PID (appliance stop).
#
# Usage: test/bench/fleet.sh   (NODES="100 250" DURATION=40 PULLERS=2 to change). Needs: make build fixtures.
set -euo pipefail
cd "$(dirname "$0")/../.."
NODES=${NODES:-100 250 500 1000}
DURATION=${DURATION:-40}
PULLERS=${PULLERS:-2}
export LAB_PREFIX=${LAB_PREFIX:-fl}
NAME=fleet-bench
. test/bench/fleet-lab.sh
for n in $NODES; do
	"$WORK/fleet" config -in test/lab/bootstrap.yaml -out "$WORK/fleet-$n.yaml" -nodes "$n" -lab-dir "$LABDIR"
	start=$(date +%s.%N)
	$BOOT bin/appliance bootstrap --config "$WORK/fleet-$n.yaml" --state-dir "$STATE" --skip-phases power,converge 2>"$WORK/bootstrap.log" ||
		{ tail -20 "$WORK/bootstrap.log"; exit 1; }
	echo "N=$n: bootstrap (render + serve restart) $(echo "$(date +%s.%N) - $start" | bc | xargs printf '%.1f') s, load average $(cut -d' ' -f1-3 /proc/loadavg)"
	sed -n 's/^\[[0-9]*\/[0-9]*\] \([a-z]*: skipped\)/  \1/p' "$WORK/bootstrap.log" # what this bench does not exercise, and why
	$BOOT "$WORK/fleet" run -state "$STATE" -duration "${DURATION}s" -pullers "$PULLERS" -out "$WORK/results.jsonl"
	echo
done
"$WORK/fleet" table "$WORK/results.jsonl"
