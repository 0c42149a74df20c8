#!/usr/bin/env bash
# `lone serve` vs llama-server under 1, 2, 4, 8 concurrent streaming clients, same GGUF, same threads.
#
#   scripts/bench-serve.sh MODEL.gguf
#
# Settings (environment):
#   THREADS=2  PARALLEL=8  CONCURRENCY=1,2,4,8  REPS=2  MAX_TOKENS=64
#   CTX_PER_SLOT=1024     context per slot: lone --ctx, llama-server -c CTX_PER_SLOT*PARALLEL
#                         (llama-server splits -c over its -np slots)
#   PORT=18080  LLAMA_PORT=18081
#   DATE=YYYY-MM-DD       names the output (default today)
#   LONE=path/to/lone     (default: target/release/lone, built if missing)
#   LLAMA_SERVER=path     (default: ~/.cache/llama.cpp-0c1e570/bin/llama-server)
#
# Both servers run at once (idle, each uses no CPU), and scripts/bench-serve.py drives them
# interleaved: for each concurrency level C, repetition 1 runs lone then llama-server, repetition 2
# llama-server then lone. Each client streams one chat completion of exactly MAX_TOKENS tokens
# (temperature 0, ignore_eos). Writes docs/perf/serve-<date>.json (settings, machine, commands,
# every request, and the table as `table_md`) and prints the markdown table. Server logs:
# /tmp/bench-serve-<date>/.
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL="${1:?usage: scripts/bench-serve.sh MODEL.gguf}"
[ -f "$MODEL" ] || { echo "no such file: $MODEL" >&2; exit 1; }
THREADS="${THREADS:-2}"
PARALLEL="${PARALLEL:-8}"
CONCURRENCY="${CONCURRENCY:-1,2,4,8}"
REPS="${REPS:-2}"
MAX_TOKENS="${MAX_TOKENS:-64}"
CTX_PER_SLOT="${CTX_PER_SLOT:-1024}"
PORT="${PORT:-18080}"
LLAMA_PORT="${LLAMA_PORT:-18081}"
DATE="${DATE:-$(date +%F)}"
LLAMA_SERVER="${LLAMA_SERVER:-$HOME/.cache/llama.cpp-0c1e570/bin/llama-server}"
PY="${PYTHON:-python3}"

if [ -z "${LONE:-}" ]; then
  LONE="${CARGO_TARGET_DIR:-$PWD/target}/release/lone"
  [ -x "$LONE" ] || cargo build --release -q -p lone
fi
[ -x "$LLAMA_SERVER" ] || { echo "no llama-server at $LLAMA_SERVER (run ../shared/scripts/build-llama-cpp.sh)" >&2; exit 1; }

LONE_CMD="$LONE serve --model $MODEL --parallel $PARALLEL --threads $THREADS --ctx $CTX_PER_SLOT --port $PORT"
LLAMA_CMD="$LLAMA_SERVER -m $MODEL -t $THREADS -np $PARALLEL -c $((CTX_PER_SLOT * PARALLEL)) --port $LLAMA_PORT --no-webui"

mkdir -p docs/perf
OUT="docs/perf/serve-$DATE"
"$PY" scripts/bench-serve.py \
  --server lone "$PORT" "$LONE_CMD" \
  --server llama-server "$LLAMA_PORT" "$LLAMA_CMD" \
  --concurrency "$CONCURRENCY" --reps "$REPS" --max-tokens "$MAX_TOKENS" \
  --json "$OUT.json" --log-dir "/tmp/bench-serve-$DATE"
