#!/usr/bin/env bash
# `make demo`: bootstrap the appliance inside the lab's bootstrap namespace, then use it from a node
# namespace the way a node does: pull an image with skopeo, fetch the package index, fetch the
# node's Ignition config. Assumes `make build fixtures lab-up` ran (the Makefile does that).
set -euo pipefail
cd "$(dirname "$0")/../.."
PREFIX=${LAB_PREFIX:-lab}
LABDIR=/var/lib/appliance-lab
CONFIG=test/lab/bootstrap.yaml
BOOT="ip netns exec ${PREFIX}-boot"
NODE="ip netns exec ${PREFIX}-cp1"
URL=https://10.100.0.2:8443

# Lab credentials the configuration references (the SSH and BMC paths use them in later milestones).
install -d -m 0700 "$LABDIR/ssh" "$LABDIR/bmc"
[ -f "$LABDIR/ssh/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C appliance-lab -f "$LABDIR/ssh/id_ed25519"
[ -f "$LABDIR/ssh/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C lab-nodes -f "$LABDIR/ssh/host_ed25519"
if [ ! -f "$LABDIR/ssh/known_hosts" ]; then
	for ip in 10.100.0.11 10.100.0.12 10.100.0.13; do
		printf '%s %s\n' "$ip" "$(cut -d' ' -f1,2 "$LABDIR/ssh/host_ed25519.pub")"
	done > "$LABDIR/ssh/known_hosts"
fi
[ -f "$LABDIR/bmc/w1.password" ] || (umask 077; head -c 12 /dev/urandom | base64 > "$LABDIR/bmc/w1.password")

echo "== appliance bootstrap (in namespace ${PREFIX}-boot)"
$BOOT bin/appliance bootstrap --config "$CONFIG"

CA=$LABDIR/state/pki/ca.crt
CERTDIR=$(mktemp -d); trap 'rm -rf "$CERTDIR"' EXIT
cp "$CA" "$CERTDIR/ca.crt"

echo
echo "== from node cp1 (namespace ${PREFIX}-cp1): skopeo inspect through the registry mirror"
$NODE skopeo inspect --cert-dir "$CERTDIR" --format '{{.Name}} {{.Digest}} {{.Architecture}}' \
	docker://10.100.0.2:8443/registry.k8s.io/pause:3.10
echo "== from node cp1: the package index served as-is"
$NODE curl -sSf --cacert "$CA" "$URL/repo/debian/dists/stable/main/binary-amd64/Packages" | grep -E '^(Package|Version):' | paste - - | head
echo "== from node cp1: its Ignition config (spec negotiated from Accept)"
TOKEN=$(cat "$LABDIR/state/pki/tokens/cp1")
$NODE curl -sSf --cacert "$CA" -H 'Accept: application/vnd.coreos.ignition+json;version=3.5.0' \
	"$URL/ignition/cp1?token=$TOKEN" | head -c 300; echo " ..."
echo "== without the token"
$NODE curl -s -o /dev/null -w '%{http_code}\n' --cacert "$CA" "$URL/ignition/cp1"
echo
echo "== second run: nothing to do"
$BOOT bin/appliance bootstrap --config "$CONFIG"
echo
echo "The appliance keeps serving in ${PREFIX}-boot; \`make lab-down\` stops it and removes the lab."
