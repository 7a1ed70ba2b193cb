#!/usr/bin/env bash
# registry-blobs.sh — blob GET throughput of the registry mirror vs nginx, both over TLS on 127.0.0.1.
#
# What: for each blob size (default 4 KiB, 1 MiB, 16 MiB) run `wrk -t2 -c50 -d${DURATION}s` against
#   1. nginx (TLS, 2 workers, sendfile, open_file_cache) serving the layout's blob files from disk,
#   2. registry.NewHandler with the blob fast path (test/bench/registryserver -fast=true),
#   3. registry.NewHandler with distribution's own blob handler (-fast=false),
# ROUNDS times, interleaved, keeping each server's best round (the machine may be shared), and print
# requests/s, MB/s and the MB/s ratio to nginx (wrk counts bytes of unfinished large responses too).
# All three use the same ECDSA P-256 certificate type, TLS 1.3 with TLS_AES_128_GCM_SHA256 (Go's choice on AES-NI hardware; nginx is pinned to it),
# keep-alive connections, warm page cache. Only 127.0.0.1; every run is bounded by DURATION; servers
# are stopped by PID.
#
# Usage: test/bench/registry-blobs.sh            (DURATION=10 SIZES_MIB=0.004,1,16 to change)
#        LAYOUT=DIR REGISTRY_URL=https://HOST:PORT test/bench/registry-blobs.sh  measures a running
#        `appliance serve` instead of the harness; DIR is a layout made beforehand with
#        `go run ./test/bench/registrylayout -out DIR -blob-mib 0.004,1,16` and imported into it.
# Needs: Go, nginx, wrk, openssl, jq, curl, bc (Debian: nginx wrk openssl jq curl bc).
set -euo pipefail
cd "$(dirname "$0")/../.."
DURATION=${DURATION:-10}
ROUNDS=${ROUNDS:-2}
SIZES_MIB=${SIZES_MIB:-0.004,1,16}
WORK=$(mktemp -d /tmp/registry-blobs.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$WORK"; }
trap cleanup EXIT

go build -o "$WORK/registryserver" ./test/bench/registryserver
go build -o "$WORK/registrylayout" ./test/bench/registrylayout
if [[ -n "${LAYOUT:-}" ]]; then
  ln -s "$(realpath "$LAYOUT")" "$WORK/layout"
else
  "$WORK/registrylayout" -out "$WORK/layout" -blob-mib "$SIZES_MIB" >/dev/null
fi
"$WORK/registryserver" -root "$WORK/root" -layout "$WORK/layout" -import-only

# nginx with TLS over the layout's blob files.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=127.0.0.1 \
  -keyout "$WORK/key.pem" -out "$WORK/cert.pem" 2>/dev/null
mkdir -p "$WORK/nginx"
cat >"$WORK/nginx/nginx.conf" <<CONF
user root;
worker_processes 2;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on; tcp_nopush on; keepalive_requests 1000000;
  open_file_cache max=1000 inactive=60s;
  default_type application/octet-stream;
  server {
    listen 127.0.0.1:18443 ssl;
    ssl_certificate $WORK/cert.pem; ssl_certificate_key $WORK/key.pem;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_conf_command Ciphersuites TLS_AES_128_GCM_SHA256;
    root $WORK/layout;
  }
}
CONF
nginx -c "$WORK/nginx/nginx.conf" -p "$WORK/nginx" -g 'daemon off;' &
PIDS+=($!)

start_go() { # $1 = fast flag, $2 = port
  "$WORK/registryserver" -root "$WORK/root" -addr "127.0.0.1:$2" -fast="$1" >"$WORK/srv-$2.log" 2>&1 &
  PIDS+=($!)
}
if [[ -z "${REGISTRY_URL:-}" ]]; then
  start_go true 18444
  start_go false 18445
fi
for port in 18443 18444 18445; do
  for _ in $(seq 50); do curl -ks -o /dev/null "https://127.0.0.1:$port/" && break; sleep 0.1; done
done

rps() { # $1 = URL → "req/s MB/s"; refuses to measure anything but full 200 responses
  local code
  code=$(curl -ks -o /dev/null -w '%{http_code}' "$1")
  [[ $code == 200 ]] || { echo "GET $1 answered $code" >&2; exit 1; }
  wrk -t2 -c50 -d"${DURATION}s" "$1" | awk '/Non-2xx/ { bad=1 } /Requests\/sec/ {r=$2} /Transfer\/sec/ {t=$2}
    END { if (bad) { print "wrk saw non-2xx responses" > "/dev/stderr"; print "0 0"; exit } u=substr(t,length(t)-1); v=substr(t,1,length(t)-2); m=(u=="GB")?v*1024:(u=="KB")?v/1024:v; printf "%s %.1f\n", r, m }'
}
if [[ -n "${REGISTRY_URL:-}" ]]; then
  targets=("appliance|$REGISTRY_URL")
else
  targets=("registry-fastpath|https://127.0.0.1:18444" "registry-distribution|https://127.0.0.1:18445")
fi
printf '%-10s %-24s %12s %10s %8s\n' bytes server req/s MB/s ratio
while read -r ref; do
  repo=${ref%:*}
  mdig=$(jq -r --arg r "$ref" '.manifests[] | select(.annotations["org.opencontainers.image.ref.name"]==$r) | .digest' "$WORK/layout/index.json")
  layer=$(jq -r '.layers[0].digest' "$WORK/layout/blobs/sha256/${mdig#sha256:}")
  size=$(stat -c %s "$WORK/layout/blobs/sha256/${layer#sha256:}")
  urls=("nginx|https://127.0.0.1:18443/blobs/sha256/${layer#sha256:}")
  for t in "${targets[@]}"; do urls+=("${t%%|*}|${t#*|}/v2/$repo/blobs/$layer"); done
  declare -A R=() M=()
  for _ in $(seq "$ROUNDS"); do # interleave: one run per server per round, keep the best
    for u in "${urls[@]}"; do
      read -r r m < <(rps "${u#*|}")
      k=${u%%|*}
      if (( $(echo "$m > ${M[$k]:-0}" | bc -l) )); then R[$k]=$r M[$k]=$m; fi
    done
  done
  for u in "${urls[@]}"; do
    k=${u%%|*}
    printf '%-10s %-24s %12s %10s %8.2f\n' "$size" "$k" "${R[$k]}" "${M[$k]}" "$(echo "${M[$k]} / ${M[nginx]}" | bc -l)"
  done
done < <(jq -r '.manifests[].annotations["org.opencontainers.image.ref.name"]' "$WORK/layout/index.json")
