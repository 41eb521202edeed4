#!/usr/bin/env bash
# Cross-builds peng for aarch64 (scripts/build_arm64.sh) and runs its tests under qemu-aarch64
# (docs/arm64.md), once per emulated CPU model so the runtime ISA choice is exercised both ways:
#   cortex-a76  NEON + dotprod + fp16, no i8mm/SVE (Kunpeng 920 / Neoverse N1 class) -> dotprod
#   max         everything qemu knows (i8mm, bf16, SVE, ...)                        -> i8mm
# The kernel conformance tests loop over every level the CPU supports (under max: neon, dotprod
# and i8mm, each against the scalar reference); MatMulTest.IsaLevelsAreCoherent checks that the
# level chosen at run time is the expected one (PENG_EXPECT_ISA).
#
# Usage: scripts/test_arm64.sh [--ci]
#   --ci   the time-boxed part scripts/test.sh runs: builds only the kernel tests and
#          golden_model_test, runs all kernel conformance tests (label "kernels") and the
#          SmolLM2 llama.cpp golden test under both CPU models (the logits at every prompt
#          position; of each greedy continuation the first 8 tokens, not 32: 109 -> 84 s).
#   (none) builds everything and runs the whole ctest suite under both CPU models (except
#          the tests in $slow_under_qemu below, impractically slow under emulation, and
#          cli_errors_test, a shell script that would need binfmt_misc), the golden tests on
#          SmolLM2 and the tiny DeepSeek fixtures included, then one short OpenAI e2e run
#          (tests/e2e, -k "test_completion or test_chat") against `peng serve` under qemu per
#          CPU model, after checking that peng picks that model's kernel level.
#   ARM64_BUILD_DIR (default build-arm64; not BUILD_DIR, which scripts/test.sh uses for x86)
#   ARM64_CPUS  (default "cortex-a76 max")
#   JOBS        ctest / build parallelism (default nproc)
# Exits non-zero when any step fails; the last line is a one-line summary.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

export BUILD_DIR=${ARM64_BUILD_DIR:-build-arm64}  # for scripts/build_arm64.sh
JOBS=${JOBS:-$(nproc)}
CPUS=${ARM64_CPUS:-cortex-a76 max}
mode=full
[[ "${1:-}" == --ci ]] && mode=ci

# qemu-user: the arm64 multiarch libraries of this host (see cmake/toolchain-aarch64.cmake).
export QEMU_LD_PREFIX=/
# Tests that wait for an engine's next event call it hung after 60 s times this (a batch's
# prefill under emulation can take minutes); ctest's own limit is 2700 s per test here.
export PENG_TEST_TIME_SCALE=${PENG_TEST_TIME_SCALE:-10}

start=$(date +%s)
failed=()
step() {  # step NAME COMMAND... : runs a step, records a failure, keeps going
  local name=$1; shift
  local t0
  t0=$(date +%s)
  echo "=== test_arm64.sh: $name"
  if ! "$@"; then
    echo "=== test_arm64.sh: $name FAILED ($(( $(date +%s) - t0 ))s)" >&2
    failed+=("$name")
    return 1
  fi
  echo "=== test_arm64.sh: $name ok ($(( $(date +%s) - t0 ))s)"
}
summary() {
  local secs=$(( $(date +%s) - start ))
  if [[ ${#failed[@]} -eq 0 ]]; then
    echo "test_arm64.sh ($mode): PASS (${secs}s)"
    exit 0
  fi
  echo "test_arm64.sh ($mode): FAIL: ${failed[*]} (${secs}s)"
  exit 1
}

expected_isa() {
  case $1 in
    max) echo i8mm ;;
    cortex-a76|neoverse-n1|cortex-a55|cortex-a76ae) echo dotprod ;;
    cortex-a53|cortex-a57|cortex-a72) echo neon ;;
    *) echo "" ;;
  esac
}

kernel_tests=(matmul_test int8_gemm_test ops_test attention_test work_counter_test mla_test)

# Full mode leaves out (docs/arm64.md, "Full run") what is impractically slow under emulation:
# the float64-reference golden tests of the two bigger models (GoldenHfTest.Gemma3 /
# Qwen25Coder: exact activations, i.e. every weight dequantized to FP32; alone under qemu
# -cpu max 10 and 19 min, against ctest's 900 s limit per test; their llama.cpp golden tests,
# which run the quantized kernels, stay in: 3-5 min each) and the two SmolLM2 INT8 perplexity
# runs over a text (more than 14 min each).
slow_under_qemu='GoldenHfTest\.(Gemma3|Qwen25Coder)'
slow_under_qemu+='|Int8SmolLm\.(PerplexityWithinOnePercent|CorruptedScaleIsFlaggedAndLocalised)'
if [[ $mode == ci ]]; then
  step build env TARGETS="${kernel_tests[*]} golden_model_test" JOBS="$JOBS" \
    bash scripts/build_arm64.sh -DPENG_BUILD_TESTS=ON || summary
else
  step build env JOBS="$JOBS" bash scripts/build_arm64.sh -DPENG_BUILD_TESTS=ON || summary
  step models bash scripts/fetch_models.sh || summary
fi

for cpu in $CPUS; do
  export QEMU_CPU=$cpu PENG_EXPECT_ISA
  PENG_EXPECT_ISA=$(expected_isa "$cpu")
  [[ -n $PENG_EXPECT_ISA ]] || unset PENG_EXPECT_ISA
  step "kernels-$cpu" ctest --test-dir "$BUILD_DIR" -L kernels -j"$JOBS" --output-on-failure
  if [[ $mode == ci ]]; then
    step "golden-$cpu" env PENG_GOLDEN_GREEDY_TOKENS=8 \
      ctest --test-dir "$BUILD_DIR" -R '^GoldenLlamaCppTest\.SmolLM2$' --output-on-failure
  else
    step "ctest-$cpu" ctest --test-dir "$BUILD_DIR" -LE kernels \
      -E "^(cli_errors_test|$slow_under_qemu)\$" -j"$JOBS" --output-on-failure
  fi
done
unset PENG_EXPECT_ISA

if [[ $mode == full ]]; then
  # peng serve under qemu for the OpenAI client tests, once per CPU model, so that the server
  # runs each kernel level (dotprod under cortex-a76, i8mm under max); the wrapper takes the CPU
  # model from PENG_QEMU_CPU.
  wrapper=$BUILD_DIR/peng-qemu
  cat > "$wrapper" <<WRAP
#!/usr/bin/env bash
exec env QEMU_LD_PREFIX=/ QEMU_CPU=\${PENG_QEMU_CPU:-cortex-a76} qemu-aarch64 "$PWD/$BUILD_DIR/tools/peng" "\$@"
WRAP
  chmod +x "$wrapper"
  # shellcheck disable=SC2317  # (run through step)
  e2e() {  # e2e CPU: checks the kernel level peng picks under CPU, then the e2e run
    local want info
    want=$(expected_isa "$1")
    info=$(PENG_QEMU_CPU=$1 "$wrapper" info 2>&1)
    echo "$info"
    if [[ -n $want ]] && ! grep -qx "kernels: $want" <<<"$info"; then
      echo "test_arm64.sh: peng under -cpu $1 does not use the $want kernels" >&2
      return 1
    fi
    PENG_QEMU_CPU=$1 PENG_BIN="$PWD/$wrapper" bash scripts/e2e_test.sh \
      -k "test_completion or test_chat" -x
  }
  for cpu in $CPUS; do
    step "e2e-qemu-$cpu" e2e "$cpu"
  done
fi
summary
