#!/usr/bin/env bash
# Sizing run for docs/operations.md: ONE release damper-master and damper-load
# with AGENTS agents and ACCOUNTS accounts at 1 op/s each, each sent through
# 4 agents, for DURATION seconds. Prints the master's CPU seconds, RSS, and
# from its /metrics the rollups, entries and ingest-latency histogram.
# Loopback only; stops what it starts.
#
#   tests/sizing.sh [ACCOUNTS] [AGENTS] [DURATION]
set -euo pipefail
accounts=${1:-50000}
agents=${2:-200}
duration=${3:-60}
source "$(dirname "$0")/masters.sh"

start_master master
master=$pid
cpu() { awk '{printf "%.2f", ($14 + $15) / 100}' "/proc/$master/stat"; }
rss() { awk '/VmRSS/ {printf "%.1f MiB", $2 / 1024}' "/proc/$master/status"; }

"$bin/damper-load" --masters "$addr" --agents "$agents" --accounts "$accounts" --spread 4 --quiet \
  --traffic 'acct-{i}:messages:1:1' --traffic 'flood:messages:10000:1' \
  --duration "${duration}s" >"$dir/load.json" &
pids+=($!)
sleep 20
cpu20=$(cpu)
echo "t=20s: master CPU ${cpu20} s, RSS $(rss)" >&2
wait "${pids[1]}"
cpu_end=$(cpu)
echo "end:   master CPU ${cpu_end} s, RSS $(rss)" >&2
echo "master CPU over the last $((duration - 20)) s: $(awk -v a="$cpu_end" -v b="$cpu20" 'BEGIN {printf "%.2f", a - b}') s" >&2
curl -s "http://$http/metrics" | grep -E '^damper_master_(rollups_total|entries_total|accounts_tracked|ingest_duration_seconds_(bucket|sum|count))' >&2
tail -3 "$dir/load.json"
