#!/usr/bin/env bash
# Run every test: fetches the default model once (tests use it), then the Rust test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-default-model.sh
cargo test --workspace --release 2>&1
