#!/usr/bin/env bash
# bundle-create.sh — the connected side's speed (issue 10): `appliance bundle create` of the e2e image
# set from a local upstream vs `skopeo copy --all` of the same set into an OCI layout, then the whole
# bundle (images + packages) cold and warm.
#
# The upstream is test/fixtures/mkupstream's, the one the fixture bundle is made from: one Debian
# docker-registry per registry host (TLS, htpasswd) serving the images of the fixture bundle
# ($APPLIANCE_CACHE/bundle/images, the e2e set: kubeadm's images for the fixture's Kubernetes version,
# pause:3.10, busybox), and a signed apt repository with our kubelet/kubeadm/kubectl next to the
# machine's Debian sources. Both methods read from the same registries over TLS on 127.0.0.1.
#
#   1. images, cold: `bundle create --images-only` into an empty directory vs `skopeo copy --all
#      docker://… oci:LAYOUT:REF` once per image (skopeo copies one image per run) into an empty
#      layout. Target: ratio ≤ 0.5.
#   2. images, rerun with nothing new: `bundle create --images-only` on the finished directory vs the
#      cold skopeo time. Target: ratio ≤ 0.05.
#   3. whole bundle cold (empty output and apt state: Debian's indexes and .debs come from the
#      machine's mirror, so this one depends on the network) and warm (rerun), MB/s of the result,
#      and where the time goes (per step, from bundle create's JSON events).
# Load average before and after beside the figures. Processes are stopped by PID (mkupstream).
#
# Usage: test/bench/bundle-create.sh   (needs `make fixtures`; skopeo, docker-registry, jq, bc)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
cache=${APPLIANCE_CACHE:-/var/cache/appliance}
bundle=$cache/bundle
[[ -f $bundle/bundle.yaml ]] || { echo "bundle-create: no fixture bundle at $bundle: run make fixtures" >&2; exit 1; }
for t in skopeo docker-registry jq bc; do command -v "$t" >/dev/null || { echo "bundle-create: $t missing (make deps)" >&2; exit 1; }; done

if [[ ${1:-} != inner ]]; then
	WORK=$(mktemp -d /tmp/bundle-create-bench.XXXXXX)
	trap 'rm -rf "$WORK"' EXIT
	go build -o "$WORK/appliance" ./cmd/appliance
	go build -o "$WORK/mkupstream" ./test/fixtures/mkupstream
	mkdir -p "$WORK/debs"
	cp "$bundle"/repo/debian/pool/main/k/kube{let,adm,ctl}/*.deb "$WORK/debs/"
	version=$(awk '/^kubernetesVersion:/ {print $2}' "$bundle/bundle.yaml")
	export WORK
	"$WORK/mkupstream" -appliance "$WORK/appliance" -images "$bundle/images" -debs "$WORK/debs" \
		-kubernetes-version "$version" -extra-packages hello -bundle-key "$WORK/bundle.key" -repo-key "$WORK/repo.asc" \
		-work "$WORK/upstream" -exec "'$root/test/bench/bundle-create.sh' inner" 2>"$WORK/mkupstream.log" || { tail -20 "$WORK/mkupstream.log" >&2; exit 1; }
	exit 0
fi

# Inner: the upstream is up; $SPEC, $UPSTREAM, $APPLIANCE are set.
now() { date +%s.%N; }
load() { cut -d' ' -f1-3 /proc/loadavg; }
ratio() { echo "scale=3; $1 / $2" | bc -l; }
echo "load before: $(load) on $(nproc) cores"
mapfile -t refs < <(jq -r '.refs[]' "$UPSTREAM")

# 1. Cold images: skopeo, one run per image (what an operator scripts), into one OCI layout.
t0=$(now)
for ref in "${refs[@]}"; do
	host=${ref%%/*} path=${ref#*/}
	r=$(jq -c --arg h "$host" '.registries[$h]' "$UPSTREAM")
	skopeo copy --quiet --all --insecure-policy --src-cert-dir "$(jq -r .certDir <<<"$r")" \
		--src-creds "$(jq -r '.user + ":" + .password' <<<"$r")" \
		"docker://$(jq -r .addr <<<"$r")/$path" "oci:$WORK/skopeo:$ref"
done
skopeo_s=$(echo "$(now) - $t0" | bc -l)
mib=$(du -sm "$WORK/skopeo" | cut -f1)

t0=$(now)
"$APPLIANCE" bundle create --images-only --spec "$SPEC" --out "$WORK/images-only" >/dev/null 2>"$WORK/create1.log"
create_s=$(echo "$(now) - $t0" | bc -l)
t0=$(now)
"$APPLIANCE" bundle create --images-only --spec "$SPEC" --out "$WORK/images-only" >/dev/null 2>"$WORK/create2.log"
rerun_s=$(echo "$(now) - $t0" | bc -l)
# Both results hold the same images: skopeo reads the bundle's layout.
for ref in "${refs[@]}"; do skopeo inspect --raw "oci:$WORK/images-only/images:$ref" >/dev/null; done

printf '%-44s %8.2f s  %6.1f MB/s\n' "skopeo copy --all, ${#refs[@]} images ($mib MiB)" "$skopeo_s" "$(echo "$mib / $skopeo_s" | bc -l)"
printf '%-44s %8.2f s  %6.1f MB/s  ratio %s (target <= 0.5)\n' "bundle create --images-only, cold" "$create_s" "$(echo "$mib / $create_s" | bc -l)" "$(ratio "$create_s" "$skopeo_s")"
printf '%-44s %8.2f s  ratio %s (target <= 0.05)\n' "bundle create --images-only, rerun" "$rerun_s" "$(ratio "$rerun_s" "$skopeo_s")"

# 3. Whole bundle, cold (empty output, empty apt state) then warm, with per-step times from the events.
steps() { # JSON events on stdin with arrival times → "step: N.N s" per started/done pair
	while IFS= read -r line; do printf '%s %s\n' "$(now)" "$line"; done |
		jq -Rr 'split(" ") as $f | ($f[1:] | join(" ") | fromjson? // empty) as $e | select($e.status == "started" or $e.status == "done") | "\($f[0]) \($e.step) \($e.status)"' |
		awk '$3 == "started" {s[$2] = $1} $3 == "done" {printf "  %s %.2f s", $2, $1 - s[$2]}'
}
for run in cold warm; do
	t0=$(now)
	detail=$("$APPLIANCE" -o json bundle create --spec "$SPEC" --out "$WORK/whole" 2>"$WORK/whole-$run.log" | steps)
	s=$(echo "$(now) - $t0" | bc -l)
	wmib=$(du -sm "$WORK/whole" | cut -f1)
	printf '%-44s %8.2f s  %6.1f MB/s %s\n' "bundle create (whole, $wmib MiB), $run" "$s" "$(echo "$wmib / $s" | bc -l)" "$detail"
done
echo "load after: $(load)"
