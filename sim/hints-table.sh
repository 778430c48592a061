#!/usr/bin/env bash
# Sparse hints, before and after: runs every shipped scenario with
# `--sparse-hints false` (fast onset as before hints) and `true` (the
# default), and prints the table of docs/simulation.md ("Sparse hints,
# before and after"): the worst account's reaction, release and onset, the
# scenario's peak 6-s bucket, cost over the limit and falsely refused, and
# the control traffic with the hints and polls it carried.
#
#   sim/hints-table.sh             # each scenario's own seed
#   sim/hints-table.sh --seeds 20  # medians over seeds 1..20
#
# Needs jq and python3; builds damper-sim in release mode first.
set -euo pipefail
cd "$(dirname "$0")/.."
source sim/seeds.sh
table_setup "$@"

# One run: prints the worst account's figures as one JSON line.
run() { # false|true out-dir scenario-file
    "$bin" run "$3" --sparse-hints "$1" --out "$2" >/dev/null
    jq -c '
      ([.accounts[] | select(.limit != null)] | max_by(.over_admitted)) as $w
      | { account: $w.account, reaction: $w.reaction_s, release: $w.release_s,
          onset_over: $w.onset_over_admitted,
          peak: ([.accounts[].peak_6s_ratio | select(. != null)] | max),
          over: ([.accounts[].over_admitted] | add),
          false_rej: ([.accounts[].false_rejections] | add),
          rpcs: .control.rpcs_per_s, bytes: .control.bytes_per_s,
          hints: .control.by_kind.hints, polls: .control.by_kind.poll_pushes }' "$2/summary.json"
}

runs_for_all "$seeds" "$work" "false true" run

PYTHONPATH=sim python3 - "$work" "$seeds" <<'PY'
import sys
from tables import fmt, med, runs, scenarios
work, seeds = sys.argv[1], int(sys.argv[2])
print("| scenario | hints | account (worst) | reaction s | release s | onset over | peak 6 s | over-admitted | false rej. | RPC/s | bytes/s | hints | poll pushes |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for name in scenarios(work):
    for on in ("false", "true"):
        rows = runs(work, name, on)
        print(f"| {name} | {'on' if on == 'true' else 'off'} | {rows[0]['account']} | "
              f"{fmt(med(rows, 'reaction'), 1)} | {fmt(med(rows, 'release'), 2)} | "
              f"{fmt(med(rows, 'onset_over'), 0)} | {fmt(med(rows, 'peak'), 2)} | "
              f"{fmt(med(rows, 'over'), 0)} | {fmt(med(rows, 'false_rej'), 0)} | "
              f"{fmt(med(rows, 'rpcs'), 1)} | {fmt(med(rows, 'bytes'), 0)} | "
              f"{fmt(med(rows, 'hints'), 0)} | {fmt(med(rows, 'polls'), 0)} |")
if seeds:
    print(f"\nMedians over seeds 1..{seeds}.")
PY
