#!/usr/bin/env bash
# Fast onset, before and after: runs every shipped scenario with
# `--fast-onset false` and `true` and prints the tables of
# docs/simulation.md ("Fast onset, before and after").
#
#   sim/fast-onset-table.sh            # each scenario's own seed
#   sim/fast-onset-table.sh --seeds 7  # medians over seeds 1..7
#
# Needs jq and python3; builds damper-sim in release mode first.
set -euo pipefail
cd "$(dirname "$0")/.."
source sim/seeds.sh
table_setup "$@"

# One run: prints the worst account's figures as one JSON line.
run() { # fast-onset out-dir scenario-file
    "$bin" run "$3" --fast-onset "$1" --out "$2" >/dev/null
    jq -c '
      ([.accounts[] | select(.limit != null)] | max_by(.over_admitted)) as $w
      | { account: $w.account, reaction: $w.reaction_s, release: $w.release_s,
          peak: ([.accounts[].peak_6s_ratio | select(. != null)] | max),
          over: ([.accounts[].over_admitted] | add),
          false_rej: ([.accounts[].false_rejections] | add),
          rpcs: .control.rpcs_per_s, bytes: .control.bytes_per_s }' "$2/summary.json"
}

runs_for_all "$seeds" "$work" "false true" run

PYTHONPATH=sim python3 - "$work" "$seeds" <<'PY'
import sys
from tables import fmt, med, runs, scenarios
work, seeds = sys.argv[1], int(sys.argv[2])
print("| scenario | fast onset | account (worst) | reaction s | release s | peak 6 s | over-admitted | false rej. (all accounts) | RPC/s | bytes/s |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name in scenarios(work):
    for on in ("false", "true"):
        rows = runs(work, name, on)
        print(f"| {name} | {'on' if on == 'true' else 'off'} | {rows[0]['account']} | "
              f"{fmt(med(rows, 'reaction'), 1)} | {fmt(med(rows, 'release'), 2)} | "
              f"{fmt(med(rows, 'peak'), 2)} | {fmt(med(rows, 'over'), 0)} | "
              f"{fmt(med(rows, 'false_rej'), 0)} | {fmt(med(rows, 'rpcs'), 1)} | "
              f"{fmt(med(rows, 'bytes'), 0)} |")
if seeds:
    print(f"\nMedians over seeds 1..{seeds}.")
PY
