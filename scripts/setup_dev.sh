#!/usr/bin/env bash
# Creates .venv with the Python development tools from tools/requirements-dev.txt
# (llama-cpp-python and transformers as references, gguf, tokenizers, openai, matplotlib).
# Idempotent: reuses an existing .venv; pip skips what is already installed.
# llama-cpp-python builds from source (~10 min on 2 cores) the first time.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ ! -x .venv/bin/python ]]; then
  python3 -m venv .venv
fi
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
# llama-cpp-python's build: only the libraries we use (no llava/mtmd, tools, examples).
# Its native x86 build turns on AMX where the CPU reports it, and that path segfaults in
# VMs that do not grant AMX state (seen in ours); peng does not use AMX either, so the
# comparison stays fair without it. Set CMAKE_ARGS yourself to override all of this.
if [[ -z "${CMAKE_ARGS:-}" ]]; then
  CMAKE_ARGS="-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
  CMAKE_ARGS+=" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF"
  if [[ $(uname -m) == x86_64 ]]; then
    noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    # The quotes are for scikit-build-core, which splits CMAKE_ARGS like a shell.
    # shellcheck disable=SC2089,SC2090
    CMAKE_ARGS+=" '-DCMAKE_C_FLAGS=$noamx' '-DCMAKE_CXX_FLAGS=$noamx'"
  fi
  # shellcheck disable=SC2090
  export CMAKE_ARGS
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1
.venv/bin/python -m pip install -q -r tools/requirements-dev.txt
.venv/bin/python -c "import llama_cpp, numpy, gguf; print('setup_dev: llama_cpp', llama_cpp.__version__, '| numpy', numpy.__version__)"
echo "setup_dev: activate with 'source .venv/bin/activate'"
