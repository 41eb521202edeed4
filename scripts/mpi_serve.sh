#!/usr/bin/env bash
# Runs `peng serve|generate|bench ARGS...` as an MPI job on this host: mpirun -np T*P*D peng
# ARGS... -tp T -pp P -dp D (T = PENG_TP, default 2; P = PENG_PP, D = PENG_DP, default 1);
# other subcommands run directly. A drop-in PENG_BIN for the e2e tests (scripts/e2e_test.sh) and a
# template for a service: SIGTERM / SIGINT to this script become SIGUSR1 to mpirun, which
# forwards it to every rank -- rank 0 drains gracefully (a second one stops it at once), the
# other ranks end with it. (SIGTERM straight to mpirun would kill the job at once.)
#   PENG_TP       tensor-parallel size (default 2)
#   PENG_PP       pipeline-parallel size (default 1)
#   PENG_DP       data-parallel size (default 1)
#   PENG_EP       non-empty: --enable-expert-parallel (MoE models: experts over all the ranks)
#   PENG_MPIRUN_ARGS  extra mpirun arguments (default: --oversubscribe --mca mpi_yield_when_idle 1)
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
peng=${PENG_REAL_BIN:-$here/build/tools/peng}
tp=${PENG_TP:-2}
pp=${PENG_PP:-1}
dp=${PENG_DP:-1}
case ${1:-} in
  serve|generate|bench) ;;
  *) exec "$peng" "$@" ;;  # tokenize, top, ...: one process
esac
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# shellcheck disable=SC2086
mpirun -np $((tp * pp * dp)) ${PENG_MPIRUN_ARGS:---oversubscribe --mca mpi_yield_when_idle 1} \
  "$peng" "$@" --tensor-parallel-size "$tp" --pipeline-parallel-size "$pp" \
  --data-parallel-size "$dp" \
  ${PENG_EP:+--enable-expert-parallel} &
pid=$!
trap 'kill -USR1 "$pid" 2>/dev/null' TERM INT
# If this script is SIGKILLed, mpirun would be orphaned: a watchdog then ends the job
# (SIGTERM to mpirun kills every rank).
me=$$
( while kill -0 "$me" 2>/dev/null; do sleep 0.5; done
  kill -TERM "$pid" 2>/dev/null; sleep 5; kill -KILL "$pid" 2>/dev/null ) </dev/null >/dev/null 2>&1 &
while :; do
  wait "$pid"
  rc=$?
  kill -0 "$pid" 2>/dev/null || exit "$rc"  # else: wait was interrupted by a trapped signal
done
