#!/usr/bin/env bash
# The soak run: 3 release damper-master processes and damper-load with 200
# agents and 10 000 accounts at 1 op/s each (each sent through 4 agents),
# plus one account flooding at 10x its limit, for DURATION seconds (default
# 1800). Samples each master's resident memory every 10 s into
# $OUT/soak-rss.csv, plots it to $OUT/soak-rss.svg (docs/bench/plot-rss.py,
# Python's standard library only), and prints damper-load's summary.
# Loopback only; stops what it starts. OUT defaults to target/soak.
#
#   docs/bench/soak.sh [DURATION]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
duration=${1:-1800}
source "$here/../../tests/masters.sh"
out=${OUT:-target/soak}
mkdir -p "$out"

masters=()
for i in 0 1 2; do
  start_master "master$i"
  masters+=("$addr")
done
list=$(IFS=,; echo "${masters[*]}")
rss() { for p in "${pids[@]:0:3}"; do awk '/VmRSS/ {printf ",%s", $2}' "/proc/$p/status"; done; }
echo "masters: $list" >&2

"$bin/damper-load" --masters "$list" --agents 200 --accounts 10000 --spread 4 --quiet \
  --traffic 'acct-{i}:messages:1:1' --traffic 'flood:messages:10000:1' \
  --duration "${duration}s" >"$dir/load.json" &
load=$!
pids+=($load)
echo "seconds,master0_kib,master1_kib,master2_kib" >"$out/soak-rss.csv"
start=$SECONDS
while kill -0 "$load" 2>/dev/null; do
  t=$((SECONDS - start))
  line="$t$(rss)"
  echo "$line" >>"$out/soak-rss.csv"
  [ $((t % 60)) -lt 10 ] && echo "t=${t}s master RSS (KiB): $line" >&2
  sleep 10
done
wait "$load"
cat "$dir/load.json"
echo "end master RSS (KiB): $(rss)" >&2
grep -ciE 'error|refused' "$dir"/master*.log | sed 's/^/error lines: /' >&2 || true
python3 "$here/plot-rss.py" "$out/soak-rss.csv" "$out/soak-rss.svg" \
  "Master resident memory, 200 agents x 10 000 accounts + a 10x flood, ${duration} s"
echo "plot: $out/soak-rss.svg" >&2
