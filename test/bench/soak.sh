#!/usr/bin/env bash
# soak.sh — SOAK_SECONDS (default 600) of the fleet load (test/bench/fleet, N = SOAK_NODES, default
# 250) against one `appliance serve` that is killed -9 every KILL_EVERY seconds (default 60).
# Outside systemd nothing restarts serve by itself (pkg/applianced/supervise.go; the systemd unit
# has Restart=on-failure, RestartSec=2s), so the soak program is that supervisor: 2 s after each
# kill it starts serve again with the killed command line through applianced.Start, the product's
# own start path. At the end it checks: no report lost (every report carries a sequence number; the
# acknowledged ones are looked up in the node records), no state file corrupt (every .json, .jsonl,
# .yaml and PEM file of the state directory parsed), no VIP move (the VIP sampled every 50 ms on the
# bootstrap namespace's interfaces). Prints the result and the load average.
# Only lab namespaces; bounded by SOAK_SECONDS; processes stopped by PID.
#
# Usage: test/bench/soak.sh   (SOAK_SECONDS=150 for a short check). Needs: make build fixtures.
set -euo pipefail
cd "$(dirname "$0")/../.."
SOAK_SECONDS=${SOAK_SECONDS:-600}
SOAK_NODES=${SOAK_NODES:-250}
KILL_EVERY=${KILL_EVERY:-60}
PULLERS=${PULLERS:-1}
export LAB_PREFIX=${LAB_PREFIX:-sk}
NAME=soak-bench
. test/bench/fleet-lab.sh
"$WORK/fleet" config -in test/lab/bootstrap.yaml -out "$WORK/fleet.yaml" -nodes "$SOAK_NODES" -lab-dir "$LABDIR"
$BOOT bin/appliance bootstrap --config "$WORK/fleet.yaml" --state-dir "$STATE" --skip-phases power,converge 2>"$WORK/bootstrap.log" ||
	{ tail -20 "$WORK/bootstrap.log"; exit 1; }
$BOOT "$WORK/fleet" soak -state "$STATE" -duration "${SOAK_SECONDS}s" -kill-every "${KILL_EVERY}s" -pullers "$PULLERS" \
	-vip "$(awk '/vip:/ {print $2; exit}' test/lab/bootstrap.yaml)"
