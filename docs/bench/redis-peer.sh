#!/usr/bin/env bash
# The "Redis peer" benchmark: Damper's in-process `check` side by side with a
# GCRA limiter in Redis, in one run. See docs/bench/README.md. Not run in CI.
#
# Installs Debian's redis-server if it is missing, starts a throwaway
# redis-server on 127.0.0.1 (no persistence) on a free port from 6390 up,
# stops it on exit, and runs the harness in docs/bench/redis-peer/.
#
# Usage: docs/bench/redis-peer.sh [--seconds N] [other harness flags]
#        (docs/bench/redis-peer.sh --help lists them)
# Environment: REDIS_PORT (first port tried, default 6390), CARGO_TARGET_DIR
# (default: the repository's target/, shared with the workspace's builds).
set -euo pipefail

cd "$(dirname "$0")/../.."
root=$(pwd)
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
manifest=docs/bench/redis-peer/Cargo.toml

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    echo "redis-server not found: installing Debian's redis-server" >&2
    if [ "$(id -u)" -eq 0 ]; then sudo=(); else sudo=(sudo); fi
    "${sudo[@]}" apt-get install -y redis-server ||
        { "${sudo[@]}" apt-get update && "${sudo[@]}" apt-get install -y redis-server; }
fi

# Build before Redis starts, so a long build does not leave it waiting.
cargo build --release --manifest-path "$manifest"

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port=${REDIS_PORT:-6390}
while port_in_use "$port"; do
    port=$((port + 1))
done

workdir=$(mktemp -d)
redis_pid=
cleanup() {
    if [ -n "$redis_pid" ]; then
        kill "$redis_pid" 2>/dev/null || true
        wait "$redis_pid" 2>/dev/null || true
    fi
    rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
    --daemonize no --dir "$workdir" --logfile "$workdir/redis.log" &
redis_pid=$!

for _ in $(seq 100); do
    if [ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = PONG ]; then
        break
    fi
    if ! kill -0 "$redis_pid" 2>/dev/null; then
        echo "redis-server exited:" >&2
        cat "$workdir/redis.log" >&2 || true
        exit 1
    fi
    sleep 0.1
done
if [ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" != PONG ]; then
    echo "redis-server on port $port does not answer PING" >&2
    cat "$workdir/redis.log" >&2 || true
    exit 1
fi
echo "redis-server (pid $redis_pid) on 127.0.0.1:$port" >&2

cargo run --release --manifest-path "$manifest" -- --redis "redis://127.0.0.1:$port" "$@"
