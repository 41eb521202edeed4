#!/usr/bin/env bash
# Cross-builds peng (engine, server, tools, tests) for aarch64 into build-arm64/ with Debian 12's
# g++-aarch64-linux-gnu and multiarch :arm64 -dev packages (installed here, idempotently), so
# the ARM64 kernels and tests can run under qemu-aarch64 (scripts/test_arm64.sh, docs/arm64.md).
# On a real ARM64 host (Kunpeng, Graviton) use plain scripts/build.sh instead.
# Usage: scripts/build_arm64.sh [extra cmake -D options...]
#   BUILD_DIR  build folder (default: build-arm64)
#   JOBS       parallel jobs (default: nproc)
#   TARGETS    space-separated targets to build (default: all)
#   PENG_ARM64_NO_DEPS=1  skip the package check/installation
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build-arm64}
JOBS=${JOBS:-$(nproc)}

install_deps() {
  # Host tools + the arm64 variants of every -dev package the project links. The header-only
  # ones (nlohmann-json3-dev, libcli11-dev: Architecture all) come from scripts/install_deps.sh.
  local packages=(
    g++-aarch64-linux-gnu qemu-user cmake ninja-build pkg-config
    nlohmann-json3-dev libcli11-dev
    libc6-dev:arm64 libstdc++-12-dev:arm64
    libpcre2-dev:arm64 libxxhash-dev:arm64 libboost-dev:arm64
    libcpp-httplib-dev:arm64 libssl-dev:arm64 zlib1g-dev:arm64 libbrotli-dev:arm64
    libgtest-dev:arm64 libgmock-dev:arm64
  )
  local missing=() pkg status
  for pkg in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
    [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
  done
  if [[ ${#missing[@]} -eq 0 ]]; then
    echo "build_arm64: all ${#packages[@]} cross packages already installed"
    return 0
  fi
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "build_arm64: need root or sudo" >&2; exit 1; }
    sudo=(sudo)
  fi
  echo "build_arm64: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    "${sudo[@]}" dpkg --add-architecture arm64
  fi
  "${sudo[@]}" apt-get update -q
  "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
}

[[ "${PENG_ARM64_NO_DEPS:-0}" == 1 ]] || install_deps
[[ "${1:-}" == --deps-only ]] && exit 0

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/toolchain-aarch64.cmake" -DPENG_BUILD_BENCH=OFF \
  -DPENG_MPI=OFF "$@"  # no :arm64 Open MPI in the sysroot
if [[ -n "${TARGETS:-}" ]]; then
  # shellcheck disable=SC2086
  cmake --build "$BUILD_DIR" -j"$JOBS" --target $TARGETS
else
  cmake --build "$BUILD_DIR" -j"$JOBS"
fi
