#!/usr/bin/env bash
# Install what cross-building and running lone for aarch64 needs, when it is missing: Debian's
# rustc-web with its arm64 standard library, the cross gcc and libc, qemu-user.
set -euo pipefail
need=()
[ -x /usr/bin/rustc ] && /usr/bin/rustc --print target-libdir --target aarch64-unknown-linux-gnu \
  >/dev/null 2>&1 && [ -d "$(/usr/bin/rustc --print target-libdir --target aarch64-unknown-linux-gnu)" ] \
  || need+=(rustc-web cargo-web libstd-rust-web-dev:arm64)
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

