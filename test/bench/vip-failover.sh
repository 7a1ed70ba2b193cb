#!/usr/bin/env bash
# VIP failover after SIGKILL of the holder: keepalived 2.2.7, three unicast speakers in lab network
# namespaces (pkg/keepalived BenchmarkFailover). Prints min/median/max seconds and the number of 50 ms
# samples that saw two holders, for VRRPv2 (PASS auth, advert_int 1 s) and VRRPv3 (500 ms, 250 ms).
# Target: failover <= 4 s, 0 double-holder samples. Needs root, keepalived, iproute2.
# Usage: test/bench/vip-failover.sh [ITERATIONS]   (default 5)
set -euo pipefail
cd "$(dirname "$0")/../.."
n="${1:-5}"
go test -run '^$' -bench 'BenchmarkFailover' -benchtime "${n}x" -v ./pkg/keepalived/ 2>&1 |
	grep -E '^(Benchmark|goos|cpu|ok|FAIL|PASS)|failover after SIGKILL' || true
