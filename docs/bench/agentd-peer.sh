#!/usr/bin/env bash
# The sidecar benchmark: damper-agentd over the Redis protocol against
# redis-server running the GCRA Lua limiter (the usual shared limiter),
# driven by the same redis-benchmark under the same load, in one run; plus
# the sidecar's gRPC CheckMany. See docs/bench/README.md. Not run in CI.
#
# Starts (on free loopback ports, stopped on exit, by PID): a damper-master,
# a damper-agentd with its RESP and gRPC doors, and a redis-server without
# persistence with the GCRA script loaded. Each case runs ROUNDS times,
# Damper and Redis alternating; medians are printed, with each process's
# own CPU per decision (from /proc, user + system).
#
# Usage: docs/bench/agentd-peer.sh [SECONDS_PER_CASE (5)] [ROUNDS (3)]
# Needs redis-server and redis-benchmark (Debian's redis-server and
# redis-tools: installed if missing).
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-5}
rounds=${2:-3}

for tool in redis-server redis-benchmark; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        if [ "$(id -u)" -eq 0 ]; then sudo=(); else sudo=(sudo); fi
        "${sudo[@]}" apt-get update -qq
        DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq redis-server redis-tools >/dev/null
    fi
done
cargo build --release -p damper-master -p damper-agentd >&2
cargo build --release -p damper-agentd --example grpc_load >&2

free_port() { # a port nothing listens on, from $1 up
    local p=$1
    while (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do p=$((p + 1)); done
    echo "$p"
}
master_port=$(free_port 17370); master_http=$(free_port 17380)
resp_port=$(free_port 16390); grpc_port=$(free_port 17390); redis_port=$(free_port 6400)
work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

./target/release/damper-master --listen "127.0.0.1:$master_port" --http "127.0.0.1:$master_http" >"$work/master.log" 2>&1 &
pids+=($!)
./target/release/damper-agentd --masters "127.0.0.1:$master_port" --resp "127.0.0.1:$resp_port" \
    --grpc "127.0.0.1:$grpc_port" >"$work/agentd.log" 2>&1 &
agentd=$!; pids+=($agentd)
redis-server --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no --dir "$work" \
    --logfile "$work/redis.log" &
redis=$!; pids+=($redis)
for _ in $(seq 100); do
    redis-cli -p "$resp_port" ping >/dev/null 2>&1 && redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break
    sleep 0.1
done

# The GCRA limiter of docs/bench/redis-peer (the usual Lua version):
# ARGV limit per period, period (ms), burst, cost.
gcra='local limit = tonumber(ARGV[1]) local period = tonumber(ARGV[2]) * 1000
local burst = tonumber(ARGV[3]) local cost = tonumber(ARGV[4])
local time = redis.call("TIME") local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local interval = period / limit local burst_offset = interval * burst
local tat = tonumber(redis.call("GET", KEYS[1]) or now) if tat < now then tat = now end
local new_tat = tat + interval * cost if new_tat - now > burst_offset then return 0 end
redis.call("SET", KEYS[1], string.format("%.0f", new_tat), "PX", math.ceil((new_tat - now) / 1000)) return 1'
sha=$(redis-cli -p "$redis_port" SCRIPT LOAD "$gcra")

cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

# One redis-benchmark case: prints "rps p50_ms p99_ms cpu_us_per_decision".
bench() { # system port pid clients pipeline command...
    local port=$2 pid=$3 c=$4 p=$5; shift 5
    local probe n before after
    probe=$(redis-benchmark -p "$port" -c "$c" -P "$p" -n 20000 -r 100000 --csv "$@" 2>/dev/null | tail -1 | cut -d, -f2 | tr -d '"')
    n=$(python3 -c "print(max(20000, int(float('$probe') * $seconds)))")
    before=$(cpu "$pid")
    local row
    row=$(redis-benchmark -p "$port" -c "$c" -P "$p" -n "$n" -r 100000 --csv "$@" 2>/dev/null | tail -1)
    after=$(cpu "$pid")
    python3 - "$row" "$before" "$after" "$hz" "$n" <<'PY'
import sys
row, before, after, hz, n = sys.argv[1].replace('"', '').split(','), *map(float, sys.argv[2:])
rps, p50, p99 = float(row[1]), float(row[4]), float(row[6])
print(f"{rps:.0f} {p50:.3f} {p99:.3f} {(after - before) / hz / n * 1e6:.2f}")
PY
}

results="$work/results"
for round in $(seq "$rounds"); do
    for case in "1 1" "50 1" "1 16" "50 16"; do
        set -- $case
        echo "damper-agentd $1 $2 $(bench damper "$resp_port" "$agentd" "$1" "$2" DAMPER.CHECK acct-__rand_int__ messages 1)" >>"$results"
        echo "redis-gcra $1 $2 $(bench redis "$redis_port" "$redis" "$1" "$2" EVALSHA "$sha" 1 acct-__rand_int__ 1000 1000 1000 1)" >>"$results"
    done
    before=$(cpu "$agentd")
    line=$(./target/release/examples/grpc_load "127.0.0.1:$grpc_port" "$seconds" 1000 4)
    after=$(cpu "$agentd")
    python3 - "$line" "$before" "$after" "$hz" "$seconds" >>"$results" <<'PY'
import json, sys
r = json.loads(sys.argv[1]); before, after, hz, secs = map(float, sys.argv[2:])
per = (after - before) / hz / (r["decisions_per_sec"] * secs) * 1e6
print(f"grpc-checkmany 4 1000 {r['decisions_per_sec']} {r['batch_p50_ms']} {r['batch_p99_ms']} {per:.2f}")
PY
    echo "round $round done" >&2
done

echo "# $(nproc) cores, $(uname -r), $(date -u +%Y-%m-%d); medians of $rounds rounds, ${seconds} s per case"
python3 - "$results" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    system, c, p, *vals = line.split()
    rows.setdefault((system, int(c), int(p)), []).append([float(v) for v in vals])
def med(key, i):
    return statistics.median(v[i] for v in rows[key])
print("| connections | pipeline | damper-agentd decisions/s | p50 / p99 ms | CPU µs/decision | redis GCRA decisions/s | p50 / p99 ms | CPU µs/decision | ratio |")
print("|---|---|---|---|---|---|---|---|---|")
for c, p in [(1, 1), (50, 1), (1, 16), (50, 16)]:
    d, r = ("damper-agentd", c, p), ("redis-gcra", c, p)
    print(f"| {c} | {p} | {med(d,0):,.0f} | {med(d,1):.3f} / {med(d,2):.3f} | {med(d,3):.2f} | "
          f"{med(r,0):,.0f} | {med(r,1):.3f} / {med(r,2):.3f} | {med(r,3):.2f} | {med(d,0)/med(r,0):.1f}x |")
g = ("grpc-checkmany", 4, 1000)
print(f"\ngRPC CheckMany (batches of 1000, 4 callers): {med(g,0):,.0f} decisions/s, "
      f"batch p50 {med(g,1):.2f} ms, p99 {med(g,2):.2f} ms, sidecar CPU {med(g,3):.2f} µs/decision")
PY
