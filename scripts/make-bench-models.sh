#!/usr/bin/env bash
# Random-weight models of real shapes for `lone bench` and scripts/compare-llamacpp.sh.
#
#   scripts/make-bench-models.sh                       # all: LFM2-350M LFM2-1.2B LFM3-1.7B Qwen2.5-0.5B
#                                                      #   Llama-350M LFM2-8B-A1B (needs 31 GB disk)
#   scripts/make-bench-models.sh LFM2-350M Qwen2.5-0.5B
#
# For each model, under ${LONE_BENCH_MODELS:-~/.cache/lone/bench}/<name>/:
#   hf/                    bf16 safetensors + the real tokenizer, chat template (scripts/bench_models.py)
#   <name>-F16.gguf, -BF16.gguf, -Q8_0.gguf     llama.cpp's convert_hf_to_gguf.py --outtype
#   <name>-Q4_0.gguf, -Q4_K_M.gguf             llama-quantize from the F16 GGUF
# LFM3 gets no GGUFs: llama.cpp cannot convert it yet. Idempotent: whatever exists is kept
# (files are written under a temporary name and renamed when complete).
#
# Needs: python3 with torch + transformers (+ numpy, safetensors, sentencepiece optional), and
# the llama.cpp tree built by ../shared/scripts/build-llama-cpp.sh
# ($LLAMA_CPP_SRC, default ~/.cache/llama.cpp-0c1e570/src; $LLAMA_CPP_BIN, default .../bin).
set -euo pipefail
cd "$(dirname "$0")/.."

ROOT="${LONE_BENCH_MODELS:-$HOME/.cache/lone/bench}"
LLAMA_CPP_SRC="${LLAMA_CPP_SRC:-$HOME/.cache/llama.cpp-0c1e570/src}"
LLAMA_CPP_BIN="${LLAMA_CPP_BIN:-$HOME/.cache/llama.cpp-0c1e570/bin}"
PY="${PYTHON:-python3}"

if [ $# -gt 0 ]; then MODELS=("$@"); else mapfile -t MODELS < <("$PY" scripts/bench_models.py --list); fi
mkdir -p "$ROOT"

CONVERT="$LLAMA_CPP_SRC/convert_hf_to_gguf.py"
QUANTIZE="$LLAMA_CPP_BIN/llama-quantize"
[ -x "$QUANTIZE" ] || QUANTIZE="$LLAMA_CPP_SRC/../build/bin/llama-quantize"

step() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*"; }

T0=$(date +%s)
for name in "${MODELS[@]}"; do
  t=$(date +%s)
  dir="$ROOT/$name"
  "$PY" scripts/bench_models.py "$ROOT" "$name"
  case "$name" in
    LFM3*) step "$name: no GGUF (llama.cpp has no LFM3 converter)"; continue ;;
  esac
  if [ ! -f "$CONVERT" ]; then
    step "no $CONVERT: skipping GGUFs (run ../shared/scripts/build-llama-cpp.sh)"; continue
  fi
  # An MoE of 8 B parameters: the converter's Q8_0, and Q4_K_M requantized from it (an F16
  # and a BF16 GGUF would need 33 GB more disk).
  quants="F16 BF16 Q8_0"; from=F16; requants="Q4_0 Q4_K_M"
  case "$name" in *-A1B|*-A2B) quants="Q8_0"; from=Q8_0; requants="Q4_K_M" ;; esac
  for q in $quants; do
    out="$dir/$name-$q.gguf"
    [ -f "$out" ] && continue
    step "$name: convert --outtype ${q,,}"
    "$PY" scripts/bench_models.py --convert "$dir/hf" "${q,,}" "$out.tmp" >"$dir/convert-$q.log" 2>&1 \
      || { tail -20 "$dir/convert-$q.log"; exit 1; }
    mv "$out.tmp" "$out"
  done
  for q in $requants; do
    out="$dir/$name-$q.gguf"
    [ -f "$out" ] && continue
    if [ ! -x "$QUANTIZE" ]; then step "no llama-quantize: skipping $q"; continue; fi
    step "$name: llama-quantize $q"
    "$QUANTIZE" --allow-requantize "$dir/$name-$from.gguf" "$out.tmp" "$q" "$(nproc)" \
      >"$dir/quantize-$q.log" 2>&1 \
      || { tail -20 "$dir/quantize-$q.log"; exit 1; }
    mv "$out.tmp" "$out"
  done
  step "$name: done in $(( $(date +%s) - t )) s"
done
step "all done in $(( $(date +%s) - T0 )) s; models under $ROOT"
ls -la "$ROOT"/*/ 2>/dev/null | grep -E 'gguf|^/' || true
