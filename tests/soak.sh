#!/usr/bin/env bash
# The soak run (issue 5): 3 damper-master processes, damper-load with 200
# agents and 10 000 accounts (plus one 10x flood), for DURATION seconds
# (default 600). Prints each master's RSS every minute and damper-load's
# summary lines. Loopback only; stops what it starts.
#
#   tests/soak.sh [DURATION]
set -euo pipefail
duration=${1:-600}
source "$(dirname "$0")/masters.sh"

masters=()
for i in 0 1 2; do
  start_master "master$i"
  masters+=("$addr")
done
list=$(IFS=,; echo "${masters[*]}")
rss() { for p in "${pids[@]:0:3}"; do awk '/VmRSS/ {printf "%s ", $2}' "/proc/$p/status"; done; }
echo "masters: $list" >&2

"$bin/damper-load" --masters "$list" --agents 200 --accounts 10000 --spread 4 --quiet \
  --traffic 'acct-{i}:messages:1:1' --traffic 'flood:messages:10000:1' \
  --duration "${duration}s" >"$dir/load.json" &
load=$!
pids+=($load)
for ((t = 0; t <= duration; t += 60)); do
  echo "t=${t}s master RSS (KiB): $(rss)" >&2
  [ "$t" -lt "$duration" ] && sleep 60
done
wait "$load"
cat "$dir/load.json"
echo "end master RSS (KiB): $(rss)" >&2
grep -ciE 'error|refused' "$dir"/master*.log | sed 's/^/error lines: /' >&2 || true
