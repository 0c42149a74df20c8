#!/usr/bin/env bash
# The aarch64 test suite under qemu-user: cross-builds lone-core's tests for
# aarch64-unknown-linux-gnu and runs the library tests (kernels against the scalar reference
# at every level, the thread pool, the vector ops: on `max`, which has every level, with 2
# threads), the parity tests (the f32 path against transformers' fixtures) and the fixtures'
# fast-mode and cache tests on three CPU classes, with 1 and 2 threads:
#   cortex-a72  ARMv8.0 NEON                 (Raspberry Pi 4)
#   cortex-a76  ARMv8.2 + dotprod + fp16     (Raspberry Pi 5, Apple M1, Snapdragon 8 Gen 1)
#   max         + i8mm, bf16, SVE            (Apple M2 and later, Graviton 3/4)
# Installs what it needs (Debian's rustc-web with its arm64 std, the cross gcc, qemu-user) when
# it is missing. `AARCH64_CPUS` / `AARCH64_THREADS` narrow the matrix; extra arguments go to
# every test binary (a test-name filter, say).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-aarch64-toolchain.sh

# The arm64 std package pulls in Debian's multiarch libc6:arm64, whose ld.so lives at
# /lib/ld-linux-aarch64.so.1. Run against that glibc as a whole: `-L /usr/aarch64-linux-gnu`
# would pair the cross package's ld.so with the multiarch libc.so.6 (two builds of glibc 2.36
# whose private `_rtld_global` layouts differ), and the first pthread_create then loops
# forever walking a stack-cache list it reads at the wrong offset.
if [ -e /lib/ld-linux-aarch64.so.1 ]; then SYSROOT=/; else SYSROOT=/usr/aarch64-linux-gnu; fi

export RUSTC=/usr/bin/rustc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
# Its own target folder: Debian's rustc is not the rustup one, and sharing one would rebuild
# the host's dependencies on every switch.
export CARGO_TARGET_DIR=${AARCH64_TARGET_DIR:-target/aarch64}
CARGO=/usr/bin/cargo

build() {
  "$CARGO" test --release --target aarch64-unknown-linux-gnu -p lone-core --lib "${tests[@]}" \
    --no-run --message-format=json 2>/dev/null |
    python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])'
}
# Model-level tests on the random-weight fixtures (seconds under qemu): parity (the f32 path
# against transformers), the default and fast modes' 8-bit decode and head copy (fast_mode),
# cached and chunked prefixes giving the cold logits (cache), and the default mode's same
# answer for one request however it is batched, cached, chunked or speculated
# (batch_invariance's `the_same_request_gives_the_same_answer`, with 2 threads; the default
# model on `max` only).
tests=(--test parity --test fast_mode --test cache --test batch_invariance)
"$CARGO" test --release --target aarch64-unknown-linux-gnu -p lone-core --lib "${tests[@]}" --no-run
mapfile -t bins < <(build)
[ ${#bins[@]} -eq 5 ] || { echo "expected 5 test binaries, got: ${bins[*]}" >&2; exit 1; }

cpus=${AARCH64_CPUS:-"cortex-a72 cortex-a76 max"}
threads=${AARCH64_THREADS:-"1 2"}
for cpu in $cpus; do
  for t in $threads; do
    for bin in "${bins[@]}"; do
      name=$(basename "$bin" | sed 's/-[0-9a-f]*$//')
      # Library tests: the kernels (every ISA level this CPU has, against the scalar
      # reference), the pool, the vector ops; the model-level tests above, whole.
      filter=()
      if [ "$name" = lone_core ]; then
        # The kernel tests loop over every level the CPU has: `max` has them all (NEON,
        # dotprod, i8mm), so the other classes would only repeat a subset; with 2 threads
        # (the pool's split of rows) unless the matrix was narrowed to other CPUs.
        if [ "$cpu" != max ] && [[ " $cpus " == *" max "* ]]; then continue; fi
        [ "$t" = 2 ] || [[ " $threads " != *" 2 "* ]] || continue
        filter=(kernels::)
      fi
      models=all
      if [ "$name" = batch_invariance ]; then
        [ "$t" = 2 ] || continue
        filter=(the_same_request_gives_the_same_answer)
        # The default model (SmolLM2, most of the time under qemu) on the i8mm class only,
        # whose kernels for several rows cover every legacy format; the fixtures everywhere.
        [ "$cpu" = max ] || models=fixtures
      fi
      echo "== aarch64 $cpu, $t thread(s): $name"
      LONE_TEST_MODELS=$models LONE_THREADS=$t RUST_TEST_THREADS=$t timeout 1200 \
        qemu-aarch64 -L "$SYSROOT" -cpu "$cpu" "$bin" "${filter[@]}" "$@"
    done
  done
done
