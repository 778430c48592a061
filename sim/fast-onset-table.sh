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
    worst_figures "$2/summary.json"
}

runs_for_all "$seeds" "$work" "false true" run

PYTHONPATH=sim python3 - "$work" "$seeds" <<'PY'
import sys
from tables import knob_table
knob_table(sys.argv[1], int(sys.argv[2]), "fast onset", [
    ("reaction s", "reaction", 1), ("release s", "release", 2), ("peak 6 s", "peak", 2),
    ("over-admitted", "over", 0), ("false rej. (all accounts)", "false_rej", 0),
    ("RPC/s", "rpcs", 1), ("bytes/s", "bytes", 0),
])
PY
