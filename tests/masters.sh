# Sourced by docs/bench/soak.sh and tests/sizing.sh: builds the release binaries,
# makes a scratch directory, stops everything started and removes the
# directory on exit, and starts masters on loopback.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release --locked -p damper-master -p damper-load >&2
bin=${DAMPER_BIN:-target/release}
dir=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT

# start_master NAME: starts a master on fresh loopback ports, logging to
# $dir/NAME.log; sets $addr (gRPC), $http and $pid once it serves.
start_master() {
  NO_COLOR=1 "$bin/damper-master" --listen 127.0.0.1:0 --http 127.0.0.1:0 >"$dir/$1.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  addr="" http=""
  for _ in $(seq 100); do
    addr=$(grep -o ' listen=[0-9.:]*' "$dir/$1.log" | head -1 | cut -d= -f2 || true)
    http=$(grep -o ' http=[0-9.:]*' "$dir/$1.log" | head -1 | cut -d= -f2 || true)
    [ -n "$addr" ] && return 0
    sleep 0.1
  done
  echo "master $1 did not start:" >&2
  cat "$dir/$1.log" >&2
  return 1
}
