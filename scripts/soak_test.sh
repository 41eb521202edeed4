#!/usr/bin/env bash
# Soak and connection-stress test of `peng serve` on loopback.
#
# Starts `peng serve` on a free loopback port, runs bench/soak.py (mixed good, bad and
# abandoned requests; every answer checked; RSS and KV blocks before/after) and then
# bench/conn_stress.py (a burst of simultaneous connections; 1,000 idle/slowloris
# connections held while a normal client streams and /health is timed) against it, stops
# it with SIGTERM (it must drain and exit 0), and exits non-zero if anything failed.
#
# Environment:
#   PENG_BIN            binary (default build/tools/peng)
#   PENG_SOAK_MODEL     model (default models/smollm2-135m-instruct-q4_1.gguf, from
#                       scripts/fetch_models.sh)
#   PENG_SOAK_THREADS   server compute threads (default 1: on a 2-core machine the other core
#                       runs the Python clients; a server thread that has to share a core
#                       with them stalls every batched step, ~3x slower overall)
#   SOAK_REQUESTS       soak.py requests (default 10000; CI can run fewer)
#   SOAK_CONCURRENCY    soak.py requests in flight (default 32)
#   STRESS_BURST        conn_stress.py burst connections (default 500; 0 skips)
#   STRESS_IDLE         conn_stress.py idle connections (default 1000; 0 skips)
#   STRESS_HOLD         seconds the idle connections are held (default 20)
#   SOAK_OUT            folder for soak.json, conn_stress.json and server.log (default out/soak)
# Python: the e2e virtual environment .venv-e2e (tests/e2e/requirements.txt, which has
# aiohttp), created here on first use like scripts/e2e_test.sh does.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

PENG_BIN=${PENG_BIN:-$PWD/build/tools/peng}
MODEL=${PENG_SOAK_MODEL:-models/smollm2-135m-instruct-q4_1.gguf}
THREADS=${PENG_SOAK_THREADS:-1}
SOAK_REQUESTS=${SOAK_REQUESTS:-10000}
SOAK_CONCURRENCY=${SOAK_CONCURRENCY:-32}
STRESS_BURST=${STRESS_BURST:-500}
STRESS_IDLE=${STRESS_IDLE:-1000}
STRESS_HOLD=${STRESS_HOLD:-20}
OUT=${SOAK_OUT:-out/soak}
MAX_BODY=1048576  # small, so that the oversize requests stay cheap

fail() { echo "soak_test.sh: $*" >&2; exit 1; }
[[ -x $PENG_BIN ]] || fail "$PENG_BIN not found; build the peng target first (scripts/build.sh)"
[[ -f $MODEL ]] || fail "$MODEL not found; run scripts/fetch_models.sh"

venv=.venv-e2e
if [[ ! -x $venv/bin/python ]] || ! cmp -s tests/e2e/requirements.txt $venv/.requirements; then
  python3 -m venv "$venv" || exit 1
  "$venv/bin/pip" install -q -r tests/e2e/requirements.txt || exit 1
  cp tests/e2e/requirements.txt "$venv/.requirements"
fi
py=$venv/bin/python

# 1,000+ sockets on each side: the server inherits this limit (its connection cap follows it).
need=$((STRESS_IDLE + STRESS_BURST + 1024))
hard=$(ulimit -Hn)
[[ $hard == unlimited ]] && hard=$((need * 2))
((hard >= need)) || fail "the open-file hard limit $hard is below the $need needed"
ulimit -n "$hard" || fail "cannot raise the open-file limit to $hard"

mkdir -p "$OUT" || exit 1
log=$OUT/server.log
"$PENG_BIN" serve "$MODEL" --host 127.0.0.1 --port 0 --threads "$THREADS" \
  --max-model-len 512 --max-body-bytes "$MAX_BODY" >"$log" 2>&1 &
pid=$!
trap 'kill -9 $pid 2>/dev/null' EXIT

