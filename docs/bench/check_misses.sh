#!/usr/bin/env bash
# Instructions and simulated cache misses per `check`, Damper's agent state
# machine beside governor's keyed limiter (tests/examples/check_misses.rs),
# under callgrind's cache simulation: the same counts on a loaded machine
# as on a quiet one, and on machines without hardware counters.
#
# Prints one row per case: limiter, path, keys, and per check the
# instructions, data reads and writes, first-level data misses and
# last-level misses. The `keys` rows are the loop alone, reading each
# key's bytes with no limiter: the caller's share of every row. The
# caches simulated: a 32 KiB 8-way first level and a last level of
# LL_MIB (default 32) MiB, 16-way, 64-byte lines. callgrind models two
# levels, no TLB and no prefetcher.
#
#   docs/bench/check_misses.sh [KEYS...]      (default: 100000 1000000)
#
# CHECKS (default 1000000) checks are measured per case; a case of a
# million keys takes about a minute under valgrind.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v valgrind >/dev/null || { echo "check_misses.sh: valgrind is not installed" >&2; exit 1; }
checks=${CHECKS:-1000000}
ll_mib=${LL_MIB:-32}
[[ $checks =~ ^[1-9][0-9]*$ ]] || { echo "check_misses.sh: CHECKS=$checks is not a whole number above 0" >&2; exit 2; }
[[ $ll_mib =~ ^[1-9][0-9]*$ ]] || { echo "check_misses.sh: LL_MIB=$ll_mib is not a whole number above 0" >&2; exit 2; }
keys=("$@")
[[ ${#keys[@]} -gt 0 ]] || keys=(100000 1000000)
cargo build --quiet --release -p damper-tests --example check_misses
bin=target/release/examples/check_misses
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "# $(valgrind --version), $(uname -m); simulated: first level 32 KiB 8-way, last level $ll_mib MiB 16-way, 64-byte lines; $checks checks a case"
printf '%-9s %-7s %9s %8s %8s %8s %8s %8s\n' limiter path keys instr reads writes D1miss LLmiss
for k in "${keys[@]}"; do
  for path in admit reject; do
    for limiter in damper governor keys; do
      [[ $limiter == keys && $path == reject ]] && continue
      valgrind --tool=callgrind --cache-sim=yes --D1=32768,8,64 \
        --LL=$((ll_mib << 20)),16,64 --toggle-collect='check_misses::measure' \
        --callgrind-out-file="$out/cg" "$bin" "$limiter" "$path" "$k" "$checks" \
        >/dev/null 2>&1
      # The file's totals: Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw.
      awk -v l="$limiter" -v p="$path" -v k="$k" -v n="$checks" '
        /^events:/ { for (i = 2; i <= NF; i++) col[$i] = i - 1 }
        /^totals:/ {
          d1 = $(col["D1mr"] + 1) + $(col["D1mw"] + 1)
          ll = $(col["DLmr"] + 1) + $(col["DLmw"] + 1)
          printf "%-9s %-7s %9d %8.1f %8.1f %8.1f %8.2f %8.2f\n", l, p, k,
            $(col["Ir"] + 1) / n, $(col["Dr"] + 1) / n, $(col["Dw"] + 1) / n, d1 / n, ll / n
        }' "$out/cg"
    done
  done
done
