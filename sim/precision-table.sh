#!/usr/bin/env bash
# Precision at the limit, before and after: runs every shipped scenario
# with low-noise admission and confidence off (`--low-noise false
# --confidence-sigmas 0`: an independent draw per operation, suppression
# on any excess) and on (the defaults), and prints the tables of
# docs/simulation.md ("Precision at the limit, before and after").
#
#   sim/precision-table.sh            # each scenario's own seed
#   sim/precision-table.sh --seeds 5  # medians over seeds 1..5
#
# Needs jq and python3; builds damper-sim in release mode first.
set -euo pipefail
cd "$(dirname "$0")/.."
source sim/seeds.sh
table_setup "$@"

# One run: prints its summary's accounts as one JSON line.
run() { # on|off out-dir scenario-file
    local flags=()
    if [[ $1 == off ]]; then
        flags=(--low-noise false --confidence-sigmas 0)
    fi
    "$bin" run "$3" "${flags[@]}" --out "$2" >/dev/null
    jq -c '[.accounts[] | {account, limit, ratio: .steady_admitted_ratio,
             p2p6: .oscillation_p2p, p2p1: .oscillation_p2p_1s,
             reaction: .reaction_s, release: .release_s, peak: .peak_6s_ratio,
             over: .over_admitted, false_rej: .false_rejections,
             fairness: .fairness_10s}]' "$2/summary.json"
}

runs_for_all "$seeds" "$work" "off on" run

PYTHONPATH=sim python3 - "$work" "$seeds" <<'PY'
import sys
from tables import fmt, scenarios
from tables import median as med
from tables import runs as runs_in
work, seeds = sys.argv[1], int(sys.argv[2])
PRECISION = ["cost1-flood", "costly-flood", "creeping-loss", "near-limit", "near-limit-small", "publishers"]
def runs(name, v):
    return runs_in(work, name, v)
label = {"off": "before", "on": "after"}
print("| scenario | account | | steady ratio | p2p 6 s | p2p 1 s | false rej. | release s | fairness 10 s |")
print("|---|---|---|---|---|---|---|---|---|")
for name in PRECISION:
    by_v = {v: runs(name, v) for v in ("off", "on")}
    for i, acc in enumerate(by_v["on"][0]):
        if acc["limit"] is None:
            continue
        for v in ("off", "on"):
            col = lambda k: med([r[i][k] for r in by_v[v]])
            print(f"| {name} | {acc['account']} | {label[v]} | {fmt(col('ratio'), 3)} | "
                  f"{fmt(col('p2p6'), 3)} | {fmt(col('p2p1'), 3)} | {fmt(col('false_rej'), 0)} | "
                  f"{fmt(col('release'), 2)} | {fmt(col('fairness'), 3)} |")
print()
print("| scenario | | reaction s (worst) | release s (worst) | peak 6 s | over-admitted | false rej. (all accounts) |")
print("|---|---|---|---|---|---|---|")
for name in scenarios(work):
    for v in ("off", "on"):
        rs = runs(name, v)
        def agg(key, f):
            per_run = []
            for r in rs:
                xs = [a[key] for a in r if a[key] is not None]
                per_run.append(f(xs) if xs else None)
            return med(per_run)
        print(f"| {name} | {label[v]} | {fmt(agg('reaction', max), 1)} | {fmt(agg('release', max), 2)} | "
              f"{fmt(agg('peak', max), 2)} | {fmt(agg('over', sum), 0)} | {fmt(agg('false_rej', sum), 0)} |")
if seeds:
    print(f"\nMedians over seeds 1..{seeds}.")
PY
