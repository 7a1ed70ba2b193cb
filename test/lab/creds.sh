#!/usr/bin/env bash
# creds.sh — create (once) the lab's credentials under ${LAB_DIR:-/var/lib/appliance-lab}; reruns keep
# existing files. test/lab/demo.sh and test/lab/nodes.sh call it; test/lab/bootstrap.yaml references them.
#
#   ssh/id_ed25519{,.pub}    the key the appliance logs in to pre-installed nodes with (root's authorized key)
#   ssh/host_ed25519{,.pub}  the host key every pre-installed lab node presents (nodes.sh injects it)
#   ssh/known_hosts          that host key pinned for 10.100.0.11-13 (cp1..cp3)
#   bmc/wN.password          the IPMI password of user admin on wN's BMC, N = 1..LAB_WORKERS (default 1;
#                            16 characters, mode 0600)
#
# Secrets are 0600 in 0700 directories and never printed.
set -euo pipefail

LABDIR=${LAB_DIR:-/var/lib/appliance-lab}
die() { echo "creds.sh: $*" >&2; exit 1; }
command -v ssh-keygen >/dev/null || die "ssh-keygen not found (Debian package openssh-client)"

install -d -m 0700 "$LABDIR/ssh" "$LABDIR/bmc"
[ -f "$LABDIR/ssh/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C appliance-lab -f "$LABDIR/ssh/id_ed25519"
[ -f "$LABDIR/ssh/host_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -C lab-nodes -f "$LABDIR/ssh/host_ed25519"
if [ ! -f "$LABDIR/ssh/known_hosts" ]; then
	for ip in 10.100.0.11 10.100.0.12 10.100.0.13; do
		printf '%s %s\n' "$ip" "$(cut -d' ' -f1,2 "$LABDIR/ssh/host_ed25519.pub")"
	done >"$LABDIR/ssh/known_hosts.tmp"
	mv "$LABDIR/ssh/known_hosts.tmp" "$LABDIR/ssh/known_hosts"
fi
# IPMI 2.0 passwords are at most 20 bytes; 12 random bytes in base64 are 16 characters.
for ((i = 1; i <= ${LAB_WORKERS:-1}; i++)); do
	[ -f "$LABDIR/bmc/w$i.password" ] || (umask 077; head -c 12 /dev/urandom | base64 >"$LABDIR/bmc/w$i.password")
done
