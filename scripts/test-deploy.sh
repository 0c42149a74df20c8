#!/usr/bin/env bash
# The deployment recipe, tested: Debian's nginx with deploy/nginx.conf in front of 3 `lone serve`
# replicas on loopback, a replica killed and restarted under streaming load
# (tests/deploy/test_deploy.py). Installs nginx (nginx-light) when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nginx-light curl >/dev/null
fi
python3 -m pip install -q pytest httpx
# The workspace's feature set, as scripts/test.sh builds it (so nothing is built twice).
cargo build --release --workspace
LONE_REQUIRE_NGINX=1 python3 -m pytest -q tests/deploy "$@"
