#!/usr/bin/env bash
# Multi-host tensor parallelism over TCP, with network namespaces as the hosts.
#
# Builds a small virtual cluster on this machine, all of it in network namespaces (the root
# namespace's network is not touched):
#
#   peng-sw     a "switch": one Linux bridge, one port per host
#   peng-head   the login node, 10.77.0.254: mpirun runs here and places no rank here
#   peng-h0..   the compute hosts, 10.77.0.1, 10.77.0.2, ...: one veth each into the switch
#
# mpirun (in peng-head) reads a hostfile that names the hosts by IP address and starts one orted
# per host through its rsh launcher, pointed at a generated agent script instead of ssh: the
# agent gets "HOST COMMAND..." and runs `ip netns exec peng-hK sh -c COMMAND` for the namespace
# of that address. The orted daemons, and under them the ranks, so run inside the host
# namespaces: rank K in peng-hK (checked first with a probe job that prints each rank's
# `ip netns identify`). MPI traffic is restricted to TCP on the 10.77.0.0/24 network:
#   --mca pml ob1                        (not UCX, which could pick shared memory by itself)
#   --mca btl tcp,self                   (no vader/shared memory between ranks)
#   --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24
#   --mca plm_rsh_agent AGENT --mca plm_rsh_no_tree_spawn 1
#
# For each model it then runs `peng generate -tp N --temp 0 --ignore-eos` across the hosts,
# the same on one host (plain `mpirun -np N` in the root namespace, shared memory allowed) and
# in one process, and checks:
#   - the greedy text across hosts is identical to the one-host tp=N text (same split, same
#     arithmetic; a difference fails the test),
#   - the veth byte counters grew by at least the payload the collectives must move per
#     generated token (all-reduces of the hidden state: 2 per layer + the embedding, and the
#     gather of the vocabulary-parallel logits on rank 0), measured as the difference between an
#     -n TOKENS run and an -n 1 run, so start-up and prompt traffic cancel out.
# It reports whether the text also equals the single-process text (not a failure: the default
# quantized-activation mode can break near-ties differently when the matmuls are split).
# Prints the wall times, the veth bytes per generated token and the expected lower bound.
#
# Usage: scripts/multihost_test.sh [--ci] [--hosts N] [--model GGUF]... [-n TOKENS]
#                                  [--prompt TEXT] [--keep] [--spin]
#   --ci        short form: Qwen2.5-Coder-0.5B only, 16 tokens (~6 s here); the full form runs
#               Qwen2.5-Coder-0.5B and Gemma-3-270M with 64 tokens (~20 s)
#   --hosts N   hosts = ranks = tensor-parallel size (default 2); a model whose attention heads
#               do not split N ways is skipped
#   --model     model to run (repeatable; replaces the default list)
#   --keep      leave the namespaces and the temporary folder in place (for inspection:
#               `ip netns`, `ip -n peng-h0 -s link`); the next run removes them first
#   --spin      let waiting ranks busy-poll (Open MPI's default) instead of passing
#               --mca mpi_yield_when_idle 1 to both tp runs (see below: on a small shared
#               machine spinning ranks starve each other and the network stack)
# Environment: PENG_BIN (default build/tools/peng), MULTIHOST_THREADS (threads per rank,
# default 1), MULTIHOST_TIMEOUT (seconds per mpirun, default 600), MULTIHOST_MPI_ARGS (more
# mpirun options for the runs across the hosts, e.g. "--mca mpi_yield_when_idle 1").
# Exit status: 0 pass, 1 a check failed, 2 setup error (not root, no namespaces, no mpirun,
# no binary or model). Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN for `ip netns`), iproute2
# with bridge and veth support, Open MPI 4.x. Idempotent: a run first removes what an earlier
# (interrupted or --keep) run left, under a lock so two runs cannot share the namespaces.
set -uo pipefail
[[ -n ${PENG_BIN:-} && $PENG_BIN != /* ]] && PENG_BIN=$PWD/$PENG_BIN
args=()
for a in "$@"; do args+=("$a"); done
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD

ci=0 hosts=2 keep=0 spin=0 ntok="" prompt="" models=()
set -- "${args[@]+"${args[@]}"}"
while (($#)); do
  case $1 in
    --ci) ci=1 ;;
    --hosts) hosts=$2; shift ;;
    --model) m=$2; [[ $m != /* ]] && m=$OLDPWD/$m; models+=("$m"); shift ;;
    -n) ntok=$2; shift ;;
    --prompt) prompt=$2; shift ;;
    --keep) keep=1 ;;
    --spin) spin=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "multihost: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
PENG=${PENG_BIN:-$ROOT/build/tools/peng}
THREADS=${MULTIHOST_THREADS:-1}
TIMEOUT=${MULTIHOST_TIMEOUT:-600}
if ((${#models[@]} == 0)); then
  models=("$ROOT/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
  ((ci)) || models+=("$ROOT/models/gemma-3-270m-q4_k_m.gguf")
fi
[[ -n $ntok ]] || { ((ci)) && ntok=16 || ntok=64; }
[[ -n $prompt ]] || prompt="Write a Python function that returns the n-th Fibonacci number."
if ! [[ $hosts =~ ^[0-9]+$ ]] || ((hosts < 2 || hosts > 200)); then
  echo "multihost: --hosts must be 2..200" >&2; exit 2
fi
((ntok >= 2)) || { echo "multihost: -n must be at least 2" >&2; exit 2; }

SUBNET=10.77.0.0/24
HEAD_IP=10.77.0.254
host_ip() { echo "10.77.0.$(($1 + 1))"; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# --- setup checks
die() { echo "multihost: $*" >&2; exit 2; }
((EUID == 0)) || die "needs root (ip netns add needs CAP_SYS_ADMIN and CAP_NET_ADMIN)"
for c in ip mpirun orted flock timeout; do
  command -v $c >/dev/null || die "$c not found (scripts/install_deps.sh installs Open MPI)"
done
[[ -x $PENG ]] || die "no binary $PENG (scripts/build.sh)"
for m in "${models[@]}"; do [[ -f $m ]] || die "no model $m (scripts/fetch_models.sh)"; done

exec 9>/run/lock/peng-multihost.lock 2>/dev/null || exec 9>/tmp/peng-multihost.lock
flock -w 600 9 || die "another multihost_test.sh holds the lock"

# --- the cluster
NAMESPACES=()
for ((k = 0; k < hosts; k++)); do NAMESPACES+=("peng-h$k"); done
NAMESPACES+=(peng-head peng-sw)

remove_cluster() {  # everything any run of this script may have left, any host count
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^peng-(h[0-9]+|head|sw)$/ {print $1}'); do
    # orted / peng processes left in a namespace (an interrupted run) keep it alive
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null; done
    ip netns del "$ns" 2>/dev/null
  done
}
TMP="" CHILD=""
cleanup() {
  local rc=$?
  if [[ -n $CHILD ]]; then  # interrupted during a run: timeout passes the TERM on to mpirun
    kill -TERM "$CHILD" 2>/dev/null
    wait "$CHILD" 2>/dev/null
  fi
  if ((keep)); then
    echo "multihost: --keep: namespaces ${NAMESPACES[*]} and $TMP left in place"
  else
    remove_cluster
    [[ -n $TMP ]] && rm -rf "$TMP"
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

remove_cluster
rm -rf /tmp/peng-multihost.??????  # what --keep or a killed run left (we hold the lock)
TMP=$(mktemp -d /tmp/peng-multihost.XXXXXX)

step() {  # run a setup command; on failure say exactly which one and why
  local out
  if ! out=$("$@" 2>&1); then
    echo "multihost: setup failed: $*" >&2
    echo "  $out" >&2
    die "cannot build the namespace cluster here (see above)"
  fi
}
for ns in "${NAMESPACES[@]}"; do
  step ip netns add "$ns"
  step ip -n "$ns" link set lo up
done
step ip -n peng-sw link add br0 type bridge
step ip -n peng-sw link set br0 up
attach() {  # attach NAMESPACE IP PORTNAME: veth0 in NAMESPACE, its peer a switch port
  step ip link add veth0 netns "$1" type veth peer name "$3" netns peng-sw
  step ip -n peng-sw link set "$3" master br0
  step ip -n peng-sw link set "$3" up
  step ip -n "$1" addr add "$2/24" dev veth0
  step ip -n "$1" link set veth0 up
}
for ((k = 0; k < hosts; k++)); do attach "peng-h$k" "$(host_ip $k)" "p$k"; done
attach peng-head "$HEAD_IP" phead

# The rsh agent: "[-options] HOST COMMAND..." -> the command in HOST's namespace, through a shell
# (as ssh would run it: Open MPI quotes the orted arguments for a remote shell). Two things make
# a namespace behave like a separate machine, not just a separate network:
# - its own TMPDIR: all namespaces share the file system and the host name, so the daemons would
#   share Open MPI's session directory /tmp/ompi.HOSTNAME.UID/jf.FAMILY/ and two orteds
#   creating it at the same moment can lose the mkdir race ("A call to mkdir was unable to
#   create the desired directory ... File exists", orte_session_dir failed; about 1 launch in
#   40 here). The ranks inherit it from their orted.
# - the orted stays in the foreground (--daemonize dropped, as with an ssh session that stays
#   open): a daemon that dies at start-up then fails mpirun at once instead of leaving it
#   waiting for a daemon that never calls back; its stderr goes to orted.HOST.log.
AGENT=$TMP/netns_agent.sh
# shellcheck disable=SC2016  # the agent's own variables
{
  echo '#!/bin/sh'
  echo 'while [ $# -gt 0 ]; do case $1 in -*) shift ;; *) break ;; esac; done'
  echo 'host=$1; shift'
  echo 'case $host in'
  for ((k = 0; k < hosts; k++)); do echo "  $(host_ip $k)) ns=peng-h$k ;;"; done
  echo '  *) echo "netns_agent: unknown host $host" >&2; exit 255 ;;'
  echo 'esac'
  echo "TMPDIR=$TMP/tmp-\$ns; export TMPDIR; mkdir -p \"\$TMPDIR\""
  echo 'cmd=$(printf "%s" "$*" | sed "s/ --daemonize / /")'
  echo "echo \"\$host -> \$ns: \$cmd\" >> $TMP/agent.log"
  echo "exec ip netns exec \"\$ns\" sh -c \"\$cmd\" 2>> $TMP/orted.\$host.log"
} > "$AGENT"
chmod +x "$AGENT"
HOSTFILE=$TMP/hostfile
for ((k = 0; k < hosts; k++)); do echo "$(host_ip $k) slots=1"; done > "$HOSTFILE"

# shellcheck disable=SC2054  # tcp,self is one argument
MPI_MULTI=(mpirun --hostfile "$HOSTFILE" -np "$hosts" --map-by node
  --mca plm_rsh_agent "$AGENT" --mca plm_rsh_no_tree_spawn 1
  --mca pml ob1 --mca btl tcp,self
  --mca btl_tcp_if_include "$SUBNET" --mca oob_tcp_if_include "$SUBNET")
# Waiting ranks yield the CPU: this machine's namespaces share its few cores with the kernel's
# network processing (and with whatever else runs), and a rank that spins while it waits for the
# other one's packets can hold a core for a whole scheduler tick (4 ms at HZ=250) per message.
# --spin keeps Open MPI's default (busy polling) to see that.
YIELD=()
((spin)) || YIELD=(--mca mpi_yield_when_idle 1)
# shellcheck disable=SC2206  # more mpirun options, split on spaces
MPI_MULTI+=("${YIELD[@]+"${YIELD[@]}"}" ${MULTIHOST_MPI_ARGS:-})
# mpirun itself runs on the login node
mkdir -p "$TMP/tmp-peng-head"
MULTI=(env "TMPDIR=$TMP/tmp-peng-head" timeout "$TIMEOUT" ip netns exec peng-head "${MPI_MULTI[@]}")
# run OUT ERR COMMAND...: in the background and wait, so that an INT or TERM stops the script
# at once (the trap ends the run) instead of after the command
run() {
  local out=$1 err=$2 rc
  shift 2
  "$@" > "$out" 2> "$err" &
  CHILD=$!
  wait "$CHILD"
  rc=$?
  CHILD=""
  return $rc
}

# Byte counters: the sum of what every namespace's veth sent (each frame is sent once, so this
# is the traffic on the switch), and what the compute hosts alone sent (rank <-> rank, plus the
# daemons' control traffic to the login node).
counter() { ip netns exec "$1" cat "/sys/class/net/veth0/statistics/$2" 2>/dev/null || echo 0; }
wire_bytes() {  # prints: all-namespaces-tx hosts-tx
  local k all=0 h=0 t
  for ((k = 0; k < hosts; k++)); do t=$(counter "peng-h$k" tx_bytes); h=$((h + t)); done
  all=$((h + $(counter peng-head tx_bytes)))
  echo "$all $h"
}

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
gen_tokens() { sed -n 's/.*generation: \([0-9]*\) tokens.*/\1/p' "$1" | tail -1; }
tok_rate() { sed -n 's/.*generation: [0-9]* tokens in \([0-9.]*\) s (\([0-9.]*\) tok\/s).*/\1 s, \2 tok\/s/p' "$1" | tail -1; }
show_err() {  # a failed run's stderr, and what the orted daemons wrote
  local f
  for f in "$1" "$TMP"/orted.*.log; do
    [[ -s $f ]] || continue
    echo "--- $f (last lines):"
    tail -n 15 "$f" | sed 's/^/    /'
  done
}

echo "multihost: $hosts hosts: $(for ((k = 0; k < hosts; k++)); do printf 'peng-h%d=%s ' $k "$(host_ip $k)"; done)"
echo "multihost: login node peng-head=$HEAD_IP (mpirun), switch peng-sw (bridge br0)"

# --- placement probe: every rank in its own host's namespace
probe=$TMP/probe.txt
# shellcheck disable=SC2016  # expanded by the ranks' shells
if ! run "$probe" "$TMP/probe.err" "${MULTI[@]}" sh -c 'echo "$OMPI_COMM_WORLD_RANK $(ip netns identify $$)"'; then
  show_err "$TMP/probe.err"
  echo "multihost: FAIL: the probe job did not run across the namespaces" >&2
  exit 1
fi
fail=0
for ((k = 0; k < hosts; k++)); do
  got=$(awk -v k=$k '$1 == k { print $2 }' "$probe")
  if [[ $got == "peng-h$k" ]]; then
    echo "multihost: rank $k runs in $got (orted started by the agent: $(grep -c "^$(host_ip $k) -> " "$TMP/agent.log") launch)"
  else
    echo "multihost: FAIL: rank $k runs in '${got:-?}', not peng-h$k" >&2
    fail=1
  fi
done
((fail)) && exit 1

# --- per model
summary=()
for model in "${models[@]}"; do
  name=$(basename "$model" .gguf)
  info=$("$PENG" info -m "$model" 2>&1 | grep '^model:')
  L=$(sed -n 's/.* layers=\([0-9]*\).*/\1/p' <<<"$info")
  D=$(sed -n 's/.* hidden=\([0-9]*\).*/\1/p' <<<"$info")
  H=$(sed -n 's/.* heads=\([0-9]*\)\/.*/\1/p' <<<"$info")
  V=$(sed -n 's/.* vocab=\([0-9]*\).*/\1/p' <<<"$info")
  [[ -n $L && -n $D && -n $H && -n $V ]] || die "cannot read the configuration of $model: $info"
  echo
  mode="ranks yield when idle"
  ((spin)) && mode="ranks spin when idle"
  echo "=== $name: layers=$L hidden=$D heads=$H vocab=$V, tp=$hosts, $ntok tokens," \
    "$THREADS thread(s) per rank, $mode"
  if ((H % hosts != 0)); then
    echo "multihost: skipped: $H attention heads do not split $hosts ways"
    summary+=("$name: skipped ($H heads, tp=$hosts)")
    continue
  fi
  GEN=("$PENG" generate -m "$model" -p "$prompt" --temp 0 --ignore-eos -t "$THREADS")
  out=$TMP/$name

  # across the hosts: -n 1 (start-up + prompt + 1 token), then -n ntok
  read -r a1 _ < <(wire_bytes)
  run "$out.multi1.txt" "$out.multi1.err" "${MULTI[@]}" "${GEN[@]}" -n 1 -tp "$hosts" ||
    { show_err "$out.multi1.err"; echo "multihost: FAIL: the 1-token run across the hosts failed" >&2; exit 1; }
  read -r a2 h2 < <(wire_bytes)
  t0=$(now)
  run "$out.multi.txt" "$out.multi.err" "${MULTI[@]}" "${GEN[@]}" -n "$ntok" -tp "$hosts" ||
    { show_err "$out.multi.err"; echo "multihost: FAIL: the run across the hosts failed" >&2; exit 1; }
  t1=$(now)
  read -r a3 h3 < <(wire_bytes)

  # one host: plain mpirun in the root namespace (shared memory allowed)
  over=()
  ((hosts > $(nproc))) && over=(--oversubscribe)
  t2=$(now)
  run "$out.local.txt" "$out.local.err" timeout "$TIMEOUT" mpirun -np "$hosts" \
    "${over[@]+"${over[@]}"}" "${YIELD[@]+"${YIELD[@]}"}" "${GEN[@]}" -n "$ntok" -tp "$hosts" ||
    { show_err "$out.local.err"; echo "multihost: FAIL: the one-host tp=$hosts run failed" >&2; exit 1; }
  t3=$(now)
  # one process
  run "$out.single.txt" "$out.single.err" timeout "$TIMEOUT" "${GEN[@]}" -n "$ntok" ||
    { show_err "$out.single.err"; echo "multihost: FAIL: the single-process run failed" >&2; exit 1; }
  t4=$(now)

  n_multi=$(gen_tokens "$out.multi.err") n_one=$(gen_tokens "$out.multi1.err")
  if [[ -z $n_multi || -z $n_one ]] || ((n_multi <= n_one)); then
    echo "multihost: FAIL: cannot read the generated token counts" >&2; exit 1
  fi
  run_all=$((a3 - a2)) run_hosts=$((h3 - h2)) one_all=$((a2 - a1))
  per_tok=$(((run_all - one_all) / (n_multi - n_one)))
  # the payload the collectives must move per decode token, summed over all ranks' sends:
  # all-reduce of D floats (2 per layer + the embedding) >= 2 (tp - 1) D 4 bytes,
  # gather of the logits on rank 0 (tp - 1 slices of ceil(V / tp) floats) = (tp - 1) ceil(V / tp) 4.
  S=$(((V + hosts - 1) / hosts))
  expect=$(((2 * L + 1) * 2 * (hosts - 1) * D * 4 + (hosts - 1) * S * 4))

  echo "--- across $hosts hosts (tp=$hosts, TCP over veth):"
  cat "$out.multi.txt"; echo
  echo "--- one host (mpirun -np $hosts, tp=$hosts):"
  cat "$out.local.txt"; echo
  echo "--- one process:"
  cat "$out.single.txt"; echo
  echo "---"
  echo "wall time: across hosts $(secs "$t0" "$t1") s (generation $(tok_rate "$out.multi.err"));" \
    "one host tp=$hosts $(secs "$t2" "$t3") s ($(tok_rate "$out.local.err"));" \
    "one process $(secs "$t3" "$t4") s ($(tok_rate "$out.single.err"))"
  echo "veth bytes, -n $ntok run: $run_all on the switch ($run_hosts sent by the compute hosts)," \
    "$((run_all / n_multi)) per generated token"
  echo "veth bytes, -n 1 run: $one_all"
  ratio=$(awk -v a="$per_tok" -v b="$expect" 'BEGIN { printf "%.3f", a / b }')
  echo "veth bytes per decode token ((-n $ntok) - (-n 1)) / $((n_multi - n_one)): $per_tok;" \
    "collective payload lower bound $expect (${ratio}x)"
  ok=1
  if cmp -s "$out.multi.txt" "$out.local.txt"; then
    echo "tokens: across hosts == one host (tp=$hosts): IDENTICAL"
  else
    echo "tokens: across hosts != one host (tp=$hosts): DIFFERENT  <- FAIL" >&2
    ok=0
  fi
  if cmp -s "$out.multi.txt" "$out.single.txt"; then
    single="equal to"
  else
    single="differs from"
  fi
  echo "tokens: across hosts $single the single-process text (informational)"
  if ((per_tok < expect)); then
    echo "veth: FAIL: $per_tok bytes per token is less than the $expect the collectives must move: the ranks did not talk over the veth" >&2
    ok=0
  fi
  ((ok)) || fail=1
  summary+=("$name: $( ((ok)) && echo PASS || echo FAIL ), across-hosts $(secs "$t0" "$t1") s, $per_tok veth B/token (>= $expect), single-process text $single")
done

echo
echo "=== summary (tp=$hosts over $hosts namespaces, $ntok tokens)"
printf '  %s\n' "${summary[@]}"
if ((fail)); then
  echo "multihost: FAIL"
  exit 1
fi
echo "multihost: PASS"
