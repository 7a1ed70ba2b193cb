#!/usr/bin/env bash
# purge.sh DIR — remove everything one lab made, whatever state it was left in (a finished run, a killed
# test suite, a demo): `make lab-down` and every lab test suite (before it starts and when it ends) use it.
#
#   LAB_PREFIX=P (default lab) names the lab's namespaces (test/lab/lab.sh).
#   DIR is the lab's top directory; its base name must start with "appliance-lab" (a guard: nothing else
#   is ever removed). It holds the appliance's state in DIR/state and the nodes' directories in
#   DIR/lab (test suites) or DIR itself (the demo: LAB_DIR=/var/lib/appliance-lab).
#
# In order: the appliance serving from DIR/state is stopped (`appliance stop`, when APPLIANCE_BIN or
# bin/appliance exists); the lab's nodes are stopped and unmounted (test/lab/nodes.sh down); processes
# still running inside the lab's own namespaces (keepalived, a killed appliance's children, QEMU) get
# SIGTERM, then SIGKILL after 5 s — they are the lab's by construction, found by `ip netns pids` on the
# lab's exact namespace names; the namespaces are deleted (lab.sh down); whatever is still mounted below
# DIR is unmounted; DIR is removed (rm --one-file-system). Nothing outside DIR and the lab's namespaces
# is touched. Safe to run when nothing is there. Prints one line per thing removed.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
P=${LAB_PREFIX:-lab}
dir=${1:?usage: LAB_PREFIX=P purge.sh DIR}
dir=$(realpath -m "$dir")
die() { echo "purge.sh: $*" >&2; exit 1; }
[[ $(basename "$dir") == appliance-lab* ]] || die "refusing to remove $dir: its name does not start with appliance-lab"
[[ $(id -u) == 0 ]] || die "must run as root"
[[ $P =~ ^[a-z][a-z0-9]{0,5}$ ]] || die "LAB_PREFIX '$P' must be 1-6 characters of [a-z0-9] starting with a letter"

# 1. The appliance's serve daemon (it records its PID in the state directory).
app=${APPLIANCE_BIN:-$repo/bin/appliance}
if [[ -d $dir/state && -x $app ]]; then
	"$app" stop --state-dir "$dir/state" >/dev/null 2>&1 || echo "purge.sh: appliance stop --state-dir $dir/state failed (processes are killed below)" >&2
fi

# 2. Nodes: nspawn containers and VM workers with their BMCs.
for labdir in "$dir/lab" "$dir"; do
	[[ -d $labdir/nodes ]] || continue
	LAB_PREFIX=$P LAB_DIR=$labdir "$here/nodes.sh" down >/dev/null 2>&1 ||
		echo "purge.sh: nodes.sh down (LAB_DIR=$labdir) failed; continuing" >&2
done

# 3. Whatever still runs in the lab's namespaces.
owned_re="^$P-(fabric|boot|rtr|cp[1-9]|w[1-9][0-9]?|bmc[1-9][0-9]?)\$" # lab.sh OWNED_RE
mapfile -t nss < <(ip netns list | awk '{print $1}' | grep -E "$owned_re")
pids() { local ns; for ns in "${nss[@]}"; do ip netns pids "$ns" 2>/dev/null; done | sort -un; }
left=$(pids | tr '\n' ' ')
if [[ -n ${left// /} ]]; then
	echo "purge.sh: stopping processes left in lab $P's namespaces: $left"
	kill -TERM $left 2>/dev/null
	for ((i = 0; i < 50; i++)); do [[ -z $(pids) ]] && break; sleep 0.1; done
	left=$(pids | tr '\n' ' ')
	[[ -z ${left// /} ]] || { kill -KILL $left 2>/dev/null; sleep 0.5; }
fi

# 4. The namespaces.
LAB_PREFIX=$P "$here/lab.sh" down >/dev/null || echo "purge.sh: lab.sh down failed" >&2

# 5. Mounts left below DIR (a node overlay whose container was killed), deepest first, then DIR itself.
if [[ -e $dir ]]; then
	findmnt -rn -o TARGET | awk -v d="$dir/" 'index($0, d) == 1' | sort -r | while read -r m; do
		umount "$m" 2>/dev/null || umount -l "$m" || echo "purge.sh: cannot unmount $m" >&2
	done
	size=$(du -sh --one-file-system "$dir" 2>/dev/null | cut -f1)
	rm -rf --one-file-system "$dir" || die "cannot remove $dir"
	echo "purge.sh: removed $dir (${size:-?})"
fi
exit 0
