#!/usr/bin/env bash
# The CUDA backend's kernels, run by the CUDA emulator, under AddressSanitizer and
# UndefinedBehaviorSanitizer: what compute-sanitizer's memcheck would find on a GPU -- a kernel
# reading or writing past a device allocation (cudaMalloc is the host allocator there, with
# ASan's redzones right after the bytes asked for) -- and what ptxas never reports: signed
# overflow of the kernels' index arithmetic, shifts past the width, misaligned scalar loads.
# (The emulator itself reports misaligned vector loads, in every build.)
# Usage: scripts/sanitize_emulator.sh [gtest filter, default: all of cuda_emulator_test]
# Configures build-sanitize (clang, -O3, PENG_SANITIZE=address,undefined, no nvcc, no MPI; override
# the folder with PENG_SANITIZE_BUILD), builds the emulator's tests and runs them: the
# emulator's self test, then cuda_emulator_test (about 7 minutes on 2 cores, most of it the two
# graph tests; PENG_EMULATOR_MODELS=all adds the trained models, many minutes each). The first
# sanitizer report ends the run with a non-zero exit. Not part of scripts/test.sh (the build
# alone is ~1000 CPU-seconds); run it after changing a kernel (docs/devices.md).
set -euo pipefail

filter="${1:-*}"
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
cmake --build "$build" --target cuda_emulator_self_test cuda_emulator_test make_deepseek_gguf \
  -j"${PENG_SANITIZE_BUILD_JOBS:-$(nproc)}"

export PENG_SOURCE_DIR="$root"
# (detect_leaks: the emulator keeps one runner a thread, as a GPU context lives to the end.)
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=0:halt_on_error=1:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
"$build/tests/cuda_emulator_self_test"
"$build/tests/cuda_emulator_test" --gtest_filter="$filter"
echo "sanitize_emulator.sh: no sanitizer report"
