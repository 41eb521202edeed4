#!/usr/bin/env bash
# Guest instructions executed per SmolLM2 decode step on each ARM64 kernel level, counted under
# qemu-aarch64 with a tiny TCG plugin (bench/arm64/insn_plugin.c), for docs/arm64.md: the speed
# of a real Kunpeng can't be measured on an x86 host, but the work each path does can.
#
# One decode step = count(peng generate -n 3) - count(peng generate -n 2): both runs load the
# model, prefill the same prompt and decode; the difference is exactly one more decode step
# (one token through the model + sampling). Prefill of 17 tokens = count(18-token prompt, -n 1)
# - count(1-token prompt, -n 1) (SmolLM2's tokenizer: "Hi" is 1 token, LONG 18; other models
# tokenize differently, so the number of prefill tokens is taken from `peng tokenize` and
# printed in the table header). Single-threaded (--threads 1: the plugin's counter is not
# atomic), greedy: the same binary gives the same counts on every run to within ~1e-7 (a few
# dozen instructions of timing-dependent code).
# Every level is forced with PENG_ISA under `-cpu max` (which supports all of them).
#
# Usage: bench/arm64_insn_count.sh   (after scripts/build_arm64.sh; prints a Markdown table)
#   BUILD_DIR (default build-arm64)   MODEL (default models/smollm2-135m-instruct-q4_1.gguf; the
#   K-quant kernels: MODEL=models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf ISAS="dotprod i8mm")
#   ISAS (default "scalar neon dotprod i8mm")
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${BUILD_DIR:-build-arm64}
MODEL=${MODEL:-models/smollm2-135m-instruct-q4_1.gguf}
ISAS=${ISAS:-scalar neon dotprod i8mm}
PENG=$BUILD_DIR/tools/peng
PLUGIN=$BUILD_DIR/insn_plugin.so
[[ -x $PENG ]] || { echo "arm64_insn_count: $PENG missing (scripts/build_arm64.sh)" >&2; exit 1; }
[[ -f $MODEL ]] || { echo "arm64_insn_count: $MODEL missing (scripts/fetch_models.sh)" >&2; exit 1; }
cc -O2 -Wall -shared -fPIC -o "$PLUGIN" bench/arm64/insn_plugin.c

SHORT="Hi"
LONG="The quick brown fox jumps over the lazy dog while the cat sleeps on the warm mat"

count() {  # count ISA MAX_TOKENS PROMPT -> guest instructions of the whole run
  local out
  out=$(PENG_ISA=$1 QEMU_CPU=max QEMU_LD_PREFIX=/ qemu-aarch64 -plugin "$PLUGIN" \
    "$PENG" generate -m "$MODEL" -p "$3" -n "$2" --temp 0 --ignore-eos --threads 1 --raw \
    -v 2>&1 >/dev/null)
  if ! grep -q "kernels: $1\$" <<<"$out"; then
    echo "arm64_insn_count: PENG_ISA=$1 was not used:" >&2
    echo "$out" >&2
    exit 1
  fi
  sed -n 's/^insn_count: //p' <<<"$out"
}

ntok() {  # ntok PROMPT -> number of prompt tokens (BOS included)
  local ids
  ids=$(QEMU_CPU=max QEMU_LD_PREFIX=/ qemu-aarch64 "$PENG" tokenize -m "$MODEL" --text "$1")
  tr -cd , <<<"$ids" | wc -c | awk '{print $1 + 1}'
}
n_prefill=$(( $(ntok "$LONG") - $(ntok "$SHORT") ))
first=${ISAS%% *}

echo "| level (PENG_ISA) | instructions / decode step | vs $first | prefill, $n_prefill tokens | vs $first |"
echo "|---|---:|---:|---:|---:|"
base_d="" base_p=""
for isa in $ISAS; do
  n2=$(count "$isa" 2 "$SHORT")
  n3=$(count "$isa" 3 "$SHORT")
  p1=$(count "$isa" 1 "$SHORT")
  p16=$(count "$isa" 1 "$LONG")
  d=$(( n3 - n2 )) p=$(( p16 - p1 ))
  [[ -n $base_d ]] || { base_d=$d; base_p=$p; }
  printf '| %s | %d | %.2fx less | %d | %.2fx less |\n' "$isa" "$d" \
    "$(bc -l <<<"$base_d / $d")" "$p" "$(bc -l <<<"$base_p / $p")"
done
