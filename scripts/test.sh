#!/usr/bin/env bash
# Sets up everything and runs the whole test suite (what CI runs through .ci/run):
# Debian packages, Release build with tests, all three models, ctest, the OpenAI e2e suite
# (with schemathesis) on two models and through the device path (--device host), under MPI
# (tensor / data / expert parallel), a short soak and connection stress, the failover test
# behind nginx, the ARM64 cross build under qemu, the instruction-count work counter, a short
# fuzz run.
# Exits non-zero when any step fails; the last line is a one-line summary.
# BUILD_DIR (default build) is passed on to scripts/build.sh.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

start=$(date +%s)
failed=()

step() {  # step NAME COMMAND... : runs a step, records a failure, keeps going
  local name=$1; shift
  echo "=== test.sh: $name"
  local t0=$(date +%s) rc=0
  "$@" || rc=$?
  echo "=== test.sh: $name took $(( $(date +%s) - t0 ))s"
  if [[ $rc -ne 0 ]]; then
    echo "=== test.sh: $name FAILED" >&2
    failed+=("$name")
    return 1
  fi
}

summary() {
  local secs=$(( $(date +%s) - start ))
  if [[ ${#failed[@]} -eq 0 ]]; then
    echo "test.sh: PASS (${secs}s)"
    exit 0
  fi
  echo "test.sh: FAIL: ${failed[*]} (${secs}s)"
  exit 1
}

# Without packages, a build or models nothing after them can run.
step deps bash scripts/install_deps.sh || summary
step build bash scripts/build.sh -DPENG_BUILD_TESTS=ON || summary
step models bash scripts/fetch_models.sh || summary

step ctest ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j2
step e2e env PENG_BIN="$PWD/${BUILD_DIR:-build}/tools/peng" bash scripts/e2e_test.sh
step e2e-deepseek env PENG_BIN="$PWD/${BUILD_DIR:-build}/tools/peng" \
  PENG_E2E_MODEL="$PWD/tests/data/deepseek_tiny/serve" bash scripts/e2e_test.sh
# The device path end to end (--device host: the device graph and its KV cache behind the
# server -- batching, n > 1 copy-on-write, preemption, streams, grammars' masks on the device;
# the way --device cuda serves): SmolLM2 and the DeepSeek-V2 fixture.
step e2e-device env PENG_BIN="$PWD/${BUILD_DIR:-build}/tools/peng" PENG_E2E_SERVE_ARGS="--device host" \
  bash scripts/e2e_test.sh -k "test_completion or test_chat or n2 or stop or concurrent or preemption or disconnected or json_schema or choice or regex"
step e2e-device-deepseek env PENG_BIN="$PWD/${BUILD_DIR:-build}/tools/peng" \
  PENG_E2E_SERVE_ARGS="--device host" PENG_E2E_MODEL="$PWD/tests/data/deepseek_tiny/serve" \
  bash scripts/e2e_test.sh -k "test_completion or test_chat or n2"
# The same OpenAI suite against a tensor-parallel job: mpirun -np 2 peng serve Qwen2.5 -tp 2
# (scripts/mpi_serve.sh: SIGTERM becomes SIGUSR1 to mpirun, the graceful drain under MPI).
step e2e-tp env PENG_BIN="$PWD/scripts/mpi_serve.sh" PENG_REAL_BIN="$PWD/${BUILD_DIR:-build}/tools/peng" \
  PENG_TP=2 PENG_E2E_THREADS=1 PENG_E2E_MODEL="$PWD/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" \
  bash scripts/e2e_test.sh
# Two data-parallel replicas behind one server (mpirun -np 2 peng serve SmolLM2 -dp 2): the
# completion, chat and metrics tests.
step e2e-dp env PENG_BIN="$PWD/scripts/mpi_serve.sh" PENG_REAL_BIN="$PWD/${BUILD_DIR:-build}/tools/peng" \
  PENG_TP=1 PENG_DP=2 PENG_E2E_THREADS=1 bash scripts/e2e_test.sh -k "test_completion or test_chat or metrics"
# Two pipeline stages (mpirun -np 2 peng serve SmolLM2 -pp 2: layers 0-14 on rank 0, 15-29 on
# rank 1): the completion, chat and metrics tests.
step e2e-pp env PENG_BIN="$PWD/scripts/mpi_serve.sh" PENG_REAL_BIN="$PWD/${BUILD_DIR:-build}/tools/peng" \
  PENG_TP=1 PENG_PP=2 PENG_E2E_THREADS=1 bash scripts/e2e_test.sh -k "test_completion or test_chat or metrics"
# The same against the DeepSeek-V2 fixture with its experts partitioned over both replicas (DP
# attention + EP experts: every MoE layer exchanges the replicas' tokens).
step e2e-dp-ep env PENG_BIN="$PWD/scripts/mpi_serve.sh" PENG_REAL_BIN="$PWD/${BUILD_DIR:-build}/tools/peng" \
  PENG_TP=1 PENG_DP=2 PENG_EP=1 PENG_E2E_THREADS=1 PENG_E2E_MODEL="$PWD/tests/data/deepseek_tiny/serve" \
  bash scripts/e2e_test.sh -k "test_completion or test_chat or metrics"
# Tensor parallelism across two "hosts" (network namespaces, Open MPI over TCP on veths):
# greedy tokens identical to the same job on one host (docs/parallelism.md).
step multihost env PENG_BIN="$PWD/${BUILD_DIR:-build}/tools/peng" bash scripts/multihost_test.sh --ci
# A short soak (300 mixed requests) and the full connection stress (500-connection burst,
# 1,000 idle/slowloris connections) against a fresh server; scripts/soak_test.sh alone runs
# the 10,000-request soak of docs/benchmarks.md.
step soak env PENG_BIN="$PWD/${BUILD_DIR:-build}/tools/peng" SOAK_REQUESTS=300 STRESS_HOLD=10 \
  SOAK_OUT=out/soak-ci bash scripts/soak_test.sh
# Failover behind nginx (deploy/nginx/peng.conf): one replica SIGKILLed and one drained
# mid-load, both restarted (docs/operations.md).
step failover env PENG_BIN="$PWD/${BUILD_DIR:-build}/tools/peng" FAILOVER_SHORT=1 bash scripts/failover_test.sh
# ARM64 (docs/arm64.md): cross build of the kernel and golden tests, all kernel conformance tests
# under qemu-aarch64 as a Kunpeng 920 class CPU (dotprod) and as -cpu max (i8mm, SVE), and the
# SmolLM2 golden test under both; scripts/test_arm64.sh without --ci runs everything.
step arm64 bash scripts/test_arm64.sh --ci
# A deterministic work counter: instructions of a fixed SmolLM2 prefill and decode step under
# callgrind against bench/insn_baseline.json (more than 2% more work fails; docs/benchmarks.md).
step insn-count env PENG_BIN="$PWD/${BUILD_DIR:-build}/tools/peng" bash bench/insn_count.sh
if [[ -f scripts/fuzz.sh ]]; then
  step fuzz bash scripts/fuzz.sh 20
fi
summary
