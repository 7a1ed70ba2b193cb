#!/usr/bin/env bash
# ignition.sh — the Ignition endpoint under load: 200 concurrent keep-alive TLS clients for DURATION
# seconds against GET /ignition/cp1 of a real `appliance serve` (bootstrapped in a lab namespace, token
# and Ignition Accept header as a node sends them), and against nginx (TLS) serving the same rendered
# file as a static reference, in the same run. The appliance caps connections per source address
# (pkg/connlimit: 64), as a fleet has an address per node, so its 200 clients come from the four lab
# nodes' namespaces, `wrk -t1 -c50` in each at once (requests/s summed, the worst p50/p99 of the
# four); nginx, which has no cap, gets one `wrk -t2 -c200` from the bootstrap namespace. Prints
# requests/s, p50/p99 latency and the ratio to nginx. Targets (issue): >= 2,000 req/s and p99 < 50 ms.
# Only addresses inside the lab's own namespaces; bounded by DURATION; processes stopped by PID.
#
# Usage: test/bench/ignition.sh   (DURATION=10 to change). Needs: make build fixtures; nginx, wrk.
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${DURATION:-10}
export LAB_PREFIX=bn
BOOT="ip netns exec ${LAB_PREFIX}-boot"
WORK=$(mktemp -d /tmp/ignition-bench.XXXXXX)
STATE=$WORK/state
NGINX_PID=""
cleanup() {
	[ -n "$NGINX_PID" ] && kill "$NGINX_PID" 2>/dev/null || true
	bin/appliance stop --state-dir "$STATE" >/dev/null 2>&1 || true
	test/lab/lab.sh down >/dev/null 2>&1 || true
	rm -rf "$WORK"
}
trap cleanup EXIT

test/lab/lab.sh up >/dev/null
# bootstrap.yaml names the default lab directory whatever the prefix.
LAB_DIR=/var/lib/appliance-lab test/lab/creds.sh >/dev/null
$BOOT bin/appliance bootstrap --config test/lab/bootstrap.yaml --state-dir "$STATE" --skip-phases power,converge 2>"$WORK/bootstrap.log" ||
	{ cat "$WORK/bootstrap.log"; exit 1; }

# The token travels in a 0600 Lua file, never on a command line.
(umask 077; cat >"$WORK/node.lua" <<LUA
wrk.headers["Authorization"] = "Bearer $(cat "$STATE/pki/tokens/cp1")"
wrk.headers["Accept"] = "application/vnd.coreos.ignition+json;version=3.3.0, */*;q=0.1"
LUA
)
# nginx reference: same file, same CA-issued certificate, TLS, 2 workers.
mkdir -p "$WORK/nginx/www"
cp "$STATE/rendered/cp1/ignition/3.3.0.json" "$WORK/nginx/www/cp1"
cat >"$WORK/nginx/nginx.conf" <<CONF
user root;
worker_processes 2;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  open_file_cache max=100;
  server {
    listen 127.0.0.1:9443 ssl;
    ssl_certificate $STATE/pki/serving.crt;
    ssl_certificate_key $STATE/pki/serving.key;
    ssl_protocols TLSv1.2 TLSv1.3;
    root $WORK/nginx/www;
    location / { default_type application/json; }
  }
}
CONF
$BOOT nginx -c "$WORK/nginx/nginx.conf" -g 'daemon off;' &
NGINX_PID=$!
for _ in $(seq 50); do $BOOT curl -sk -o /dev/null https://127.0.0.1:9443/cp1 && break; sleep 0.1; done

ms() { # wrk latency (e.g. 3.21ms, 812.00us, 1.02s) -> milliseconds
	awk -v v="$1" 'BEGIN { if (v ~ /us$/) {sub(/us$/,"",v); print v/1000} else if (v ~ /ms$/) {sub(/ms$/,"",v); print v+0} else {sub(/s$/,"",v); print v*1000} }'
}
summary() { # wrk outputs... -> "rps p50 p99 non-2xx": requests/s summed, the worst p50 and p99 (as NNms)
	local f rps=0 p50=0 p99=0 bad=0 r a b n
	for f in "$@"; do
		read -r r a b n < <(awk '/Requests\/sec/ {rps=$2} /^ +50%/ {p50=$2} /^ +99%/ {p99=$2} /Non-2xx/ {bad=$NF}
			END {printf "%s %s %s %s\n", rps, p50, p99, (bad==""?0:bad)}' "$f")
		rps=$(awk -v x="$rps" -v y="$r" 'BEGIN {printf "%.2f", x+y}')
		a=$(ms "$a") b=$(ms "$b")
		p50=$(awk -v x="$p50" -v y="$a" 'BEGIN {print (y>x?y:x)}')
		p99=$(awk -v x="$p99" -v y="$b" 'BEGIN {print (y>x?y:x)}')
		bad=$((bad + n))
	done
	printf '%s %sms %sms %s\n' "$rps" "$p50" "$p99" "$bad"
}
run_appliance() { # 4 nodes x 50 clients, one source address each
	local ns pids=()
	for ns in cp1 cp2 cp3 w1; do
		ip netns exec "${LAB_PREFIX}-$ns" wrk -t1 -c50 -d"${DURATION}s" --latency -s "$WORK/node.lua" \
			https://10.100.0.2:8443/ignition/cp1 >"$WORK/appliance-$ns.out" &
		pids+=($!)
	done
	wait "${pids[@]}"
	summary "$WORK"/appliance-*.out
}
run_nginx() {
	$BOOT wrk -t2 -c200 -d"${DURATION}s" --latency -s "$WORK/node.lua" https://127.0.0.1:9443/cp1 >"$WORK/nginx.out"
	summary "$WORK/nginx.out"
}
load0=$(cut -d' ' -f1-3 /proc/loadavg)
read -r a_rps a_p50 a_p99 a_bad < <(run_appliance)
read -r n_rps n_p50 n_p99 n_bad < <(run_nginx)
echo "load average: $load0 -> $(cut -d' ' -f1-3 /proc/loadavg) (2 cores; wrk shares them)"
printf '%-22s %10s %10s %10s %8s\n' server req/s p50 p99 non-2xx
printf '%-22s %10s %10s %10s %8s\n' "appliance /ignition" "$a_rps" "$a_p50" "$a_p99" "$a_bad"
printf '%-22s %10s %10s %10s %8s\n' "nginx static (ref)" "$n_rps" "$n_p50" "$n_p99" "$n_bad"
awk -v a="$a_rps" -v n="$n_rps" -v p99="$(ms "$a_p99")" -v bad="$a_bad" 'BEGIN {
	printf "ratio appliance/nginx: %.2fx req/s\n", a/n
	printf "target >= 2000 req/s: %s (%.0f)\n", (a >= 2000 ? "met" : "MISSED"), a
	printf "target p99 < 50 ms: %s (%.1f ms)\n", (p99 < 50 ? "met" : "MISSED"), p99
	if (bad > 0) print "WARNING: non-2xx answers from the appliance"
}'
