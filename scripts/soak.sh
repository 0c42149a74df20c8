#!/usr/bin/env bash
# Soak `lone serve` (scripts/soak.py): `scripts/soak.sh --minutes 5 [--clients 8]`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-default-model.sh
python3 -m pip install -q httpx
cargo build --release -p lone
exec python3 scripts/soak.py "$@"
