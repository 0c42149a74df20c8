#!/usr/bin/env bash
# Image encoding time, lone against llama.cpp's llama-mtmd-cli on the same GGUF pair and image,
# interleaved (lone default, lone --exact, llama.cpp in each round), 2 threads.
#
#   LLAMA_BIN=~/.cache/llama.cpp-0c1e570/build/bin ROUNDS=3 scripts/compare-vision.sh TEXT.gguf MMPROJ.gguf IMAGE
#
# The pair: python scripts/make-vl-bench-model.py DIR, then llama.cpp's convert_hf_to_gguf.py DIR
# (text; tests/reference/generate.py --convert handles the fixture tokenizer) and --mmproj.
set -euo pipefail
text=$1 mmproj=$2 image=$3
lone=${LONE:-target/release/lone}
bin=${LLAMA_BIN:?set LLAMA_BIN to the llama.cpp bin directory with llama-mtmd-cli}
rounds=${ROUNDS:-3}
"$lone" bench --membw 2>&1 | tail -1
for r in $(seq "$rounds"); do
  a=$("$lone" run -m "$text" --mmproj "$mmproj" --chat --image "$image" -p "Describe." -n 1 -t 2 2>&1 |
    grep -o "encoded in [0-9]* ms" | grep -o "[0-9]*")
  e=$("$lone" run --exact -m "$text" --mmproj "$mmproj" --chat --image "$image" -p "Describe." -n 1 -t 2 2>&1 |
    grep -o "encoded in [0-9]* ms" | grep -o "[0-9]*")
  b=$("$bin/llama-mtmd-cli" -m "$text" --mmproj "$mmproj" --image "$image" -p "Describe." -n 1 -t 2 --temp 0 2>&1 |
    grep -o "encoding done in [0-9]* ms" | grep -o "[0-9]*")
  echo "round $r: lone ${a} ms, lone --exact ${e} ms, llama.cpp ${b} ms"
done
"$lone" bench --membw 2>&1 | tail -1
