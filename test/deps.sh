#!/usr/bin/env bash
# deps.sh PACKAGE... — install the Debian packages the tests and the lab drive as real peers (`make deps`).
# Nothing happens when all are installed. apt's transcript is kept in a log and shown only with V=1 or
# on failure, with apt's own error lines and the command that repairs a half-configured dpkg.
set -uo pipefail
missing=()
for p in "$@"; do
	dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q '^install ok installed' || missing+=("$p")
done
((${#missing[@]})) || { echo "deps: all ${#} Debian packages installed"; exit 0; }
[[ $(id -u) == 0 ]] || { echo "deps: missing ${missing[*]}; installing them needs root: run sudo make deps" >&2; exit 1; }
echo "deps: installing ${#missing[@]} Debian packages: ${missing[*]}"
log=$(mktemp /tmp/appliance-deps.XXXXXX.log)
export DEBIAN_FRONTEND=noninteractive
run() {
	if [[ ${V:-0} == 1 ]]; then "$@" 2>&1 | tee -a "$log"; return "${PIPESTATUS[0]}"; fi
	"$@" >>"$log" 2>&1
}
fail() {
	echo "deps: $1 failed. apt said:" >&2
	grep -E '^(E|W): |^dpkg: |error|Error|[Ff]ailed' "$log" | grep -v '^Get:' | tail -n 20 | sed 's/^/    /' >&2
	echo "deps: full transcript: $log" >&2
	echo "deps: to repair a half-configured system run: dpkg --configure -a && apt-get -f install -y; then make deps again" >&2
	exit 1
}
run apt-get update -q || fail "apt-get update"
run apt-get install -y -q --no-install-recommends "${missing[@]}" || fail "apt-get install ${missing[*]}"
rm -f "$log"
echo "deps: installed"
