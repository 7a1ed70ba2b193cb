#!/usr/bin/env bash
# `make bench`: every speed benchmark of the appliance, each printing ratios against a reference run
# in the same script (nginx for serving, skopeo copy for import and for bundle create). Bounded, 127.0.0.1 or lab
# namespaces only. Run it on a quiet machine: the figures are throughput on 2 shared cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
echo "== registry: bundle on disk -> all images pullable (Import vs skopeo copy)"
test/bench/registry-import.sh
echo
echo "== bundle create: images from a local upstream (vs skopeo copy --all), rerun, whole bundle cold/warm"
test/bench/bundle-create.sh
echo
echo "== registry: blob GET throughput, 50 concurrent pullers over TLS (vs nginx)"
test/bench/registry-blobs.sh
echo
echo "== ignition endpoint: 200 concurrent clients over TLS (vs nginx static)"
test/bench/ignition.sh
echo
echo "== fleet: N simulated nodes (real agent protocol) + image pullers against one appliance, N = 100..1000"
test/bench/fleet.sh
echo
echo "== soak: fleet load at N = 250 for SOAK_SECONDS (600) with serve killed -9 every 60 s"
test/bench/soak.sh || true # its verdict is printed; the other benches still run
for extra in test/bench/power-fanout.sh test/bench/vip-failover.sh; do
	if [ -x "$extra" ]; then echo; echo "== $(basename "$extra" .sh)"; "$extra"; fi
done
