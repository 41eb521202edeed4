#!/usr/bin/env bash
# Serving throughput, peng vs llama.cpp's server, one invocation, same model / threads /
# parallel slots / workload: for each concurrency C it starts `peng serve --max-num-seqs C`,
# runs `peng bench serve` (C concurrent streaming clients, 2*C requests), stops it, then does
# the same with `llama-server -np C` (bench/build_llama_server.sh builds it from the
# llama-cpp-python sdist), and repeats REPS times alternating the two. Prints output tokens/s
# (median over reps) and the ratio, and peng's KV fragmentation from /metrics.
# Usage: bench/serve_compare.sh [MODEL] [THREADS=2] [REPS=2] [CONCURRENCIES="16 32"]
# Env: INPUT_LEN (128), OUTPUT_LEN (64). Results: out/serve/*.json, out/serve/summary.txt.
# PEER=/path/to/another/peng compares two peng binaries instead (same flags for both), e.g.
# the build of an earlier commit: before/after a change to the server.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/smollm2-135m-instruct-q4_1.gguf}
THREADS=${2:-2}
REPS=${3:-2}
CONCS=${4:-"16 32"}
IN=${INPUT_LEN:-128}
OUT=${OUTPUT_LEN:-64}
PENG=build/tools/peng
LLAMA=out/llama.cpp/bin/llama-server
PEER=${PEER:-llama}
mkdir -p out/serve
if [[ $PEER == llama ]]; then
  [[ -x $LLAMA ]] || { echo "serve_compare: build llama-server first: bench/build_llama_server.sh" >&2; exit 1; }
else
  [[ -x $PEER ]] || { echo "serve_compare: PEER=$PEER is not an executable" >&2; exit 1; }
fi

wait_health() {  # url
  for _ in $(seq 1 240); do
    curl -sf "$1/health" > /dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "serve_compare: server at $1 did not become healthy" >&2
  return 1
}

next_port=18080
run_one() {  # engine conc rep
  local engine=$1 c=$2 rep=$3 port=$next_port pid
  next_port=$((next_port + 1))  # a fresh port each run: no waiting for the old socket
  local ctx=$(( c * (IN * 2 + OUT + 64) ))
  if [[ $engine == peng || $PEER != llama ]]; then
    local bin=$PENG
    [[ $engine == peng ]] || bin=$PEER
    "$bin" serve "$MODEL" --host 127.0.0.1 --port $port --threads "$THREADS" \
      --max-num-seqs "$c" --max-model-len $(( IN * 2 + OUT + 64 )) > "out/serve/$engine.log" 2>&1 &
  else
    "$LLAMA" -m "$MODEL" --host 127.0.0.1 --port $port -t "$THREADS" -tb "$THREADS" \
      -np "$c" -c $ctx --no-webui > out/serve/peer.log 2>&1 &
  fi
  pid=$!
  wait_health "http://127.0.0.1:$port"
  "$PENG" bench serve --url "http://127.0.0.1:$port" --num-prompts $(( 2 * c )) \
    --max-concurrency "$c" --request-rate inf --input-len "$IN" --output-len "$OUT" \
    --seed "$rep" --out "out/serve/${engine}_c${c}_r${rep}.json" > /dev/null
  if [[ $engine == peng ]]; then
    curl -s "http://127.0.0.1:$port/metrics" | grep -E '^peng_kv_cache_fragmentation_(mean|max)_perc' \
      > "out/serve/peng_c${c}_r${rep}.frag"
  fi
  kill -TERM $pid; wait $pid || true
}

for c in $CONCS; do
  for rep in $(seq 1 "$REPS"); do
    run_one peng "$c" "$rep"
    run_one peer "$c" "$rep"
  done
done

python3 - "$CONCS" "$REPS" "$PEER" <<'PY' | tee out/serve/summary.txt
import json, statistics, sys
concs, reps = sys.argv[1].split(), int(sys.argv[2])
peer = "llama.cpp" if sys.argv[3] == "llama" else "peer"
print(f"{'clients':>8} {'peng tok/s':>12} {peer + ' tok/s':>16} {'ratio':>7} {'peng TTFT p50':>14} {peer + ' TTFT p50':>15} {'peng frag mean/max':>20}")
for c in concs:
    def vals(e, key=lambda s: s["output_throughput"]):
        return [key(json.load(open(f"out/serve/{e}_c{c}_r{r}.json"))["summary"]) for r in range(1, reps + 1)]
    p, l = statistics.median(vals("peng")), statistics.median(vals("peer"))
    pt = statistics.median(vals("peng", lambda s: s["ttft_ms"]["median"]))
    lt = statistics.median(vals("peer", lambda s: s["ttft_ms"]["median"]))
    frag = []
    for r in range(1, reps + 1):
        kv = dict(line.split()[0].split("{")[0:1] + [float(line.split()[-1])] for line in open(f"out/serve/peng_c{c}_r{r}.frag"))
        frag.append((kv.get("peng_kv_cache_fragmentation_mean_perc", 0), kv.get("peng_kv_cache_fragmentation_max_perc", 0)))
    fm = max(f[0] for f in frag) * 100; fx = max(f[1] for f in frag) * 100
    print(f"{c:>8} {p:12.1f} {l:16.1f} {p / l:7.2f} {pt:12.0f}ms {lt:13.0f}ms {fm:9.2f}% /{fx:6.2f}%")
PY
