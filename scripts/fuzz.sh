#!/usr/bin/env bash
# The coverage-guided fuzz targets (fuzz/fuzz_targets/: GGUF reader, GGUF tokenizer, safetensors
# header, config.json, chat templates, request parsing) under libFuzzer via cargo-fuzz, on the
# stable toolchain (`-s none`: coverage instrumentation, no sanitizer).
#
#   scripts/fuzz.sh [--seconds N | --runs N] [TARGET...]     (default: 60 s each, every target)
#
# New corpus entries go to fuzz/corpus/TARGET (not committed); crashes, hangs (an input over
# 20 s) and out-of-memory (over 4 GiB) go to fuzz/artifacts/TARGET and fail the run.
# `cargo test` runs the same functions on stable without libFuzzer (crates/lone/tests/fuzz.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
limit=(-max_total_time=60)
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) limit=(-max_total_time="$2"); shift 2 ;;
    --runs) limit=(-runs="$2" -max_total_time=86400); shift 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(gguf gguf_tokenizer safetensors config chat_template openai_request embed_options image)
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
cd fuzz
cargo fuzz build -s none -O
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  extra=()
  [ "$t" = gguf ] && extra=(../tests/reference/fixtures/*/model-q8_0.gguf)
  # libFuzzer takes files as well as directories only with -seed_inputs.
  seed_files=""
  [ ${#extra[@]} -gt 0 ] && seed_files="-seed_inputs=$(IFS=,; echo "${extra[*]}")"
  echo "== $t"
  cargo fuzz run -s none -O "$t" "corpus/$t" "seeds/$t" -- "${limit[@]}" -timeout=20 -rss_limit_mb=4096 \
    -print_final_stats=1 $seed_files 2>&1 | grep -E "^(#[0-9]+ +DONE|Done|stat::number_of_executed_units|stat::peak_rss|==|SUMMARY|.*ERROR)" || true
  if ls "artifacts/$t"/* >/dev/null 2>&1; then
    echo "fuzz $t: failing inputs in fuzz/artifacts/$t" >&2
    exit 1
  fi
done
