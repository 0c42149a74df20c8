#!/usr/bin/env bash
# Run every test: fetches the default model once (tests use it), the Rust test suite, then the
# `lone serve` end-to-end tests with the official openai Python client.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-default-model.sh
cargo test --workspace --release 2>&1
tests/serve/run.sh
