#!/usr/bin/env bash
# Run every test: fetches the default model once (tests use it), the Rust test suite (the C
# API's example included), the aarch64 suite, the Python wheel's tests, then the `lone serve`
# end-to-end tests with the official openai Python client.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-default-model.sh
# Everything is built once, with the workspace's features: the command, liblone (the C API's
# example links it), the Python module; the tests below reuse these builds (`-p` would resolve
# other features and build the crates again).
cargo build --workspace --release 2>&1
LONE_CAPI_LIB_DIR=$PWD/target/release cargo test --workspace --release 2>&1
# The model-level tests again on the other kernel families this CPU has (the kernel unit tests
# already cover every family; this catches the paths that only a whole model exercises).
isas="avx2 scalar"
# AVX-VNNI (Intel since Alder Lake, Zen 5) is its own family of 8-bit kernels.
if grep -qw avx_vnni /proc/cpuinfo 2>/dev/null; then isas="avxvnni $isas"; fi
for isa in $isas; do
  LONE_ISA=$isa cargo test --workspace --release --test parity --test cache --test lfm3_gguf \
    --test smollm2 --test sharded --test batch_invariance --test packed_memory --test speculative 2>&1
done
# The aarch64 suite under qemu: the kernels and the parity tests on the ARMv8.0, dotprod and
# i8mm CPU classes, 1 and 2 threads.
scripts/test-aarch64.sh
# The Python wheel (the `lone` command + module): built, installed into a fresh venv and tested
# from outside the tree; then the aarch64 wheel imported and run under qemu.
scripts/test-python.sh
scripts/test-python-aarch64.sh
# The web chat page's browser test needs Chromium and playwright-core: install them, and make
# their absence a failure rather than a skip.
scripts/install-browser.sh
LONE_REQUIRE_BROWSER=1 tests/serve/run.sh
# The deployment recipe (nginx + 3 replicas, one killed and restarted) and a two-minute soak
# (one minute of warm-up, one measured).
scripts/test-deploy.sh
python3 scripts/soak.py --minutes 2