port=
for _ in $(seq 1800); do  # 180 s
  port=$(grep -oP 'on http://127\.0\.0\.1:\K[0-9]+' "$log" | head -1)
  [[ -n $port ]] && break
  kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; fail "peng serve exited at start"; }
  sleep 0.1
done
[[ -n $port ]] || fail "peng serve did not report its port"
url=http://127.0.0.1:$port
"$py" - "$url" <<'EOF' || { cat "$log" >&2; fail "/health never answered 200"; }
import sys, time, urllib.request
deadline = time.monotonic() + 180
while time.monotonic() < deadline:
    try:
        if urllib.request.urlopen(sys.argv[1] + "/health", timeout=2).status == 200:
            sys.exit(0)
    except OSError:
        pass
    time.sleep(0.2)
sys.exit(1)
EOF
echo "soak_test.sh: peng serve (pid $pid) on $url; open-file limit $(ulimit -n)"

rc=0
echo "soak_test.sh: soak.py, $SOAK_REQUESTS requests, concurrency $SOAK_CONCURRENCY"
"$py" bench/soak.py --url "$url" --pid "$pid" --requests "$SOAK_REQUESTS" \
  --concurrency "$SOAK_CONCURRENCY" --max-body-bytes "$MAX_BODY" \
  --progress $(((SOAK_REQUESTS + 9) / 10)) --out "$OUT/soak.json" >/dev/null
soak_rc=$?
((soak_rc == 0)) || { echo "soak_test.sh: soak.py failed ($soak_rc), see $OUT/soak.json" >&2; rc=1; }
kill -0 "$pid" 2>/dev/null || fail "peng serve died during soak.py (see $log)"

echo "soak_test.sh: conn_stress.py, burst $STRESS_BURST, idle $STRESS_IDLE for ${STRESS_HOLD}s"
"$py" bench/conn_stress.py --url "$url" --burst "$STRESS_BURST" --idle "$STRESS_IDLE" \
  --hold "$STRESS_HOLD" --out "$OUT/conn_stress.json" >/dev/null
stress_rc=$?
((stress_rc == 0)) || {
  echo "soak_test.sh: conn_stress.py failed ($stress_rc), see $OUT/conn_stress.json" >&2; rc=1; }
kill -0 "$pid" 2>/dev/null || fail "peng serve died during conn_stress.py (see $log)"

# Idle by now: SIGTERM must drain at once and exit 0.
kill -TERM "$pid"
for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then
  echo "soak_test.sh: peng serve still running 60 s after SIGTERM" >&2
  rc=1
else
  wait "$pid"
  server_rc=$?
  ((server_rc == 0)) || { echo "soak_test.sh: peng serve exited with $server_rc" >&2; rc=1; }
fi

"$py" - "$OUT" <<'EOF' || true
import json, sys
out = sys.argv[1]
s = json.load(open(f"{out}/soak.json"))
print(f"soak: ok={s['ok']} {s['duration_s']} s, statuses {s['status_counts']}, "
      f"lost {s['lost_outputs']}, duplicated {s['duplicated_outputs']}, "
      f"RSS {s['server_before'].get('rss_kib')} -> {s['server_after'].get('rss_kib', {})}, "
      f"KV blocks {s['server_before']['kv_used_blocks']} -> {s['server_after']['kv_used_blocks']}; "
      f"problems {s['problems']}")
c = json.load(open(f"{out}/conn_stress.json"))
b, i = c.get("burst", {}), c.get("idle_hold", {})
print(f"conn_stress: ok={c['ok']} burst 200={b.get('ok_200')} 429={b.get('at_capacity_429')} "
      f"503={b.get('at_capacity_503')} errors={b.get('errors')}; idle opened={i.get('opened')} "
      f"stream={i.get('normal_stream')} health={i.get('health_during', {}).get('latency')}; "
      f"problems {c['problems']}")
EOF
((rc == 0)) && echo "soak_test.sh: passed" || echo "soak_test.sh: FAILED" >&2
exit $rc
