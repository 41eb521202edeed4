#!/usr/bin/env bash
# A tensor-parallel job whose worker rank dies ends as a whole, within seconds, with a non-zero
# status -- never a half-alive server that hangs its clients. Starts
# `mpirun -np 2 peng serve MODEL -tp 2`, waits for /health, SIGKILLs rank 1, then checks that
# mpirun exits (non-zero) within 15 s, that rank 0 is gone, and that an in-flight streaming
# request ends (connection closed) instead of hanging.
# Usage: kill_rank_test.sh PENG_BIN SOURCE_DIR
set -uo pipefail
peng=$1
src=$2
model=${PENG_MODELS_DIR:-$src/models}/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
if [[ ! -f $model ]]; then
  echo "kill_rank_test: $model not found; skipped"
  exit 0
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
log=$(mktemp)
trap 'rm -f "$log"; [[ -n ${job:-} ]] && kill -9 "$job" 2>/dev/null' EXIT
mpirun -np 2 --oversubscribe --mca mpi_yield_when_idle 1 "$peng" serve "$model" --host 127.0.0.1 \
  --port 0 --threads 1 --max-model-len 512 -tp 2 >"$log" 2>&1 &
job=$!
port=""
for _ in $(seq 1 600); do
  port=$(sed -n 's/.*on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$log" | head -1)
  [[ -n $port ]] && curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  sleep 0.2
done
[[ -n $port ]] || { echo "FAIL: the server did not start"; cat "$log"; exit 1; }
rank_pid() {  # the pid of rank $1 of this job
  local p
  for p in $(pgrep -f "$peng serve"); do
    tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && echo "$p"
  done | head -1
}
r0=$(rank_pid 0)
r1=$(rank_pid 1)
[[ -n $r0 && -n $r1 ]] || { echo "FAIL: ranks not found (0: '$r0', 1: '$r1')"; exit 1; }
# A long streaming request in flight when the rank dies.
curl -sN -m 60 "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "Once upon a time", "max_tokens": 400, "stream": true, "ignore_eos": true}' \
  >/dev/null 2>&1 &
client=$!
sleep 1
t0=$(date +%s.%N)
kill -9 "$r1"
for _ in $(seq 1 150); do
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$job" 2>/dev/null; then
  echo "FAIL: mpirun still running 15 s after rank 1 was killed"
  cat "$log"
  exit 1
fi
wait "$job"
rc=$?
job=""
secs=$(echo "$(date +%s.%N) - $t0" | bc)
for _ in $(seq 1 100); do kill -0 "$r0" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$r0" 2>/dev/null; then echo "FAIL: rank 0 ($r0) survived"; exit 1; fi
secs_all=$(echo "$(date +%s.%N) - $t0" | bc)
if [[ $rc -eq 0 ]]; then echo "FAIL: mpirun exited 0"; cat "$log"; exit 1; fi
for _ in $(seq 1 50); do kill -0 "$client" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$client" 2>/dev/null; then echo "FAIL: the streaming client still hangs"; exit 1; fi
echo "kill_rank_test: PASS: mpirun ended ${secs}s and rank 0 ${secs_all}s after rank 1 was killed (mpirun status $rc)"
grep -m2 -iE "rank|exited|signal" "$log" | sed 's/^/  log: /'
