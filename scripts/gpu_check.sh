#!/usr/bin/env bash
# The CUDA backend's checks and benchmarks on a GPU machine, as one prepared script (issue 15).
# The GPU machine (docs/devices.md) has nvcc and CMake but none of peng's Debian libraries, cannot
# fetch anything and takes at most 64 MiB of files, so everything is built here and travels in
# the git-ignored folder gpu/:
#
#   scripts/gpu_check.sh prepare   (here: x86-64 with the CUDA toolkit, ~10 min on 2 cores)
#     builds build-gpu (nvcc, no MPI) and copies into gpu/: the binaries, the shared libraries
#     they need beyond glibc / libstdc++ / the CUDA driver, the skeletons of the three GGUF
#     models (bench/random_gguf: metadata, tokenizer and tensor list, no weights) and the
#     wheels of the OpenAI client for the e2e tests.
#   scripts/gpu_check.sh run       (there, from the repository root, with gpu/ carried; writes
#                                   its logs and results to out/gpu, or under the device tool
#                                   (which takes 8 files back) as $OUT/gpu-results.tgz)
#     1. nvidia-smi; random-weight copies of SmolLM2-135M Q4_1, Gemma 3 270M Q4_K_M and
#        Qwen2.5-0.5B Q4_K_M at their real shapes, and the real-size V2-Lite-shaped Q4_0 file
#        (bench/make_deepseek_gguf, written while the tests run)
#     2. tests, one process a test (a fault leaves the others' results standing): cuda_device_test
#        (every op against the CPU reference on random inputs, the graphs of both families
#        against the host device -- with CUDA graphs, again without, and again without
#        programmatic dependent launch (PENG_CUDA_PDL=0) -- and the golden checks
#        where the trained models are present), hf_model_test with PENG_TEST_DEVICE=cuda (the
#        tiny Llama / Qwen2 / Gemma 3 fixtures against their float64 transformers references),
#        peng eval compare of the GPU's logits against the CPU engine's (Qwen2.5's shapes);
#        the first two failed op tests again under compute-sanitizer's memcheck
#     3. benchmarks: peng bench --device cuda (pp512, tg128, 3 reps; batched decode at 32 for
#        the small models) with the device's measured read bandwidth -> bench-*.json, one line
#        each; Qwen2.5's decode again without CUDA graphs, and again with the FP32-activation
#        GEMVs (PENG_CUDA_QGEMV=0), and again without programmatic dependent launch, and with
#        the norms, activations and quantizations before quantized GEMVs and RoPE + the KV
#        write before the attention in kernels of their own (PENG_CUDA_FUSED_INPUT=0
#        PENG_CUDA_FUSED_ROPE=0), and with
#        the greedy rows brought back whole (PENG_DEVICE_TOP_LOGITS=0), and its
#        INT8 W8A8 form (peng quantize); V2-Lite's decode again with the routing and the MoE
#        down projections apart (PENG_CUDA_FUSED_ROUTE=0 PENG_CUDA_FUSED_MOE_DOWN=0), and its
#        prefill with the FP32-activation kernels (PENG_CUDA_QGEMV=0), and with MLA's products
#        a block a (token, head) (PENG_CUDA_MLA_GEMM=0), and with the attention on the FP32
#        tiles (PENG_CUDA_MMA_ATTENTION=0); Qwen2.5's prefill with the attention a block a
#        (token, head) (PENG_CUDA_TILED_ATTENTION=0); Qwen2.5's
#        pp512 and tg128 after 4096 tokens of context (--depth 4096), the decode attention's
#        keys split over blocks and not (PENG_CUDA_ATTN_SPLIT=0), its pp512 there with the
#        prompts' attention on the FP32 tiles (PENG_CUDA_MMA_ATTENTION=0), the 8-bit KV cache
#        (--kv-cache-dtype q8_0; V2-Lite's too, after 1024 tokens), Qwen2.5's decode of 64
#        sequences together with the products on the tensor cores and by dp4a
#        (PENG_CUDA_MMA_GEMV=0) and V2-Lite's pp512 by dp4a (these five after step 5);
#        each line with the kernels a decode step launches and what they cost at the kernel
#        floor (an empty kernel's time in a recorded step)
#     4. serving: peng serve --device cuda + peng bench serve with 64 concurrent clients, greedy
#        and at temperature 1 (the tokens drawn on the device); again at temperature 1 with the
#        logit rows brought back whole and drawn on the host (PENG_DEVICE_TOP_LOGITS=0)
#     5. e2e: tests/e2e/test_openai.py against peng serve --device cuda (SmolLM2's shapes)
#     6. profile (only when STEPS names it): ncu's time of every kernel in the pp512 of V2-Lite
#        and of Qwen2.5, in decode steps of both, and in Qwen2.5's decode of 32 sequences,
#        summed by kernel and grid (PROFILE="deepseek-prefill qwen-prefill qwen deepseek
#        qwen-batch",
#        PROFILE_KERNELS: how many launches ncu times)
#   Steps 3-6 run even when a test fails; the exit status is non-zero if any step failed. Each
#   step stops after STEP_TIMEOUT seconds (default 150).
#   STEPS="tests bench" limits the run to those steps (models, tests, bench, serve, e2e, profile).
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-}
BUNDLE=gpu
MODELS=(smollm2-135m-instruct-q4_1 gemma-3-270m-q4_k_m qwen2.5-coder-0.5b-instruct-q4_k_m)
BINARIES=(tools/peng tests/cuda_device_test tests/hf_model_test bench/random_gguf
          bench/make_deepseek_gguf)
