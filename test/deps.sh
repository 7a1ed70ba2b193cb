#!/usr/bin/env bash
# deps.sh PACKAGE... — install the Debian packages the tests and the lab drive as real peers (`make deps`).
# Nothing happens when all are installed. apt's transcript is kept in a log and shown only with V=1 or
# on failure, with apt's own error lines and the command that repairs a half-configured dpkg.
set -uo pipefail

# Go: the version go.mod's go line asks for, or newer (Debian 12's golang package is too old).
need=$(awk '$1 == "go" {print $2; exit}' "$(dirname "$0")/../go.mod")
have=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
if [[ -z $have ]]; then
	echo "deps: Go $need or newer is needed and no go is on PATH: install it from https://go.dev/dl/ into /usr/local/go and add /usr/local/go/bin to PATH" >&2
	exit 1
fi
if [[ $(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n1) != "$need" ]]; then
	echo "deps: Go $need or newer is needed (go.mod), found $have at $(command -v go): install a newer one from https://go.dev/dl/" >&2
	exit 1
fi

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
	if grep -qE '^dpkg: |dpkg was interrupted|half-configured|unmet dependencies' "$log"; then
		echo "deps: dpkg is in a broken state; repair it with: dpkg --configure -a && apt-get -f install -y; then make deps again" >&2
	elif grep -qE 'Unable to locate package|has no installation candidate' "$log"; then
		echo "deps: apt does not know a package: check that /etc/apt/sources.list names Debian 12 (bookworm) main and run apt-get update" >&2
	elif grep -qE 'Temporary failure resolving|Could not connect|Failed to fetch' "$log"; then
		echo "deps: the Debian mirror is unreachable: check the network and /etc/apt/sources.list, then make deps again" >&2
	fi
	exit 1
}
run apt-get update -q || fail "apt-get update"
run apt-get install -y -q --no-install-recommends "${missing[@]}" || fail "apt-get install ${missing[*]}"
rm -f "$log"
echo "deps: installed"
