#!/usr/bin/env bash
# Builds llama.cpp's own OpenAI-compatible server (llama-server, with parallel slots) from the
# llama.cpp sources vendored in the llama-cpp-python sdist -- the same llama.cpp version the
# rest of the benchmarks use (llama-cpp-python's Python server has no parallel slots).
# The sdist is fetched from PyPI; nothing is committed. Output: out/llama.cpp/bin/llama-server.
# Usage: bench/build_llama_server.sh [VERSION=0.3.36]
set -euo pipefail
cd "$(dirname "$0")/.."
ver=${1:-0.3.36}
work=out/llama.cpp
mkdir -p "$work"
if [[ ! -d $work/src/vendor/llama.cpp ]]; then
  python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$ver" -d "$work"
  mkdir -p "$work/src"
  tar xzf "$work/llama_cpp_python-$ver.tar.gz" -C "$work/src" --strip-components=1
fi
flags=""
# Same as scripts/setup_dev.sh: AMX off (its path crashes in some VMs), native otherwise.
if grep -q amx_tile /proc/cpuinfo 2>/dev/null; then
  flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
fi
cmake -S "$work/src/vendor/llama.cpp" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" > "$work/cmake.log"
cmake --build "$work/build" --target llama-server llama-bench -j"$(nproc)"
mkdir -p "$work/bin"
cp "$work/build/bin/llama-server" "$work/build/bin/llama-bench" "$work/bin/"
echo "build_llama_server: $work/bin/llama-server"
