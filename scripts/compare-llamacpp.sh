#!/usr/bin/env bash
# lone vs llama.cpp on the same GGUF files, same threads, runs interleaved per model.
#
#   scripts/compare-llamacpp.sh [FILE.gguf | DIR]...     # default: every GGUF under $LONE_BENCH_MODELS
#
# Settings (environment):
#   THREADS=2  PROMPTS=128,512  GEN=64  REPS=3  ROUNDS=1   (ROUNDS > 1: lone, llama, lone, llama …)
#   LONE_REPS, LLAMA_REPS   per-engine repetitions (default REPS)
#   MODELS_FILTER=regex   only files whose path matches (e.g. 'LFM2-350M|Qwen2.5-0.5B')
#   DEPTH=N               run every test after N tokens of context (both engines' -d)
#   DATE=YYYY-MM-DD       names the output (default today)
#   FAMILY=native|avx2|avxvnni|both   kernel family: native = lone's best ISA against the
#                         native llama.cpp build; avx2 = LONE_ISA=avx2 against llama.cpp built
#                         with LLAMA_CPU=avx2 (~/.cache/llama.cpp-0c1e570-avx2, outputs named
#                         <date>-avx2); avxvnni = LONE_ISA=avxvnni (AVX2 + AVX-VNNI, an Intel
#                         laptop since Alder Lake) against llama.cpp built from the same tree with
#                         AVX-VNNI and no AVX-512 (~/.cache/llama.cpp-0c1e570-avxvnni: the avx2
#                         build's cmake flags with -DGGML_AVX_VNNI=ON); both = native then avx2
#   LONE=path/to/lone     (default: builds target/release/lone)
#   LLAMA_BENCH=path      (default: ~/.cache/llama.cpp-0c1e570/bin/llama-bench)
#   NICE=-10              run both engines under `nice -n $NICE` (root: a shared machine's other
#                         work then takes less of the CPU from the measured runs)
#
# For each file: `lone bench --json -t T -p P -n N -r R` then `llama-bench -m FILE -t T -p P -n N
# -r R -o json`, ROUNDS times. The machine's read bandwidth is measured with
# `lone bench --membw` (1 GiB, T threads) before and after. Outputs:
#   docs/perf/raw-<date>/            every raw output
#   docs/perf/results-<date>.json    merged (scripts/perf_report.py collect)
#   docs/perf/chart-<date>.svg and docs/perf/chart-latest.svg
#   the markdown table on stdout (and docs/perf/table-<date>.md)
set -euo pipefail
cd "$(dirname "$0")/.."

FAMILY="${FAMILY:-native}"
case "$FAMILY" in
  both) FAMILY=native "$0" "$@"; FAMILY=avx2 exec "$0" "$@" ;;
  native) SUFFIX="" ;;
  avx2)
    SUFFIX="-avx2"
    export LONE_ISA=avx2
    LLAMA_BENCH="${LLAMA_BENCH:-$HOME/.cache/llama.cpp-0c1e570-avx2/bin/llama-bench}" ;;
  avxvnni)
    SUFFIX="-avxvnni"
    export LONE_ISA=avxvnni
    LLAMA_BENCH="${LLAMA_BENCH:-$HOME/.cache/llama.cpp-0c1e570-avxvnni/bin/llama-bench}" ;;
  *) echo "FAMILY must be native, avx2, avxvnni or both" >&2; exit 2 ;;
esac

THREADS="${THREADS:-2}"
PROMPTS="${PROMPTS:-128,512}"
GEN="${GEN:-64}"
REPS="${REPS:-3}"
LONE_REPS="${LONE_REPS:-$REPS}"
LLAMA_REPS="${LLAMA_REPS:-$REPS}"
ROUNDS="${ROUNDS:-1}"
DEPTH="${DEPTH:-0}"
DATE="${DATE:-$(date +%F)}$SUFFIX"
ROOT="${LONE_BENCH_MODELS:-$HOME/.cache/lone/bench}"
LLAMA_BENCH="${LLAMA_BENCH:-$HOME/.cache/llama.cpp-0c1e570/bin/llama-bench}"
PY="${PYTHON:-python3}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"

if [ -z "${LONE:-}" ]; then
  cargo build --release -q -p lone
  LONE="$CARGO_TARGET_DIR/release/lone"
fi
[ -x "$LLAMA_BENCH" ] || { echo "no llama-bench at $LLAMA_BENCH (run ../shared/scripts/build-llama-cpp.sh)" >&2; exit 1; }

