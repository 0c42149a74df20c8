#!/usr/bin/env bash
# Instructions per decoded token and per prompt token, lone against llama.cpp, on aarch64 under
# qemu-user (counted by a TCG plugin: repeatable, like callgrind; a count is not a time).
#
#   scripts/compare-llamacpp-aarch64.sh [MODEL.gguf ...]      (default: the default model)
#
# Needs: lone cross-built for aarch64 (this script builds it with scripts/test-aarch64.sh's
# toolchain), the plugin (../shared/scripts/qemu-insn-plugin.sh) and llama.cpp cross-built for
# the CPU class (LLAMA_CPU=aarch64-dotprod ../shared/scripts/build-llama-cpp.sh; CLASS=i8mm for
# LLAMA_CPU=aarch64-i8mm). One thread each. Per-token counts are differences of two runs that
# differ only in the token count (load, warm-up and set-up cancel):
#   decode: `-n 34` minus `-n 2` over 32 tokens (lone run --ignore-eos; llama-bench -n): the
#           steady state, after the first decode step, where lone builds its interleaved
#           weight copies (llama.cpp repacks at load, which cancels too);
#   prompt: a 64-token prompt minus a 32-token one over 32 tokens (lone run -n 1 --prompt-ids;
#           llama-bench -p), llama-bench with --no-warmup (its warm-up repeats the prompt).
# lone's modes: auto (the default: 8-bit decode, exact prompts) and fast (--fast) for prompts.
# Prints a markdown table row per model (docs/performance.md's aarch64 table).
set -euo pipefail
cd "$(dirname "$0")/.."
CLASS=${CLASS:-dotprod}
case $CLASS in
  dotprod) CPU=${QEMU_CPU:-cortex-a76} ;;
  i8mm) CPU=${QEMU_CPU:-max,sme=off} ;;
  *) echo "CLASS is dotprod or i8mm" >&2; exit 2 ;;
esac
LLAMA=${LLAMA:-$HOME/.cache/llama.cpp-0c1e570-aarch64-$CLASS}
PLUGIN=${PLUGIN:-$HOME/.cache/qemu-insn/libinsn.so}
[ -f "$PLUGIN" ] || bash ../shared/scripts/qemu-insn-plugin.sh "$(dirname "$PLUGIN")"
[ -x "$LLAMA/bin/llama-bench" ] || { echo "no $LLAMA/bin/llama-bench: LLAMA_CPU=aarch64-$CLASS ../shared/scripts/build-llama-cpp.sh" >&2; exit 1; }
if [ -e /lib/ld-linux-aarch64.so.1 ]; then SYSROOT=/; else SYSROOT=/usr/aarch64-linux-gnu; fi
export CARGO_TARGET_DIR=${AARCH64_TARGET_DIR:-target/aarch64}
RUSTC=/usr/bin/rustc CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
  /usr/bin/cargo build --release --target aarch64-unknown-linux-gnu -p lone >&2
LONE=$CARGO_TARGET_DIR/aarch64-unknown-linux-gnu/release/lone
models=("$@")
[ ${#models[@]} -gt 0 ] || models=("${LONE_MODELS:-${XDG_CACHE_HOME:-$HOME/.cache}/lone/models}/SmolLM2-135M-Instruct.Q4_1.gguf")

count() { # [VAR=value...] command... → instructions (the variables go to the guest)
  local vars=()
  while [[ $1 == *=* ]]; do vars+=("$1"); shift; done
  env "${vars[@]}" qemu-aarch64 -L "$SYSROOT" -cpu "$CPU" -plugin "$PLUGIN" -d plugin "$@" \
    2>&1 >/dev/null | sed -n 's/.*total insns: \([0-9]*\).*/\1/p' | tail -1
}
ids() { seq -s, 100 $((99 + $1)); }
per() { python3 -c "print(f'{($1 - $2) / $3 / 1e6:.1f}')"; }

echo "| file | M instr / decoded token, lone \`auto\` | llama.cpp | ratio | M instr / prompt token, lone \`auto\` (exact) | lone \`--fast\` | llama.cpp | fast ratio |"
echo "|---|---|---|---|---|---|---|---|"
for m in "${models[@]}"; do
  l2=$(count "$LLAMA/bin/llama-bench" -m "$m" -t 1 -r 1 -p 0 -n 2 -o csv --no-warmup)
  l34=$(count "$LLAMA/bin/llama-bench" -m "$m" -t 1 -r 1 -p 0 -n 34 -o csv --no-warmup)
  p32=$(count "$LLAMA/bin/llama-bench" -m "$m" -t 1 -r 1 -p 32 -n 0 -o csv --no-warmup)
  p64=$(count "$LLAMA/bin/llama-bench" -m "$m" -t 1 -r 1 -p 64 -n 0 -o csv --no-warmup)
  ld=$(per "$l34" "$l2" 32); lp=$(per "$p64" "$p32" 32)
  run() { count "$1" "$LONE" run -m "$m" -t 1 --ignore-eos --prompt-ids "$(ids "$2")" -n "$3"; }
  d2=$(run LONE_EXACT=2 8 2); d34=$(run LONE_EXACT=2 8 34)
  q32=$(run LONE_EXACT=2 32 1); q64=$(run LONE_EXACT=2 64 1)
  f32=$(run LONE_EXACT=0 32 1); f64=$(run LONE_EXACT=0 64 1)
  od=$(per "$d34" "$d2" 32); op=$(per "$q64" "$q32" 32); of=$(per "$f64" "$f32" 32)
  ratio() { python3 -c "print(f'{$1/$2:.2f}×')"; }
  echo "| $(basename "$m" .gguf) | $od | $ld | $(ratio "$od" "$ld") | $op | $of | $lp | $(ratio "$of" "$lp") |"
done
