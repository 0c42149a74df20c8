#!/usr/bin/env bash
# Set up and run the default model: builds lone (release), fetches SmolLM2-135M-Instruct once,
# and answers a question with it. Extra arguments go to `lone run`.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "error: cargo (Rust) is required: https://rustup.rs" >&2; exit 1; }
scripts/fetch-default-model.sh
cargo build --release --quiet
if [ $# -eq 0 ]; then
  set -- --chat --prompt "What is the capital of France?"
fi
exec target/release/lone run "$@"
