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
"$work/venv/bin/pip" install -q "$work"/dist/lone-*.whl pytest numpy jsonschema openai httpx
cd "$work"
"$work/venv/bin/python" -m pytest -q -p no:cacheprovider --rootdir "$root/tests/python" \
  "$root/tests/python" "$@"
