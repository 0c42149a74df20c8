#!/usr/bin/env bash
# `lone serve` end-to-end tests: the official openai client against a real server on loopback.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -m pip install -q openai pytest jsonschema pydantic langchain-openai ollama anthropic
cargo build --release -p lone
python3 -m pytest -q tests/serve "$@"
