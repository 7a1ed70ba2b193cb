#!/usr/bin/env bash
# stage.sh NAME [--show] -- CMD [ARG...] — run one stage of `make` (deps, build, a fixture, a suite)
# with its wall time, quiet by default.
#
#   quiet (default)  CMD's output goes to $STAGE_LOG_DIR/NAME.log only; every 60 s a heartbeat line says
#                    the stage still runs, for how long, and the log's last line (so a 10-minute compile
#                    is never silent); on failure the log's last 40 lines are printed with its path.
#   on failure       also the command that reruns the stage alone, from the directory it ran in.
#   --show or V=1    CMD's output goes to the terminal too (test suites use --show: their results are
#                    the point).
#
# Always: a line `[stage] NAME ok 12.3 s` (or `FAILED (exit N) after 12.3 s`) on stderr, and a row
# NAME<TAB>seconds<TAB>ok|failed appended to $STAGE_TIMES when that is set (.ci/run prints the table).
# Exit status: CMD's.
#
# STAGE_LOG_DIR defaults to ${TMPDIR:-/tmp}/appliance-stages.
set -uo pipefail

name=${1:?usage: stage.sh NAME [--show] -- CMD...}
shift
show=false
[[ ${V:-0} == 1 ]] && show=true
while (($#)); do
	case $1 in
	--show) show=true; shift ;;
	--) shift; break ;;
	*) echo "stage.sh: unknown option $1 (usage: stage.sh NAME [--show] -- CMD...)" >&2; exit 2 ;;
	esac
done
(($#)) || { echo "stage.sh: no command for stage $name" >&2; exit 2; }

logdir=${STAGE_LOG_DIR:-${TMPDIR:-/tmp}/appliance-stages}
mkdir -p "$logdir"
log=$logdir/$name.log
start=$(date +%s%N)
secs() { local ms=$((($(date +%s%N) - start) / 1000000)); printf '%d.%d' $((ms / 1000)) $((ms % 1000 / 100)); }

echo "[stage] $name ..." >&2
if $show; then
	"$@" 2>&1 | tee "$log"
	rc=${PIPESTATUS[0]}
else
	"$@" >"$log" 2>&1 &
	pid=$!
	# The heartbeat: a stage that runs for minutes says so, with the newest line of its log.
	(
		while sleep 60; do
			kill -0 "$pid" 2>/dev/null || exit 0
			printf '[stage] %s still running (%s s): %s\n' "$name" "$(secs)" "$(tail -n1 "$log" 2>/dev/null | cut -c1-120)" >&2
		done
	) &
	beat=$!
	wait "$pid"
	rc=$?
	kill "$beat" 2>/dev/null
	wait "$beat" 2>/dev/null
fi

t=$(secs)
if ((rc == 0)); then
	echo "[stage] $name ok $t s" >&2
	[[ -n ${STAGE_TIMES:-} ]] && printf '%s\t%s\tok\n' "$name" "$t" >>"$STAGE_TIMES"
else
	if ! $show; then
		echo "[stage] $name: last 40 lines of $log:" >&2
		tail -n 40 "$log" | sed 's/^/    /' >&2
	fi
	echo "[stage] $name FAILED (exit $rc) after $t s; full log: $log" >&2
	printf '[stage] %s: to rerun it alone (from %s):' "$name" "$PWD" >&2
	printf ' %q' "$@" >&2
	echo >&2
	[[ -n ${STAGE_TIMES:-} ]] && printf '%s\t%s\tfailed\n' "$name" "$t" >>"$STAGE_TIMES"
fi
exit "$rc"
