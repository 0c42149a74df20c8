#!/usr/bin/env bash
# The aarch64 wheel under qemu: cross-build it (scripts/build-wheel.sh with TARGET=aarch64),
# fetch Debian's arm64 CPython 3.11 (its .debs unpacked into a cache folder: it cannot be
# installed beside the host's), pip-install the wheel for it, and run
# tests/python/aarch64_smoke.py with it on qemu's cortex-a76 class: the module imports, the
# `lone` command answers, and two tiny fixtures' f32 paths equal transformers'.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
scripts/install-aarch64-toolchain.sh
work=$(mktemp -d "${TMPDIR:-/tmp}/lone-pyarm.XXXXXX")
trap 'rm -rf "$work"' EXIT
TARGET=aarch64 scripts/build-wheel.sh "$work/dist" >&2

py="${XDG_CACHE_HOME:-$HOME/.cache}/lone/python-arm64"
if [ ! -x "$py/usr/bin/python3.11" ]; then
  mkdir -p "$py.debs"
  (cd "$py.debs" && apt-get download -q python3.11-minimal:arm64 libpython3.11-minimal:arm64 \
    libpython3.11-stdlib:arm64 libexpat1:arm64 zlib1g:arm64 libffi8:arm64 2>/dev/null)
  for d in "$py.debs"/*.deb; do dpkg -x "$d" "$py"; done
  rm -rf "$py.debs"
fi
# pip installs the wheel for the arm64 interpreter (its tags checked: manylinux aarch64,
# abi3 for CPython 3.11); Debian's minimal arm64 Python has no pip of its own.
site="$work/site"
python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-deps --target "$site" \
  --platform manylinux_2_34_aarch64 --python-version 3.11 --implementation cp \
  --only-binary=:all: "$work"/dist/lone-*aarch64*.whl
# As in scripts/test-aarch64.sh: Debian's multiarch arm64 glibc when it is there.
if [ -e /lib/ld-linux-aarch64.so.1 ]; then sysroot=/; else sysroot=/usr/aarch64-linux-gnu; fi
libs="$py/lib/aarch64-linux-gnu:$py/usr/lib/aarch64-linux-gnu"
cd "$work"
out=$(qemu-aarch64 -cpu cortex-a76 -L "$sysroot" -E "LD_LIBRARY_PATH=$libs" -E "PYTHONHOME=$py/usr" \
  -E "PYTHONPATH=$site" -E PYTHONDONTWRITEBYTECODE=1 \
  "$py/usr/bin/python3.11" "$root/tests/python/aarch64_smoke.py" \
  "$root/tests/reference/fixtures" qwen2 lfm2_a)
echo "$out"
grep -qx ok <<<"$out" && grep -qx "lone $(grep -m1 '^version' "$root/Cargo.toml" | cut -d'"' -f2)" <<<"$out" \
  || { echo "the aarch64 wheel's smoke test did not finish" >&2; exit 1; }
