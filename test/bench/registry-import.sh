#!/usr/bin/env bash
# registry-import.sh — time from "bundle on disk" to "all images pullable": registry.Import (hard links
# into distribution's storage tree, no bytes copied) vs pushing the same OCI layout with
# `skopeo copy --all oci:LAYOUT:REF docker://127.0.0.1:PORT/REPO:TAG` into Debian's docker-registry 2.8
# (plain HTTP on 127.0.0.1, which favours skopeo: no TLS cost).
#
# Layout: IMAGES single-platform images + one 2-platform index, LAYERS random gzip layers of LAYER_MIB
# each (default 6+2 manifests x 3 x 16 MiB = 384 MiB), made by test/bench/registrylayout. Warm page
# cache, layout already written back, for both. After each method the script checks pullability for real: skopeo inspects every
# image through the freshly filled registry (our handler via test/bench/registryserver over TLS, resp.
# docker-registry). Also reports a rerun of Import (nothing to do) and Import across filesystems
# (layout on /dev/shm tmpfs -> symlinks). Only 127.0.0.1; servers are stopped by PID.
#
# Usage: test/bench/registry-import.sh   (IMAGES=6 LAYERS=3 LAYER_MIB=16 to change)
# Needs: Go, skopeo, docker-registry, jq, bc (Debian: skopeo docker-registry jq bc).
set -euo pipefail
cd "$(dirname "$0")/../.."
IMAGES=${IMAGES:-6} LAYERS=${LAYERS:-3} LAYER_MIB=${LAYER_MIB:-16}
WORK=$(mktemp -d /tmp/registry-import.XXXXXX)
SHM=""
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"; [[ -n $SHM ]] && rm -rf "$SHM"; true
}
trap cleanup EXIT
now() { date +%s.%N; }

go build -o "$WORK/registryserver" ./test/bench/registryserver
go build -o "$WORK/registrylayout" ./test/bench/registrylayout
mapfile -t REFS < <("$WORK/registrylayout" -out "$WORK/layout" -images "$IMAGES" -layers "$LAYERS" -layer-mib "$LAYER_MIB")
# "Bundle on disk": the layout is written back (else Import's syncfs barrier would pay for flushing
# the freshly generated 384 MiB) and in the page cache, for both methods.
sync -f "$WORK/layout/index.json"
cat "$WORK"/layout/blobs/sha256/* >/dev/null
echo "layout: ${#REFS[@]} refs, $(du -sm "$WORK/layout" | cut -f1) MiB"

pullable() { # $1 = host:port, $2.. = skopeo flags; every ref must inspect
  local ref
  for ref in "${REFS[@]}"; do
    repo=${ref%:*}
    skopeo inspect --raw "${@:2}" "docker://$1/$(go_repo "$repo"):${ref##*:}" >/dev/null
  done
}
go_repo() { echo "$1"; } # bench refs have no ports: the mirror repository is the reference name

# 1. registry.Import
t0=$(now)
"$WORK/registryserver" -root "$WORK/root" -layout "$WORK/layout" -import-only
t1=$(now)
"$WORK/registryserver" -root "$WORK/root" -layout "$WORK/layout" -import-only | sed 's/^/rerun: /'
t2=$(now)
"$WORK/registryserver" -root "$WORK/root" -addr 127.0.0.1:18446 >"$WORK/srv.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do curl -ks -o /dev/null https://127.0.0.1:18446/v2/ && break; sleep 0.1; done
pullable 127.0.0.1:18446 --tls-verify=false
imp=$(echo "$t1 - $t0" | bc -l); rerun=$(echo "$t2 - $t1" | bc -l)

# 1b. Import with the layout on another filesystem (symlinks), as from the ISO.
SHM=$(mktemp -d /dev/shm/registry-import.XXXXXX)
cp -a "$WORK/layout" "$SHM/layout"
t0=$(now)
"$WORK/registryserver" -root "$WORK/root-xfs" -layout "$SHM/layout" -import-only
xfs=$(echo "$(now) - $t0" | bc -l)
rm -rf "$SHM"; SHM=""

# 2. skopeo copy --all into docker-registry 2.8
cat >"$WORK/dr.yml" <<CONF
version: 0.1
log: {level: error, accesslog: {disabled: true}}
storage: {filesystem: {rootdirectory: $WORK/dr}}
http: {addr: 127.0.0.1:18447}
CONF
docker-registry serve "$WORK/dr.yml" >"$WORK/dr.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:18447/v2/ && break; sleep 0.1; done
t0=$(now)
for ref in "${REFS[@]}"; do
  skopeo copy --quiet --all --insecure-policy --dest-tls-verify=false "oci:$WORK/layout:$ref" "docker://127.0.0.1:18447/$ref"
done
t1=$(now)
pullable 127.0.0.1:18447 --tls-verify=false
push=$(echo "$t1 - $t0" | bc -l)

printf '%-44s %8.3f s\n' "registry.Import (hard links)" "$imp" "registry.Import rerun (nothing to do)" "$rerun" \
  "registry.Import from /dev/shm (symlinks)" "$xfs" "skopeo copy --all -> docker-registry 2.8" "$push"
printf 'ratio Import / skopeo push: %.4f (target <= 0.1)\n' "$(echo "$imp / $push" | bc -l)"
