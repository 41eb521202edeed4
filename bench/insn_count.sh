#!/usr/bin/env bash
# A deterministic work counter for CI: instructions executed by the model's forward passes
# (valgrind --tool=callgrind, collection toggled on Model::Forward only) for a fixed tiny
# run of SmolLM2 on one thread -- the prefill of a fixed prompt, and per decode step (the
# difference between 1 and 9 generated tokens, over 8). Unlike a timing, the count does not
# move with the load on a shared machine, so a kernel or model change that makes a decode
# step do more work is caught exactly.
#
# Usage: bench/insn_count.sh [--update] [--tolerance PCT]
#   Compares with bench/insn_baseline.json and exits 1 when a count grew by more than
#   PCT percent (default 2); --update writes the measured counts as the new baseline.
#   PENG_BIN (default build/tools/peng), MODEL (default models/smollm2-135m-instruct-q4_1.gguf).
#
# valgrind 3.19 does not implement AVX-512, so the counts are of the AVX2 kernels
# (PENG_ISA=avx2); they stand for the shared code (model, scheduler-free forward, activation
# quantization, attention) and the AVX2 kernels.
set -euo pipefail
cd "$(dirname "$0")/.."

UPDATE=0
TOL=2
while [[ $# -gt 0 ]]; do
  case "$1" in
    --update) UPDATE=1 ;;
    --tolerance) TOL=$2; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "insn_count: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
PENG_BIN=${PENG_BIN:-build/tools/peng}
MODEL=${MODEL:-models/smollm2-135m-instruct-q4_1.gguf}
BASELINE=bench/insn_baseline.json
command -v valgrind > /dev/null || { echo "insn_count: valgrind not installed (scripts/install_deps.sh)" >&2; exit 2; }
[[ -x $PENG_BIN ]] || { echo "insn_count: $PENG_BIN not found" >&2; exit 2; }
[[ -f $MODEL ]] || { echo "insn_count: $MODEL not found (scripts/fetch_models.sh)" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
PROMPT="The capital of France is"

count() {  # count N: instructions in Forward for a run generating N tokens, into $tmp/n.N
  PENG_ISA=avx2 valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$1" \
    --toggle-collect='peng::*Model::Forward*' \
    "$PENG_BIN" generate -m "$MODEL" -p "$PROMPT" -n "$1" -t 1 --temp 0 --ignore-eos \
    > "$tmp/log.$1" 2>&1 || { cat "$tmp/log.$1" >&2; return 1; }
  sed -n 's/^summary: //p' "$tmp/cg.$1" > "$tmp/n.$1"
}

# The two runs (one thread each) side by side.
count 1 & first=$!
count 9 & second=$!
wait "$first" || exit 1
wait "$second" || exit 1
prefill=$(cat "$tmp/n.1")
nine=$(cat "$tmp/n.9")
decode=$(( (nine - prefill) / 8 ))
echo "insn_count: $(basename "$MODEL"), AVX2, 1 thread: prefill of \"$PROMPT\" $prefill instructions; one decode step $decode"

exec python3 - "$BASELINE" "$(basename "$MODEL")" "$prefill" "$decode" "$UPDATE" "$TOL" <<'PY'
import json, os, sys
path, model, prefill, decode, update, tol = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1", float(sys.argv[6])
base = json.load(open(path)) if os.path.exists(path) else {}
now = {"isa": "avx2", "threads": 1, "prefill_instructions": prefill, "decode_step_instructions": decode}
if update:
    base[model] = now
    with open(path, "w") as f:
        json.dump(base, f, indent=2)
        f.write("\n")
    print(f"insn_count: baseline written to {path}")
    sys.exit(0)
if model not in base:
    print(f"insn_count: no baseline for {model} in {path} (run with --update)")
    sys.exit(1)
bad = False
for key in ("prefill_instructions", "decode_step_instructions"):
    old, new = base[model][key], now[key]
    change = 100.0 * (new - old) / old
    verdict = "ok"
    if change > tol:
        verdict, bad = f"REGRESSION (more than {tol}% more work)", True
    elif change < -tol:
        verdict = "improved: update the baseline with --update"
    print(f"insn_count: {key}: {old} -> {new} ({change:+.2f}%) {verdict}")
sys.exit(1 if bad else 0)
PY
