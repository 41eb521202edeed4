#!/usr/bin/env bash
# Configures and builds peng (Release, Ninja) into build/.
# Usage: scripts/build.sh [extra cmake -D options...]
#   BUILD_DIR  build folder (default: build)
#   JOBS       parallel jobs (default: nproc)
#   TARGETS    space-separated targets to build (default: all), e.g. TARGETS=peng
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
if [[ -n "${TARGETS:-}" ]]; then
  # shellcheck disable=SC2086
  cmake --build "$BUILD_DIR" -j"$JOBS" --target $TARGETS
else
  cmake --build "$BUILD_DIR" -j"$JOBS"
fi
