#!/usr/bin/env bash
# `lone serve` end-to-end tests: the official openai client against a real server on loopback.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m pip install -q openai pytest jsonschema pydantic langchain-openai ollama anthropic
# The workspace's feature set, as scripts/test.sh builds it (so nothing is built twice).
cargo build --release --workspace
python3 -m pytest -q tests/serve "$@"
