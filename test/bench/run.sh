#!/usr/bin/env bash
# `make bench`: every speed benchmark of the appliance, each printing ratios against a reference run
# in the same script (nginx for serving, skopeo copy for import and for bundle create). Bounded, 127.0.0.1 or lab
# namespaces only. Run it on a quiet machine: the figures are throughput on 2 shared cores.
# A bench that fails does not stop the others; the run then ends non-zero and names every failed one, so
# `make check-full` (which runs this) shows a bench that no longer runs to its end.
set -euo pipefail
cd "$(dirname "$0")/../.."
failed=()
bench() { # bench TITLE SCRIPT...
	local title=$1
	shift
	echo "== $title"
	"$@" || { echo "== $title: FAILED (rc $?; rerun alone: $*)"; failed+=("$1"); }
	echo
}
bench "registry: bundle on disk -> all images pullable (Import vs skopeo copy)" test/bench/registry-import.sh
bench "bundle create: images from a local upstream (vs skopeo copy --all), rerun, whole bundle cold/warm" test/bench/bundle-create.sh
bench "registry: blob GET throughput, 50 concurrent pullers over TLS (vs nginx)" test/bench/registry-blobs.sh
bench "ignition endpoint: 200 concurrent clients over TLS (vs nginx static)" test/bench/ignition.sh
bench "fleet: N simulated nodes (real agent protocol) + image pullers against one appliance, N = 100..1000" test/bench/fleet.sh
bench "soak: fleet load at N = 250 for SOAK_SECONDS (600) with serve killed -9 every 60 s" test/bench/soak.sh
bench "VIP failover after SIGKILL of the holder (keepalived, three unicast speakers)" test/bench/vip-failover.sh
if ((${#failed[@]})); then
	echo "make bench: ${#failed[@]} failed: ${failed[*]}"
	exit 1
fi
echo "make bench: every bench ran to its end"
