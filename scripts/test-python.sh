#!/usr/bin/env bash
# Build the `lone` wheel (the command + the Python module), install it into a fresh venv and
# run the Python API tests against the installed package (tests/python), from outside the
# source tree. Arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/lone-py.XXXXXX")
trap 'rm -rf "$work"' EXIT
scripts/build-wheel.sh "$work/dist" >&2
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q "$work"/dist/lone-*.whl pytest pytest-timeout numpy jsonschema openai httpx
cd "$work"
# A hang (a deadlock) fails its test after 5 minutes instead of stalling CI.
"$work/venv/bin/python" -m pytest -q -p no:cacheprovider --timeout 300 --rootdir "$root/tests/python" \
  "$root/tests/python" "$@"
