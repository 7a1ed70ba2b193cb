#!/usr/bin/env bash
# `make demo`: bootstrap the appliance inside the lab's bootstrap namespace: it installs Kubernetes on
# three control planes and a worker (systemd-nspawn hosts reached over SSH) from its own package repo
# and registry and drives kubeadm to an HA cluster behind the keepalived VIP; then show the cluster
# through the VIP and use the appliance from a node the way a node does. Assumes `make build fixtures-demo
# lab-up` ran (the Makefile does that, with LAB_WORKER_KIND=nspawn).
set -euo pipefail
cd "$(dirname "$0")/../.."
PREFIX=${LAB_PREFIX:-lab}
LABDIR=/var/lib/appliance-lab
CONFIG=test/lab/bootstrap.yaml
BOOT="ip netns exec ${PREFIX}-boot"
NODE="ip netns exec ${PREFIX}-cp1"
URL=https://10.100.0.2:8443

# Lab credentials the configuration references (test/lab/creds.sh; the SSH and BMC paths use them).
export LAB_WORKER_KIND=nspawn
LAB_DIR=$LABDIR test/lab/creds.sh

if [[ -e $LABDIR/state ]]; then
	echo "== note: $LABDIR holds the lab of an earlier \`make demo\`: this run reuses it (its cluster, its nodes)."
	echo "   \`make lab-down\` removes it, and the next \`make demo\` bootstraps from scratch."
fi
echo "== lab nodes: cp1..cp3 and w1, pre-installed Debian hosts (systemd-nspawn, sshd), no route out of the lab"
LAB_DIR=$LABDIR LAB_HOSTAGENT=bin/hostagent test/lab/nodes.sh up

echo
echo "== appliance bootstrap (in namespace ${PREFIX}-boot): serve, install every node, kubeadm init/join"
start=$(date +%s)
$BOOT bin/appliance bootstrap --config "$CONFIG"
echo "racked -> Ready: $(($(date +%s) - start)) s"
echo
bin/appliance status --config "$CONFIG"
for h in boot cp1 cp2 cp3; do
	ip -n "${PREFIX}-$h" -o addr show | grep -q ' 10.100.0.100/' && echo "API VIP 10.100.0.100 is on $h"
done
KUBECTL="$BOOT ${APPLIANCE_CACHE:-/var/cache/appliance}/kubernetes-v1.37.2/bin/kubectl --kubeconfig $LABDIR/state/kubernetes/admin.conf"
echo
echo "== the cluster through the VIP (admin kubeconfig: $LABDIR/state/kubernetes/admin.conf)"
$KUBECTL get nodes -o wide
$KUBECTL get pods -n kube-system -o wide
$KUBECTL get --raw /readyz; echo

CA=$LABDIR/state/pki/ca.crt
CERTDIR=$(mktemp -d); trap 'rm -rf "$CERTDIR"' EXIT
cp "$CA" "$CERTDIR/ca.crt"

echo
echo "== from node cp1 (namespace ${PREFIX}-cp1): skopeo inspect through the registry mirror"
$NODE skopeo inspect --cert-dir "$CERTDIR" --format '{{.Name}} {{.Digest}} {{.Architecture}}' \
	docker://10.100.0.2:8443/registry.k8s.io/pause:3.10.2
echo "== from node cp1: the package index served as-is"
$NODE curl -sSf --cacert "$CA" "$URL/repo/debian/dists/stable/main/binary-amd64/Packages" | grep -E '^(Package|Version):' | paste - - | head
echo "== from node cp1: its Ignition config (spec negotiated from Accept)"
# The token goes in a header file, never on a command line (other users could read it in ps).
(umask 077; printf 'Authorization: Bearer %s\n' "$(cat "$LABDIR/state/pki/tokens/cp1")" > "$CERTDIR/auth")
$NODE curl -sSf --cacert "$CA" -H @"$CERTDIR/auth" -H 'Accept: application/vnd.coreos.ignition+json;version=3.5.0' \
	-o "$CERTDIR/cp1.ign" "$URL/ignition/cp1"
head -c 300 "$CERTDIR/cp1.ign"; echo " ..."
echo "== without the token"
$NODE curl -s -o /dev/null -w '%{http_code}\n' --cacert "$CA" "$URL/ignition/cp1"
echo
echo "== second run: nothing to do"
$BOOT bin/appliance bootstrap --config "$CONFIG"
echo
echo "The appliance keeps serving in ${PREFIX}-boot and the nodes keep running; \`make lab-down\` stops"
echo "everything and removes the lab."
