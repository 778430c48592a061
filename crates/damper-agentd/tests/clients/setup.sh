#!/usr/bin/env bash
# Installs what the sidecar's client tests (crates/damper-agentd/tests/)
# need and nothing else: Debian's redis-tools (redis-cli, redis-benchmark),
# and a Python virtualenv (.venv beside this file) with the pinned clients
# of requirements.txt: redis-py, grpcio with grpcio-tools, and
# envoy-data-plane's Envoy rate limit service stubs. Idempotent: does
# nothing when all are there. `.ci/run` calls it.
set -euo pipefail
cd "$(dirname "$0")"

if ! command -v redis-cli >/dev/null 2>&1 || ! command -v redis-benchmark >/dev/null 2>&1; then
    echo "sidecar tests: installing Debian's redis-tools" >&2
    if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends redis-tools >/dev/null
fi

stamp=.venv/requirements.installed
if ! cmp -s requirements.txt "$stamp" 2>/dev/null; then
    echo "sidecar tests: creating .venv with the pinned Python clients" >&2
    rm -rf .venv
    python3 -m venv .venv
    .venv/bin/pip install --quiet --disable-pip-version-check -r requirements.txt
    cp requirements.txt "$stamp"
fi
