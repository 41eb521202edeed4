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
export PIP_DISABLE_PIP_VERSION_CHECK=1
.venv/bin/python -m pip install -q -r tools/requirements-dev.txt
.venv/bin/python -c "import llama_cpp, numpy, gguf; print('setup_dev: llama_cpp', llama_cpp.__version__, '| numpy', numpy.__version__)"
echo "setup_dev: activate with 'source .venv/bin/activate'"
