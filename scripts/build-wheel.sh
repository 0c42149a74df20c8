#!/usr/bin/env bash
# Build the `lone` wheel into DIR (default: dist/): the `lone` command and the `lone` Python
# module, abi3 (CPython >= 3.9), for this machine (x86_64) or, with TARGET=aarch64, for
# 64-bit ARM Linux (cross-built as scripts/test-aarch64.sh builds: Debian's rustc-web with
# its arm64 standard library, gcc-aarch64-linux-gnu). maturin comes from PyPI into a cached
# venv.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-dist}")
tools="${XDG_CACHE_HOME:-$HOME/.cache}/lone/maturin-venv"
if [ ! -x "$tools/bin/maturin" ]; then
  python3 -m venv "$tools"
  "$tools/bin/pip" install -q 'maturin>=1.5,<2'
fi
case "${TARGET:-native}" in
  native)
    "$tools/bin/maturin" build --release -m crates/lone-py/Cargo.toml -o "$out"
    ;;
  aarch64)
    scripts/install-aarch64-toolchain.sh
    # Stripped anyway (pyproject.toml), and nothing here is shared with another build: no
    # debug info to compile and link. (The native wheel keeps the profile, whose dependency
    # builds the workspace's share.)
    CARGO_PROFILE_RELEASE_DEBUG=false PATH=/usr/bin:$PATH RUSTC=/usr/bin/rustc CARGO=/usr/bin/cargo \
      CARGO_TARGET_DIR=target/aarch64 \
      CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
      "$tools/bin/maturin" build --release -m crates/lone-py/Cargo.toml \
        --target aarch64-unknown-linux-gnu -o "$out"
    ;;
  *) echo "TARGET must be native or aarch64" >&2; exit 2 ;;
esac