# The files, in a stable order.
args=("$@"); [ ${#args[@]} -gt 0 ] || args=("$ROOT")
files=()
for a in "${args[@]}"; do
  if [ -d "$a" ]; then
    while IFS= read -r f; do files+=("$f"); done < <(find "$a" -name '*.gguf' | sort)
  elif [ -f "$a" ]; then files+=("$a")
  else echo "no such file or directory: $a" >&2; exit 1; fi
done
if [ -n "${MODELS_FILTER:-}" ]; then
  kept=(); for f in "${files[@]}"; do [[ "$f" =~ $MODELS_FILTER ]] && kept+=("$f"); done; files=("${kept[@]}")
fi
[ ${#files[@]} -gt 0 ] || { echo "no GGUF files (make them with scripts/make-bench-models.sh)" >&2; exit 1; }

TIME=""; [ -x /usr/bin/time ] && TIME="/usr/bin/time -f LLAMA_TIME_WALL=%e,CPU=%U+%S"
PRIO=(); [ -n "${NICE:-}" ] && PRIO=(nice -n "$NICE")
RAW="docs/perf/raw-$DATE"
rm -rf "$RAW"; mkdir -p "$RAW"
step() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# Machine and settings.
"$PY" - "$RAW/machine.json" "$THREADS" "$PROMPTS" "$GEN" "$LONE_REPS,$LLAMA_REPS" "$ROUNDS" "$DATE" "$LLAMA_BENCH" <<'EOF'
import json, subprocess, sys
out, threads, prompts, gen, reps, rounds, date, lb = sys.argv[1:]
lone_reps, llama_reps = (int(x) for x in reps.split(","))
def sh(*c):
    try:
        p = subprocess.run(c, capture_output=True, text=True, timeout=30)
        return (p.stdout.strip() or p.stderr.strip())
    except Exception: return ""
ls = {}
for line in sh("lscpu").splitlines():
    k, _, v = line.partition(":")
    ls[k.strip()] = v.strip()
keys = ["Architecture", "Model name", "Vendor ID", "CPU family", "Model", "CPU(s)", "Thread(s) per core",
        "Core(s) per socket", "Hypervisor vendor", "L1d cache", "L2 cache", "L3 cache"]
flags = ls.get("Flags", "").split()
mem = next((l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemTotal")), "0")
json.dump({"date": date, "cpu": ls.get("Model name", "?"), "threads": int(threads),
           "lscpu": {k: ls[k] for k in keys if k in ls},
           "simd": [f for f in flags if f.startswith(("avx", "fma", "f16c", "amx"))],
           "mem_total_gib": round(int(mem) / 2**20, 1), "kernel": sh("uname", "-r"),
           "lone_git": sh("git", "rev-parse", "--short", "HEAD") + ("-dirty" if sh("git", "status", "--porcelain", "--untracked-files=no") else ""),
           "llama_bench": lb, "llama_cpp_version": " ".join(sh(lb, "--version").split("\n")[:2]),
           "nice": __import__("os").environ.get("NICE"), "settings": {"prompts": prompts, "gen": gen, "lone_reps": lone_reps, "llama_reps": llama_reps,
                        "rounds": int(rounds)}},
          open(out, "w"), indent=1)
EOF

T0=$(date +%s)
step "read bandwidth ($THREADS threads)"
"${PRIO[@]}" "$LONE" bench --membw --threads "$THREADS" --json > "$RAW/membw-before.jsonl"
for f in "${files[@]}"; do
  base=$(basename "$f" .gguf)
  model="${base%-*}"; quant="${base##*-}"   # <model>-<QUANT>.gguf, e.g. LFM2-350M-Q4_K_M
  tag="${model}__${quant}"
  for r in $(seq 1 "$ROUNDS"); do
    t=$(date +%s)
    "${PRIO[@]}" "$LONE" bench --model "$f" --threads "$THREADS" -p "$PROMPTS" -n "$GEN" -d "$DEPTH" -r "$LONE_REPS" --json \
      > "$RAW/$tag.lone.$r.jsonl" 2> "$RAW/$tag.lone.$r.err" || { step "lone failed on $f"; cat "$RAW/$tag.lone.$r.err" >&2; }
    t2=$(date +%s)
    # /usr/bin/time: the whole process's CPU share, to compare with lone's cpu_s / wall_s.
    cat /proc/loadavg > "$RAW/$tag.llama.$r.load"
    "${PRIO[@]}" $TIME "$LLAMA_BENCH" -m "$f" -t "$THREADS" -p "$PROMPTS" -n "$GEN" -d "$DEPTH" -r "$LLAMA_REPS" -o json \
      > "$RAW/$tag.llama.$r.json" 2> "$RAW/$tag.llama.$r.err" || { step "llama-bench failed on $f"; tail -5 "$RAW/$tag.llama.$r.err" >&2; }
    step "$model $quant round $r: lone $((t2 - t)) s, llama.cpp $(( $(date +%s) - t2 )) s"
  done
done
"${PRIO[@]}" "$LONE" bench --membw --threads "$THREADS" --json > "$RAW/membw-after.jsonl"

OUTJ="docs/perf/results-$DATE.json"
"$PY" scripts/perf_report.py collect "$RAW" "$OUTJ" >&2
"$PY" scripts/perf_report.py chart "$OUTJ" "docs/perf/chart-$DATE.svg" >&2
cp "docs/perf/chart-$DATE.svg" docs/perf/chart-latest.svg
"$PY" scripts/perf_report.py table "$OUTJ" | tee "docs/perf/table-$DATE.md"
step "done in $(( $(date +%s) - T0 )) s"
