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

# One run: prints the worst account's figures as one JSON line, with the
# onset and the hints and polls.
run() { # false|true out-dir scenario-file
    "$bin" run "$3" --sparse-hints "$1" --out "$2" >/dev/null
    worst_figures "$2/summary.json" '{ onset_over: $w.onset_over_admitted,
        hints: .control.by_kind.hints, polls: .control.by_kind.poll_pushes }'
}

runs_for_all "$seeds" "$work" "false true" run

PYTHONPATH=sim python3 - "$work" "$seeds" <<'PY'
import sys
from tables import knob_table
knob_table(sys.argv[1], int(sys.argv[2]), "hints", [
    ("reaction s", "reaction", 1), ("release s", "release", 2), ("onset over", "onset_over", 0),
    ("peak 6 s", "peak", 2), ("over-admitted", "over", 0), ("false rej.", "false_rej", 0),
    ("RPC/s", "rpcs", 1), ("bytes/s", "bytes", 0), ("hints", "hints", 0),
    ("poll pushes", "polls", 0),
])
PY
