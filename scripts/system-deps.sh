#!/usr/bin/env bash
# Debian packages the test suite needs: an aarch64 cross compiler and qemu to run the
# NEON kernels, and Chromium for the web chat test. Installs only what is missing.
set -euo pipefail
need=()
command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
command -v chromium >/dev/null || need+=(chromium)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "installing ${need[*]} (Debian packages for the ARM kernel and web chat tests)"
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${need[@]}"
