#!/usr/bin/env bash
# Debian packages the test suite needs: an aarch64 cross compiler and qemu to run the
# NEON kernels, Chromium for the web chat test, and Open MPI, iproute2 and ping for the
# tensor-parallel tests (ranks under mpirun, boards in network namespaces). Installs only what is missing.
set -euo pipefail
need=()
command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
command -v chromium >/dev/null || need+=(chromium)
command -v mpirun >/dev/null || need+=(openmpi-bin)
command -v ip >/dev/null || need+=(iproute2)
command -v ping >/dev/null || need+=(iputils-ping)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
echo "installing ${need[*]} (Debian packages for the ARM kernel, web chat and tensor-parallel tests)"
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${need[@]}"
