#!/usr/bin/env bash
# Installs what the chaos test (crates/damper-load/tests/chaos.rs) needs:
# Debian's iproute2 (`ip netns`, veth, `tc`) and nftables (`nft`, for loss
# and partitions where the kernel has no netem); and curl, the SSE client of
# the master's events test (crates/damper-master/tests/events.rs). Idempotent: does nothing
# when both are there. Where packages cannot be installed (not root and no
# sudo) it says so and exits 0: the test then skips, saying why.
# `.ci/run` calls it.
set -euo pipefail

missing=()
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v nft >/dev/null 2>&1 || missing+=(nftables)
command -v curl >/dev/null 2>&1 || missing+=(curl)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then SUDO=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo"
else
    echo "chaos test: cannot install ${missing[*]} (not root, no sudo); the test will skip" >&2
    exit 0
fi
echo "chaos test: installing Debian's ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
