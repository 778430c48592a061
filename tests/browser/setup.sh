#!/usr/bin/env bash
# Installs what the browser test (crates/damper-master/tests/browser.rs)
# needs and nothing else: Debian's Chromium, and the npm package
# playwright-core (pinned in package-lock.json) that drives it. Idempotent:
# does nothing when both are there. `.ci/run` calls it first.
set -euo pipefail
cd "$(dirname "$0")"

if ! command -v chromium >/dev/null 2>&1; then
    echo "browser test: installing Debian's chromium" >&2
    if [ "$(id -u)" -eq 0 ]; then SUDO=""; else SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi

pinned=$(node -p "require('./package.json').dependencies['playwright-core']")
installed=$(node -p "try { require('./node_modules/playwright-core/package.json').version } catch { '' }")
if [ "$pinned" != "$installed" ]; then
    echo "browser test: npm ci (playwright-core)" >&2
    npm ci --no-audit --no-fund --loglevel=error
fi
