#!/usr/bin/env bash
# creds.sh — create (once) the lab's credentials under LAB_DIR; reruns keep existing files (and only
# add missing known_hosts pins). test/lab/demo.sh and test/lab/nodes.sh call it; test/lab/bootstrap.yaml
# references them. LAB_DIR defaults to /var/lib/appliance-lab for LAB_PREFIX "lab" (the default) and
# /var/lib/appliance-lab-PREFIX for any other prefix, as in nodes.sh.
#
#   ssh/id_ed25519{,.pub}    the key the appliance logs in to pre-installed nodes with (root's authorized key)
#   ssh/host_ed25519{,.pub}  the host key every pre-installed lab node presents (nodes.sh injects it)
#   ssh/known_hosts          that host key pinned for the pre-installed nodes' control-plane addresses:
#                            10.100.0.11-19 (cp1..cp9) and, when LAB_WORKER_KIND=nspawn, 10.100.0.(20+N)
#                            for wN, N = 1..LAB_WORKERS
#   bmc/wN.password          the IPMI password of user admin on wN's BMC, N = 1..LAB_WORKERS (default 1;
#                            16 characters, mode 0600)
#
# Secrets are 0600 in 0700 directories and never printed.
set -euo pipefail

P=${LAB_PREFIX:-lab}
if [[ $P == lab ]]; then LABDIR=${LAB_DIR:-/var/lib/appliance-lab}; else LABDIR=${LAB_DIR:-/var/lib/appliance-lab-$P}; fi
WORKERS=${LAB_WORKERS:-1}
die() { echo "creds.sh: $*" >&2; exit 1; }
[[ $WORKERS =~ ^[0-9]+$ ]] || die "LAB_WORKERS must be a number, got '$WORKERS'"
[[ ${LAB_WORKER_KIND:-vm} == vm || ${LAB_WORKER_KIND:-vm} == nspawn ]] || die "LAB_WORKER_KIND must be vm or nspawn, got '$LAB_WORKER_KIND'"
command -v ssh-keygen >/dev/null || die "ssh-keygen not found (Debian package openssh-client)"

install -d -m 0700 "$LABDIR/ssh" "$LABDIR/bmc"
[ -f "$LABDIR/ssh/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C appliance-lab -f "$LABDIR/ssh/id_ed25519"
[ -f "$LABDIR/ssh/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C lab-nodes -f "$LABDIR/ssh/host_ed25519"

pins=()
for ((i = 1; i <= 9; i++)); do pins+=("10.100.0.$((10 + i))"); done
if [[ ${LAB_WORKER_KIND:-vm} == nspawn ]]; then
	for ((i = 1; i <= WORKERS; i++)); do pins+=("10.100.0.$((20 + i))"); done
fi
kh=$LABDIR/ssh/known_hosts
key=$(cut -d' ' -f1,2 "$LABDIR/ssh/host_ed25519.pub")
missing=()
for ip in "${pins[@]}"; do
	grep -q "^$ip " "$kh" 2>/dev/null || missing+=("$ip")
done
if ((${#missing[@]})); then
	{
		[ ! -f "$kh" ] || cat "$kh"
		for ip in "${missing[@]}"; do printf '%s %s\n' "$ip" "$key"; done
	} >"$kh.tmp"
	mv "$kh.tmp" "$kh"
fi
# IPMI 2.0 passwords are at most 20 bytes; 12 random bytes in base64 are 16 characters.
for ((i = 1; i <= WORKERS; i++)); do
	[ -f "$LABDIR/bmc/w$i.password" ] || (umask 077; head -c 12 /dev/urandom | base64 >"$LABDIR/bmc/w$i.password")
done
