#!/usr/bin/env bash
# Failover test of the active-active deployment: nginx (deploy/nginx/peng.conf) in front of two
# `peng serve` replicas, on loopback.
#
# Renders the shipped nginx configuration for the test ports into a temporary folder, checks it
# with `nginx -t` (the test fails if that fails), starts nginx there (its own prefix, pid file
# and logs; stopped by the exit trap) and runs scripts/failover_load.py, which starts the two
# replicas, sends a steady mixed load (streaming and not) through nginx, SIGKILLs one replica
# in the middle of a stream and restarts it, then SIGTERMs one (drain) and restarts it, and
# checks: no failures other than the streams cut off on the killed replica, no hung request,
# every new request succeeds within 1 s of the kill, nothing at all fails during the drain,
# every restarted replica takes load again. See docs/operations.md.
#
# Environment:
#   PENG_BIN          binary (default build/tools/peng)
#   MODEL             model (default models/smollm2-135m-instruct-q4_1.gguf)
#   FAILOVER_SHORT=1  the short form for CI (also: --short): one kill and one drain with short
#                     steady periods, well under 2 minutes; the full form runs two rounds
#                     (each replica killed once and drained once) with longer ones, ~3 minutes
#   FAILOVER_OUT      write the JSON summary to this file
#   FAILOVER_PORT     nginx port (default 18000); the replicas use the next two
#   FAILOVER_THREADS  compute threads per replica (default 1; this machine has 2 cores)
#   FAILOVER_KEEP=1   keep the temporary folder (nginx and replica logs) even on success
#   FAILOVER_NGINX_CONF  the nginx configuration to render and test (default
#                     deploy/nginx/peng.conf; for trying a change before making it)
#   FAILOVER_ARGS     more scripts/failover_load.py options, e.g. "--events drain --rounds 10"
#                     (a drain stress test)
# Exit status: 0 pass, 1 a check failed, 2 setup error (no nginx, no binary, no model).
# Installs nothing: without nginx it says to run scripts/install_deps.sh and exits 2.
set -uo pipefail
# Paths given relative to where the script was started from stay valid after the cd.
for v in PENG_BIN MODEL FAILOVER_OUT FAILOVER_NGINX_CONF; do
  [[ -n ${!v:-} && ${!v} != /* ]] && printf -v "$v" '%s' "$PWD/${!v}"
done
cd "$(dirname "$0")/.." || exit 2

short=${FAILOVER_SHORT:-0}
for a in "$@"; do
  case $a in
    --short) short=1 ;;
    *) echo "usage: $0 [--short]" >&2; exit 2 ;;
  esac
done
PENG_BIN=${PENG_BIN:-$PWD/build/tools/peng}
MODEL=${MODEL:-models/smollm2-135m-instruct-q4_1.gguf}
PORT=${FAILOVER_PORT:-18000}
P1=$((PORT + 1))
P2=$((PORT + 2))
THREADS=${FAILOVER_THREADS:-1}
CONF=${FAILOVER_NGINX_CONF:-deploy/nginx/peng.conf}

fail() { echo "failover_test.sh: $*" >&2; exit 2; }
NGINX=$(command -v nginx || true)
[[ -z $NGINX && -x /usr/sbin/nginx ]] && NGINX=/usr/sbin/nginx  # not on a user's PATH
[[ -n $NGINX ]] || fail "nginx not found; run scripts/install_deps.sh (Debian package nginx)"
[[ -x $PENG_BIN ]] || fail "$PENG_BIN not found; build the peng target first (scripts/build.sh)"
[[ -f $MODEL ]] || fail "$MODEL not found; run scripts/fetch_models.sh"
for p in "$PORT" "$P1" "$P2"; do  # a clear message instead of a confusing failure later
  if ss -Htln "sport = :$p" 2>/dev/null | grep -q .; then
    fail "port $p is in use (FAILOVER_PORT picks other ports)"
  fi
done

tmp=$(mktemp -d /tmp/peng-failover.XXXXXX) || exit 2
chmod 755 "$tmp"  # nginx workers run as nobody when the master runs as root
mkdir -p "$tmp/logs" "$tmp/run" "$tmp/tmp"
cleanup() {
  local rc=$?
  if [[ -f $tmp/run/nginx.pid ]]; then
    local npid
    npid=$(cat "$tmp/run/nginx.pid")
    kill "$npid" 2>/dev/null  # SIGTERM: nginx's fast shutdown
    for _ in $(seq 50); do kill -0 "$npid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$npid" 2>/dev/null && kill -9 "$npid" 2>/dev/null
  fi
  for f in "$tmp"/replica-*.pid; do  # replicas the driver started and may have left behind
    [[ -f $f ]] || continue
    pid=$(cat "$f")
    if [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q " serve "; then
      kill -9 "$pid" 2>/dev/null
    fi
  done
  if [[ $rc -ne 0 || ${FAILOVER_KEEP:-0} == 1 ]]; then
    echo "failover_test.sh: logs kept in $tmp" >&2
  else
    rm -rf "$tmp"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The shipped configuration with the test's ports (the replica addresses and the listen port
# are the only changes; everything else is tested as shipped).
sed -e "s/server 127\.0\.0\.1:8001 /server 127.0.0.1:$P1 /" \
    -e "s/server 127\.0\.0\.1:8002 /server 127.0.0.1:$P2 /" \
    -e "s/^\( *\)listen 8000;/\1listen 127.0.0.1:$PORT;/" \
    "$CONF" >"$tmp/peng.conf" || exit 2
for want in "server 127.0.0.1:$P1 " "server 127.0.0.1:$P2 " "listen 127.0.0.1:$PORT;"; do
  grep -qF "$want" "$tmp/peng.conf" || fail "rendering $CONF: no '$want'"
done
echo "=== nginx -t ($NGINX, $CONF for ports $PORT -> $P1, $P2)"
"$NGINX" -t -p "$tmp/" -c "$tmp/peng.conf" || { echo "failover_test.sh: nginx -t failed" >&2; exit 1; }
"$NGINX" -p "$tmp/" -c "$tmp/peng.conf" || { echo "failover_test.sh: nginx did not start" >&2; exit 1; }
python3 - "http://127.0.0.1:$PORT/health" <<'EOF' || { echo "failover_test.sh: nginx /health never answered" >&2; exit 1; }
import sys, time, urllib.request
end = time.monotonic() + 10
while True:
    try:
        if urllib.request.urlopen(sys.argv[1], timeout=1).status == 200:
            sys.exit(0)
    except OSError:
        if time.monotonic() > end:
            sys.exit(1)
        time.sleep(0.1)
EOF

if [[ $short == 1 ]]; then
  opts=(--rounds 1 --steady 4 --down 2)
  echo "=== failover (short)"
else
  opts=(--rounds 2 --steady 15 --down 8)
  echo "=== failover (full)"
fi
python3 scripts/failover_load.py --url "http://127.0.0.1:$PORT" --peng "$PENG_BIN" \
  --model "$MODEL" --port "$P1" --port "$P2" --workdir "$tmp" --threads "$THREADS" \
  --nginx-error-log "$tmp/logs/error.log" --concurrency 4 --request-timeout 30 \
  --drain-timeout 30 --max-recovery 1.0 --max-takes-load 30 \
  ${FAILOVER_OUT:+--out "$FAILOVER_OUT"} "${opts[@]}" ${FAILOVER_ARGS:-}
rc=$?
if [[ $rc -ne 0 ]]; then
  echo "--- nginx error.log (last 20 lines)" >&2
  tail -n 20 "$tmp/logs/error.log" >&2
  for f in "$tmp"/replica-*.log; do
    echo "--- $f (last 10 lines)" >&2
    tail -n 10 "$f" >&2
  done
fi
exit "$rc"
