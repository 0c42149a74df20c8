#!/usr/bin/env bash
# What the browser test (tests/serve/test_web.py) needs: Debian's Chromium and, from npm,
# playwright-core (tests/web/package-lock.json). Idempotent; uses sudo when not root.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x /usr/bin/chromium ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
command -v node >/dev/null || { echo "install-browser: node (Node.js) is needed for the browser test" >&2; exit 1; }
(cd tests/web && npm ci --no-audit --no-fund --loglevel=error)