WHEELS=(openai==3.57.0 pydantic==2.14.4 pydantic-core==2.50.5 jiter annotated-types
        typing-inspection sniffio typing-extensions httpx2 httpcore2 truststore idna h11 anyio)

prepare() {
  set -e
  command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] ||
    { echo "gpu_check: nvcc not found (the CUDA toolkit is needed to build)" >&2; exit 1; }
  # sm_90 only: the H200 the device tool lends (the bundle stays well under the 64 MiB).
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DPENG_MPI=OFF \
    -DCMAKE_CUDA_ARCHITECTURES=90-real >/dev/null
  ninja -C build-gpu "${BINARIES[@]}"
  rm -rf "$BUNDLE"
  mkdir -p "$BUNDLE"/bin "$BUNDLE"/lib "$BUNDLE"/skel "$BUNDLE"/whl
  for b in "${BINARIES[@]}"; do cp "build-gpu/$b" "$BUNDLE/bin/"; done
  strip "$BUNDLE"/bin/*  # (the 64 MiB the GPU machine takes, with the working tree)
  # Shared libraries from this machine's Debian packages (the GPU image has glibc, libstdc++,
  # libgcc and the CUDA libraries of its own toolkit).
  for b in "$BUNDLE"/bin/*; do
    ldd "$b" | awk '/=> \// {print $3}'
  done | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
      libcuda.so*|libcudart.so*|libcublas*.so*|libnccl.so*) ;;
      *) cp -L "$lib" "$BUNDLE/lib/" ;;
    esac
  done
  for m in "${MODELS[@]}"; do
    f=models/$m.gguf
    [[ -f $f ]] || { echo "gpu_check: $f missing (scripts/fetch_models.sh)" >&2; exit 1; }
    build-gpu/bench/random_gguf skeleton "$f" "$BUNDLE/skel/$m.skel.gguf"
  done
  if ! python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 -d "$BUNDLE/whl" "${WHEELS[@]}"; then
    echo "gpu_check: could not download the e2e client's wheels; step e2e will be skipped" >&2
    rm -rf "$BUNDLE/whl"
  fi
  # Compressed (the binaries' kernels, the skeletons' vocabularies); run() unpacks them.
  gzip -9 "$BUNDLE"/bin/* "$BUNDLE"/skel/*
  grep -qx "/$BUNDLE/" .git/info/exclude 2>/dev/null || echo "/$BUNDLE/" >> .git/info/exclude
  du -sh "$BUNDLE"
  echo "gpu_check: ready; on the GPU machine run: scripts/gpu_check.sh run (carry $BUNDLE)"
}

FAILED=()
# name command...: runs it (at most STEP_TIMEOUT seconds, default 150) with its output in
# $RES/<name>.log and records failures. Shell functions run under timeout through bash -c
# (they and the variables they read are exported in run()).
step() {
  local name=$1 t0=$SECONDS
  shift
  echo "=== $name: $*"
  if timeout -k 5 "${STEP_TIMEOUT:-150}" bash -c '"$@"' _ "$@" > "$RES/$name.log" 2>&1; then
    echo "    ok ($((SECONDS - t0)) s)"
  else
    echo "    FAILED ($?, $((SECONDS - t0)) s), last lines of $RES/$name.log:"
    tail -n 25 "$RES/$name.log" | sed 's/^/    /'
    FAILED+=("$name")
  fi
}
want() { [[ -z "${STEPS:-}" || " $STEPS " == *" $1 "* ]]; }

wait_health() {  # url
  for _ in $(seq 1 240); do
    curl -sf "$1/health" > /dev/null 2>&1 && return 0
    sleep 0.5
  done
  return 1
}

bench_json() {  # model out.json args...: peng bench's JSON document into out.json
  local model=$1 out=$2
  shift 2
  "$BUNDLE/bin/peng" bench -m "$model" --device cuda --pp 512 --reps 3 --json "$@" > "$out"
}

# The same bench with a switch of docs/devices.md on, then off: steps bench-NAME-ON and
# bench-NAME-OFF, each into $RES/NAME-ON.json / NAME-OFF.json, each summarized.
bench_switch() {  # variable name on off model args...
  local var=$1 name=$2 on=$3 off=$4 model=$5 m
  shift 5
  for m in "$on" "$off"; do
    local -x "$var=$([[ $m == "$on" ]] && echo 1 || echo 0)"
    step "bench-$name-$m" bench_json "$model" "$RES/$name-$m.json" "$@"
    summarize_bench "$RES/$name-$m.json"
  done
}

serve_bench() {  # model port name [bench serve args]: 256 requests, 64 at a time
  local model=$1 port=$2 name=$3
  shift 3
  "$BUNDLE/bin/peng" serve "$model" --device cuda --host 127.0.0.1 --port "$port" \
    --max-num-seqs 64 > "$RES/$name-server.log" 2>&1 &
  local pid=$!
  wait_health "http://127.0.0.1:$port" || { kill $pid; return 1; }
  "$BUNDLE/bin/peng" bench serve --url "http://127.0.0.1:$port" -n 256 --max-concurrency 64 \
    --input-len 128 --output-len 128 --out "$RES/$name.json" "$@"
  local rc=$?
  kill -TERM $pid
  wait $pid
  return $rc
}

# model n_tokens: ncu's time of every kernel in n decode steps from an empty context, summed by
# kernel and grid, the largest first.
profile_decode() {
  profile_kernels "$1" "$RES/profile-$(basename "$1" .gguf).csv" "$2" --pp 0 --tg "$2"
}
# model: the same for a prefill of 512 tokens (after peng bench's two warm-up decode steps).
profile_prefill() {
  profile_kernels "$1" "$RES/profile-prefill-$(basename "$1" .gguf).csv" 3 --pp 512 --tg 0
}
# model csv steps bench-args...: ncu over peng bench, summed by kernel and grid.
profile_kernels() {
  local model=$1 csv=$2 steps=$3
  shift 3
  ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base --log-file "$csv" \
    --launch-count ${PROFILE_KERNELS:-6000} "$BUNDLE/bin/peng" bench -m "$model" --device cuda "$@" --reps 1 \
    > /dev/null || return 1
  python3 - "$csv" "$steps" <<'PY'
import collections, csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, rows = rows[0], rows[1:]
name, grid, block, value = (head.index(c) for c in ("Kernel Name", "Grid Size", "Block Size", "Metric Value"))
total = collections.Counter(); count = collections.Counter()
for r in rows:
    n = r[name].replace("(anonymous namespace)::", "").replace("void ", "")
    lt, par = n.find("<"), n.find("(")
    base, args = (n[:lt], n[lt:n.find(">(") + 1]) if 0 <= lt < par else (n[:par], "")
    k = (base.split("::")[-1] + args.replace("peng::DType", "DType"), r[grid], r[block])
    total[k] += float(r[value].replace(",", "")); count[k] += 1
allt = sum(total.values())
# (the profile may stop before the last step: one embedding lookup a step)
steps = sum(c for key, c in count.items() if key[0].startswith("EmbedKernel")) or int(sys.argv[2])
print(f"{len(rows)} kernels, {allt / 1e3:.0f} us in all: {steps} steps (with the probe's kernels), "
      f"{allt / 1e3 / steps:.0f} us a step")
for k, v in total.most_common(25):
    print(f"{100 * v / allt:5.1f}%  {v / count[k] / 1e3:8.2f} us x {count[k]:5d}  {k[0]} grid {k[1]} block {k[2]}")
PY
}

# One line per benchmark JSON file given: the medians and decode's share of the bandwidth bound.
summarize_bench() {
  python3 - "$@" <<'PY'
import json, statistics, sys
for f in sys.argv[1:]:
    try:
        j = json.load(open(f))
    except Exception as e:
        print(f"{f}: unreadable ({e})")
        continue
    pp = statistics.median(j["pp"]["tokens_per_s"])
    tg = statistics.median(j["tg"]["tokens_per_s"])
    bound = j["bandwidth_bound_tokens_per_s"]
    at = f" @ d{j['depth']}" if "depth" in j else ""
    line = (f"{f.split('/')[-1]}: pp{j['pp']['n']}{at} {pp:.0f} tok/s, tg{j['tg']['n']}{at} "
            f"{tg:.1f} tok/s"
            f" = {100 * tg / bound:.0f}% of {bound:.0f} ({j['mem_bandwidth_gbs']:.0f} GB/s,"
            f" {j['weight_bytes_per_token'] / 1e6:.0f} MB a token)")
    if "kernels_per_step" in j["tg"]:
        k = j["tg"]["kernels_per_step"]
        line += f", {k:.0f} kernels a decode step"
        if "kernel_floor_us" in j:
            f = j["kernel_floor_us"]
            line += f" x {f:.2f} us (an empty kernel) = {k * f:.0f} of its {1e6 / tg:.0f} us"
    if "batch" in j:
        b = j["batch"]
        line += (f"; batch {b['n']}: {statistics.median(b['tokens_per_s']):.0f} tok/s vs"
                 f" {statistics.median(b['batch1_tokens_per_s']):.0f} at batch 1")
    print(line)
PY
}

run() {
  [[ -d $BUNDLE/bin ]] || { echo "gpu_check: $BUNDLE/ missing: run 'prepare' first and carry it" >&2; exit 1; }
  local gz
  for gz in "$BUNDLE"/bin/*.gz "$BUNDLE"/skel/*.gz; do  # (prepare compressed them)
    [[ -f $gz ]] && gunzip -f "$gz"
  done
  chmod +x "$BUNDLE"/bin/*
  # Under the device tool $OUT takes at most 8 files: the logs go to a folder of their own and
  # come back as one archive.
  RES=${OUT:+/tmp/gpu-results}
  RES=${RES:-out/gpu}
  rm -rf "$RES"
  mkdir -p "$RES"
  # The test fixtures (tests/data) of this checkout, not of the machine that built the binaries.
  export PENG_SOURCE_DIR=$PWD
  # cuBLAS (too large to carry) from the machine's CUDA toolkit or its PyTorch wheels.
  local cublas
  cublas=$(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null || true)
  export LD_LIBRARY_PATH="$PWD/$BUNDLE/lib:/usr/local/cuda/lib64${cublas:+:$cublas}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  ldd "$BUNDLE/bin/peng" | grep "not found" && echo "gpu_check: libraries missing (above)"
  export BUNDLE RES
  export -f bench_json serve_bench wait_health profile_decode profile_prefill profile_kernels
  local mdir=/tmp/peng-models ds=/tmp/peng-models/deepseek-v2-lite-random-q4_0.gguf ds_pid=
  mkdir -p "$mdir"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem \
    --format=csv | tee "$RES/gpu.txt"
  if want models; then
    for m in "${MODELS[@]}"; do
      step "model-$m" "$BUNDLE/bin/random_gguf" fill "$BUNDLE/skel/$m.skel.gguf" "$mdir/$m.gguf"
    done
    # The real-size V2-Lite-shaped file (9 GB) is written while the tests run.
    ( "$BUNDLE/bin/make_deepseek_gguf" -o "$ds" --threads 8 > "$RES/model-deepseek.log" 2>&1
      echo $? > "$RES/model-deepseek.rc" ) &
    ds_pid=$!
  fi
  if want tests; then
    # One process a test, so that a fault in one leaves the others' results standing; the
    # graphs run on the random-weight files of real shape. The golden checks compare with the
    # trained weights' references, not with the random files of the same names in $mdir: the
    # trained files are absent there, so they skip (and say so).
    local t models_dir
    for t in $("$BUNDLE/bin/cuda_device_test" --gtest_list_tests |
               awk '/^[^ ]/ {s = $1} /^  / {print s $1}'); do
      models_dir=$mdir
      [[ $t == CudaGoldenTest.* ]] && models_dir=/nonexistent
      step "test-${t//./-}" env PENG_MODELS_DIR="$models_dir" \
        PENG_MAKE_DEEPSEEK_GGUF="$BUNDLE/bin/make_deepseek_gguf" "$BUNDLE/bin/cuda_device_test" \
        --gtest_filter="$t"
    done
    step test-graphs-no-cuda-graphs env PENG_MODELS_DIR="$mdir" PENG_CUDA_GRAPHS=0 \
      PENG_MAKE_DEEPSEEK_GGUF="$BUNDLE/bin/make_deepseek_gguf" \
      "$BUNDLE/bin/cuda_device_test" --gtest_filter='CudaTest.*Graph*'
    # Without programmatic dependent launch: where a test above failed with it and passes
    # here, the fault is in the kernels' GridWait discipline (runtime.h).
    step test-graphs-no-pdl env PENG_MODELS_DIR="$mdir" PENG_CUDA_PDL=0 \
      PENG_MAKE_DEEPSEEK_GGUF="$BUNDLE/bin/make_deepseek_gguf" \
      "$BUNDLE/bin/cuda_device_test" --gtest_filter='CudaTest.*Graph*'
    step test-hf-cuda env PENG_TEST_DEVICE=cuda "$BUNDLE/bin/hf_model_test" \
      --gtest_filter='HfModelTest.*'
    # The GPU's logits against the CPU engine's over a text, with the same arithmetic where the
    # GPU mirrors it (quantized activations; prefill's GEMMs are FP16 there): KL, top-1 and the
    # relative deviation recorded, not judged (random weights amplify any difference: the CPU's
    # own quantized-vs-exact deviation on this file is 8%).
    local qwen_rnd=$mdir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    step eval-cuda-vs-cpu "$BUNDLE/bin/peng" eval compare -m "$qwen_rnd" --reference "$qwen_rnd" \
      --device cuda --reference-device cpu --text tests/data/eval/gpl3_excerpt.txt --ctx 256 \
      --max-tokens 512 --max-deviation 1 --max-weight-deviation 1 --json
    grep -E '"(mean_kl|top1_agreement|mean_deviation|max_deviation)"' \
      "$RES/eval-cuda-vs-cpu.log" | tr -d ' \n' && echo
    grep -h '^\[cuda\]' "$RES"/test-*.log | sort -u
    # The first two failed tests again under compute-sanitizer's memcheck.
    if command -v compute-sanitizer > /dev/null; then
      local n_checked=0
      for t in "${FAILED[@]}"; do
        [[ $t == test-CudaTest-* ]] && ((n_checked++ < 2)) || continue
        STEP_TIMEOUT=60 step "memcheck-${t#test-}" compute-sanitizer --tool memcheck \
          --error-exitcode 99 --print-limit 20 "$BUNDLE/bin/cuda_device_test" \
          --gtest_filter="CudaTest.${t#test-CudaTest-}"
      done
    fi
  fi
  if want bench; then
    for m in "${MODELS[@]}"; do
      step "bench-$m" bench_json "$mdir/$m.gguf" "$RES/bench-$m.json" --tg 128 --batch 32
    done
  fi
  if [[ -n $ds_pid ]]; then
    wait "$ds_pid"
    if [[ $(cat "$RES/model-deepseek.rc") != 0 ]]; then
      echo "=== model-deepseek FAILED:"
      tail -n 25 "$RES/model-deepseek.log" | sed 's/^/    /'
      FAILED+=(model-deepseek)
    fi
  fi
  if want bench; then
    STEP_TIMEOUT=150 step bench-deepseek bench_json "$ds" "$RES/bench-deepseek.json" --tg 64
    summarize_bench "$RES"/bench-*.json
    # What an MoE layer's decode in three launches is worth (the router on the norm's launch,
    # MoeDownKernel): V2-Lite's decode with the routing and the two down projections apart.
    PENG_CUDA_FUSED_ROUTE=0 PENG_CUDA_FUSED_MOE_DOWN=0 STEP_TIMEOUT=90 step \
      bench-deepseek-moe-apart bench_json "$ds" "$RES/deepseek-moe-apart.json" --tg 64
    summarize_bench "$RES/deepseek-moe-apart.json"
    # What prefill's dp4a grouped experts are worth (GroupedExpertsQGemvKernel): V2-Lite's pp512
    # with the FP32-activation kernels (and 8 decode tokens).
    PENG_CUDA_QGEMV=0 STEP_TIMEOUT=90 step bench-deepseek-fp32 bench_json "$ds" \
      "$RES/deepseek-fp32.json" --tg 8
    summarize_bench "$RES/deepseek-fp32.json"
    # What the tensor cores are worth in the attention of prompts (AttentionMmaWideKernel):
    # pp512 of V2-Lite (MLA's latent rows) on the FP32 tiles (AttentionTileKernel); what the
    # tiles are worth: Qwen2.5's pp512 (GQA) with a block a (token, head) instead; and what
    # MLA's products with kv_b as batched GEMMs are (CudaDevice::MlaGemm): V2-Lite's pp512 with
    # a block a (token, head) there.
    PENG_CUDA_MMA_ATTENTION=0 STEP_TIMEOUT=90 step bench-deepseek-fp32-tiles bench_json "$ds" \
      "$RES/deepseek-fp32-tiles.json" --tg 8
    summarize_bench "$RES/deepseek-fp32-tiles.json"
    PENG_CUDA_MLA_GEMM=0 STEP_TIMEOUT=90 step bench-deepseek-mla-kernels bench_json "$ds" \
      "$RES/deepseek-mla-kernels.json" --tg 8
    summarize_bench "$RES/deepseek-mla-kernels.json"
    PENG_CUDA_TILED_ATTENTION=0 step bench-untiled-qwen bench_json \
      "$mdir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" "$RES/untiled-qwen.json" --tg 8
    summarize_bench "$RES/untiled-qwen.json"
    # Prefill and decode after a context of 4096 tokens (peng bench --depth, llama-bench's -d):
    # the decode attention's keys split over blocks (AttnSplits), and not
    # (PENG_CUDA_ATTN_SPLIT=0).
    bench_switch PENG_CUDA_ATTN_SPLIT depth split unsplit \
      "$mdir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" --tg 128 --depth 4096
    # What the prompts' attention on the tensor cores is worth (AttentionMmaKernel): the same
    # pp512 after 4096 tokens with the FP32 tiles (PENG_CUDA_MMA_ATTENTION=0).
    PENG_CUDA_MMA_ATTENTION=0 step bench-depth-fp32-tiles bench_json \
      "$mdir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" "$RES/depth-fp32-tiles-qwen.json" \
      --tg 8 --depth 4096
    summarize_bench "$RES/depth-fp32-tiles-qwen.json"
    # The same for heads of 256 (AttentionMmaWideKernel): Gemma 3's pp512 after 4096 tokens on
    # the tensor cores and on the FP32 tiles.
    bench_switch PENG_CUDA_MMA_ATTENTION depth-gemma mma fp32-tiles \
      "$mdir/gemma-3-270m-q4_k_m.gguf" --tg 8 --depth 4096
    # What the CUDA graphs are worth (decode of the same file, replay off).
    PENG_CUDA_GRAPHS=0 step bench-no-graphs bench_json \
      "$mdir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" "$RES/no-graphs-qwen.json" --tg 128
    summarize_bench "$RES/no-graphs-qwen.json"
    # What the quantized (dp4a) GEMVs are worth: the FP32-activation GEMVs instead.
    PENG_CUDA_QGEMV=0 step bench-fp32-gemv bench_json \
      "$mdir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" "$RES/fp32-gemv-qwen.json" --tg 128
    summarize_bench "$RES/fp32-gemv-qwen.json"
    # What programmatic dependent launch is worth (runtime.h): the same decode without it.
    PENG_CUDA_PDL=0 step bench-no-pdl bench_json \
      "$mdir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" "$RES/no-pdl-qwen.json" --tg 128
    summarize_bench "$RES/no-pdl-qwen.json"
    # What running a GEMV's input kernel (the RMSNorm, the gated activation, the quantization)
    # inside the GEMV (FusedQGemvKernel) and RoPE + the KV write inside the attention
    # (AttnRope) are worth: the same decode with their own kernels.
    PENG_CUDA_FUSED_INPUT=0 PENG_CUDA_FUSED_ROPE=0 step bench-unfused bench_json \
      "$mdir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" "$RES/unfused-qwen.json" --tg 128
    summarize_bench "$RES/unfused-qwen.json"
    # What taking the greedy rows' best logit on the device is worth (Device::TopLogits): the
    # same decode with the rows brought back whole.
    PENG_DEVICE_TOP_LOGITS=0 step bench-whole-rows bench_json \
      "$mdir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" "$RES/whole-rows-qwen.json" --tg 128 \
      --batch 32
    summarize_bench "$RES/whole-rows-qwen.json"
    # INT8 W8A8 (peng quantize of the same random file: the integer GEMV over INT8 rows).
    step quantize-w8a8 "$BUNDLE/bin/peng" quantize "$mdir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" \
      "$mdir/qwen2.5-w8a8" --scheme w8a8
    step bench-w8a8 bench_json "$mdir/qwen2.5-w8a8" "$RES/w8a8-qwen.json" --tg 128 --batch 32
    summarize_bench "$RES/w8a8-qwen.json"
  fi
  if want serve; then
    step serve-64 serve_bench "$mdir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" 18300 serve-64
    head -n 25 "$RES/serve-64.log"
    # Sampling at temperature 1 (OpenAI's default): each row's token drawn on the device
    # (Device::DrawTokens); then the same with every logit row brought back whole and drawn on
    # the host: what the device's draw is worth to serving.
    step serve-64-temperature serve_bench "$mdir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" 18301 \
      serve-64-temperature --temperature 1
    head -n 25 "$RES/serve-64-temperature.log"
    PENG_DEVICE_TOP_LOGITS=0 step serve-64-whole-rows serve_bench \
      "$mdir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" 18302 serve-64-whole-rows --temperature 1
    head -n 25 "$RES/serve-64-whole-rows.log"
  fi
  if want e2e; then
    if [[ -d $BUNDLE/whl ]]; then
      step e2e-install python3 -m pip install -q --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --target /tmp/peng-site "$BUNDLE"/whl/*.whl
      STEP_TIMEOUT=150 step e2e env PYTHONPATH=/tmp/peng-site PENG_BIN="$PWD/$BUNDLE/bin/peng" \
        PENG_E2E_SERVE_ARGS="--device cuda" \
        PENG_E2E_MODEL="$mdir/smollm2-135m-instruct-q4_1.gguf" \
        python3 -m pytest -q -x -p no:cacheprovider tests/e2e/test_openai.py
      tail -n 3 "$RES/e2e.log"
    else
      echo "=== e2e: skipped (no wheels in $BUNDLE/whl)"
    fi
  fi
  if want bench; then
    # The 8-bit KV cache (--kv-cache-dtype q8_0): Qwen2.5 after 4096 tokens (against
    # bench-depth-split) and V2-Lite's latent rows after 1024 -- after serving and e2e, so that
    # a run cut short by its time limit loses these first.
    step bench-depth-q8_0 bench_json "$mdir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" \
      "$RES/depth-q8_0-qwen.json" --tg 128 --depth 4096 --kv-cache-dtype q8_0
    summarize_bench "$RES/depth-q8_0-qwen.json"
    STEP_TIMEOUT=150 step bench-deepseek-q8_0 bench_json "$ds" "$RES/deepseek-q8_0.json" \
      --tg 64 --depth 1024 --kv-cache-dtype q8_0
    summarize_bench "$RES/deepseek-q8_0.json"
    # What the tensor cores are worth in the quantized products of 16 to 64 tokens
    # (QMmaKernel) and in the experts' grouped by expert (GroupedExpertsQMmaKernel): Qwen2.5's
    # decode of 64 sequences together on them and on dp4a (PENG_CUDA_MMA_GEMV=0), and V2-Lite's
    # pp512 on dp4a (against bench-deepseek).
    bench_switch PENG_CUDA_MMA_GEMV batch64 mma dp4a \
      "$mdir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf" --tg 64 --batch 64
    PENG_CUDA_MMA_GEMV=0 STEP_TIMEOUT=90 step bench-deepseek-dp4a bench_json "$ds" \
      "$RES/deepseek-dp4a.json" --tg 8
    summarize_bench "$RES/deepseek-dp4a.json"
  fi
  if [[ " ${STEPS:-} " == *" profile "* ]] && command -v ncu > /dev/null; then
    # Each kernel's time in the prefills, decode steps and a batched decode (asked for by name
    # in STEPS only: ncu serializes).
    wait "$ds_pid" 2> /dev/null
    local qwen=$mdir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    local profiles=" ${PROFILE:-deepseek-prefill qwen-prefill qwen deepseek qwen-batch} "
    [[ $profiles == *" deepseek-prefill "* ]] &&
      STEP_TIMEOUT=100 step profile-deepseek-prefill profile_prefill "$ds"
    [[ $profiles == *" qwen-prefill "* ]] &&
      STEP_TIMEOUT=100 step profile-qwen-prefill profile_prefill "$qwen"
    [[ $profiles == *" qwen "* ]] && STEP_TIMEOUT=100 step profile-qwen profile_decode "$qwen" 16
    [[ $profiles == *" deepseek "* ]] &&
      STEP_TIMEOUT=100 step profile-deepseek profile_decode "$ds" 8
    # (32 sequences decoding together: their kernels are the ones with 32-token grids; the
    # single sequence's steps of peng bench come before and after them)
    [[ $profiles == *" qwen-batch "* ]] &&
      STEP_TIMEOUT=100 step profile-qwen-batch profile_kernels "$qwen" \
        "$RES/profile-qwen-batch32.csv" 12 --pp 0 --tg 4 --batch 32
  fi
  [[ -n ${OUT:-} ]] && tar czf "$OUT/gpu-results.tgz" -C "$RES" .
  if ((${#FAILED[@]})); then
    echo "gpu_check: FAILED: ${FAILED[*]}"
    return 1
  fi
  echo "gpu_check: PASS (results in $RES)"
}

case "$MODE" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: scripts/gpu_check.sh prepare|run" >&2; exit 2 ;;
esac
