#!/usr/bin/env bash
# VIP failover after SIGKILL of the holder: keepalived 2.2.7, three unicast speakers in lab network
# namespaces (pkg/keepalived BenchmarkFailover). Prints median/p90 failover, two-holder counts (50 ms
# samples and address events) and the load average, for the default VRRPv3 at 250 ms and VRRPv2
# (PASS auth, 1 s) in one run. Target: default median <= 1 s, 0 double-holder samples. Needs root,
# keepalived, iproute2.
# Usage: test/bench/vip-failover.sh [ITERATIONS]   (default 5)
set -euo pipefail
cd "$(dirname "$0")/../.."
n="${1:-5}"
# go test's status is the script's (pipefail); grep only filters the transcript, and finding nothing
# is not a failure of its own.
go test -run '^$' -bench 'BenchmarkFailover' -benchtime "${n}x" -v ./pkg/keepalived/ 2>&1 |
	{ grep -E '^(Benchmark|goos|cpu|ok|FAIL|PASS)|failover after SIGKILL' || true; }
