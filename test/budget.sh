#!/usr/bin/env bash
# budget.sh TIMES TOTAL_SECONDS [BUDGET] — compare one run's stage times (stage.sh's $STAGE_TIMES:
# NAME<TAB>SECONDS<TAB>ok|failed) and its total with the committed figures (test/budget.tsv): one line
# per stage with its committed figure and the ratio, the stages that grew by more than 20 % named, and
# the total against both budgets. Informational: exit status 0 whatever the times; a missing or
# malformed budget file is reported and the stage table printed without it.
set -uo pipefail
times=${1:?usage: budget.sh TIMES TOTAL_SECONDS [BUDGET]}
total=${2:?usage: budget.sh TIMES TOTAL_SECONDS [BUDGET]}
budget=${3:-$(dirname "$0")/budget.tsv}
[[ -r $times ]] || { echo "budget: no stage times at $times"; exit 0; }
if [[ ! -r $budget ]]; then
	echo "budget: no budget file at $budget: the figures below are not compared"
	budget=/dev/null
elif bad=$(awk -F'\t' '!/^#/ && NF && ($2 !~ /^[0-9]+(\.[0-9]+)?$/ || NF < 2) {print NR": "$0}' "$budget") && [[ -n $bad ]]; then
	echo "budget: $budget has malformed rows (want NAME<TAB>SECONDS<TAB>SOURCE), ignored:"
	printf '  %s\n' "$bad"
fi
awk -F'\t' -v total="$total" '
	FILENAME == ARGV[1] { if ($0 !~ /^#/ && NF >= 2 && $2 ~ /^[0-9]+(\.[0-9]+)?$/) ref[$1] = $2; next }
	{ now[$1] = $2; state[$1] = $3; order[++n] = $1 }
	END {
		printf "== budget: this run against test/budget.tsv (a stage more than 20 %% over its figure is named)\n"
		for (i = 1; i <= n; i++) {
			s = order[i]
			if (s in ref && ref[s] > 0) {
				r = now[s] / ref[s]
				flag = r > 1.2 ? "  GREW" : ""
				printf "  %-28s %8.1f s  committed %6d s  %5.2fx  %s%s\n", s, now[s], ref[s], r, state[s], flag
				if (r > 1.2) grew = grew " " s
			} else {
				printf "  %-28s %8.1f s  (no committed figure)  %s\n", s, now[s], state[s]
			}
		}
		printf "  %-28s %8d s", "total", total
		if ("total" in ref) printf "  committed %6d s  %5.2fx", ref["total"], total / ref["total"]
		printf "\n"
		if ("budget-warm" in ref) printf "  within the warm budget (%d s): %s; within the cold budget (%d s): %s\n", ref["budget-warm"], (total <= ref["budget-warm"] ? "yes" : "NO"), ref["budget-cold"], (total <= ref["budget-cold"] ? "yes" : "NO")
		if (grew != "") printf "  grew by more than 20 %%:%s\n", grew
	}' "$budget" "$times"
exit 0
