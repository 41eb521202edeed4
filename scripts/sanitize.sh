#!/usr/bin/env bash
# The test suite under AddressSanitizer, LeakSanitizer and UndefinedBehaviorSanitizer: every
# ctest test of a build without nvcc and MPI -- the engine, kernels, models, server, tools and
# the golden checks, and the CUDA backend's kernels as the CUDA emulator runs them. For the
# kernels this is what compute-sanitizer's memcheck would find on a GPU -- a read or write past
# a device allocation (cudaMalloc is the host allocator there, with ASan's redzone right after
# the bytes asked for) -- and what ptxas never reports: signed overflow of the index arithmetic,
# shifts past the width, misaligned scalar loads. (The emulator itself reports misaligned vector
# loads, in every build.)
# Usage: scripts/sanitize.sh [ctest arguments]
#   scripts/sanitize.sh                              everything (~12 min to build, ~20 to run)
#   scripts/sanitize.sh -R 'Cuda|cuda_emulator'      the emulator's tests only
# The server end to end, sanitized (after a run of this script; a report lands in the log file):
#   ASAN_OPTIONS=log_path=/tmp/asan UBSAN_OPTIONS=log_path=/tmp/ubsan \
#     PENG_BIN=$PWD/build-sanitize/tools/peng bash scripts/e2e_test.sh
# Configures build-sanitize (clang, -O3, PENG_SANITIZE=address,undefined; override the folder
# with PENG_SANITIZE_BUILD), builds it and runs ctest there; any sanitizer report fails its test
# and the script. Not part of scripts/test.sh, which it would double: run it after changing a
# kernel or the memory handling of the engine (docs/devices.md, docs/benchmarks.md).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
build="${PENG_SANITIZE_BUILD:-$root/build-sanitize}"
cxx="$(command -v clang++-14 || command -v clang++)"
cc="$(command -v clang-14 || command -v clang)"

# clang: GCC 12 at -O3 checks a thread_local's address (the emulator's blockIdx) for null and
# alignment with the flags of an earlier comparison, and reports a null pointer that is not.
# (-Wno-pass-failed: clang cannot unroll some of the kernels' `#pragma unroll` loops here.)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_CXX_FLAGS="-fno-sanitize-recover=all -Wno-pass-failed" -DPENG_SANITIZE=address,undefined \
  -DPENG_CUDA=OFF -DPENG_MPI=OFF -DPENG_BUILD_TESTS=ON -DPENG_BUILD_BENCH=ON >/dev/null
cmake --build "$build" -j"${PENG_SANITIZE_BUILD_JOBS:-$(nproc)}"

export PENG_SOURCE_DIR="$root"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
ctest --test-dir "$build" -j"$(nproc)" --output-on-failure "$@"
echo "sanitize.sh: every test passed, no sanitizer report"
