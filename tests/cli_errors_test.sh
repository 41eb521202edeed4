#!/usr/bin/env bash
# Bad input to the `peng` CLI must give a clear message and a non-zero exit, never a crash:
# missing/corrupt/truncated model files, unknown architectures, bad arguments, prompts longer
# than the context. Usage: cli_errors_test.sh PENG_BINARY SOURCE_DIR
set -u
peng=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0

# expect NAME WANT_RC WANT_SUBSTRING -- command...
expect() {
  local name=$1 want_rc=$2 want=$3
  shift 3
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -eq "$want_rc" ] && [[ "$out" == *"$want"* ]]; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL: $name: rc=$rc (want $want_rc), output: $out (want substring: $want)"
  fi
}

# Tiny hand-made GGUF files (format facts: magic, version, counts, typed key/values).
python3 - "$tmp" <<'PY'
import struct, sys, os
d = sys.argv[1]
def s(x):
    b = x.encode(); return struct.pack('<Q', len(b)) + b
def kv_str(k, v):
    return s(k) + struct.pack('<I', 8) + s(v)
hdr = b'GGUF' + struct.pack('<IQQ', 3, 0, 1) + kv_str('general.architecture', 'mamba9')
open(os.path.join(d, 'unknown_arch.gguf'), 'wb').write(hdr)
# claims one tensor and 2 key/values but ends early
open(os.path.join(d, 'truncated.gguf'), 'wb').write(b'GGUF' + struct.pack('<IQQ', 3, 1, 2) + kv_str('general.architecture', 'llama')[:20])
open(os.path.join(d, 'not_gguf.gguf'), 'wb').write(b'PK\x03\x04' + b'\0' * 60)
# huge string length
open(os.path.join(d, 'huge_string.gguf'), 'wb').write(b'GGUF' + struct.pack('<IQQ', 3, 0, 1) + struct.pack('<Q', 1 << 62) + b'abc')
# HF folder with a corrupt safetensors header
hf = os.path.join(d, 'hf_bad'); os.mkdir(hf)
open(os.path.join(hf, 'config.json'), 'w').write('{"model_type": "llama", "hidden_size": 8}')
open(os.path.join(hf, 'model.safetensors'), 'wb').write(struct.pack('<Q', 1 << 40) + b'{}')
hf2 = os.path.join(d, 'hf_badjson'); os.mkdir(hf2)
open(os.path.join(hf2, 'config.json'), 'w').write('{"model_type": "llama", ')
PY

expect "no subcommand" 2 "" "$peng"
expect "missing model file" 1 "cannot open" "$peng" generate -m "$tmp/none.gguf" -p hi
expect "not a gguf" 1 "not_gguf.gguf" "$peng" generate -m "$tmp/not_gguf.gguf" -p hi
expect "truncated gguf" 1 "truncated.gguf" "$peng" generate -m "$tmp/truncated.gguf" -p hi
expect "huge string" 1 "huge_string.gguf" "$peng" generate -m "$tmp/huge_string.gguf" -p hi
expect "unknown architecture" 1 "unknown model architecture 'mamba9'" \
  "$peng" generate -m "$tmp/unknown_arch.gguf" -p hi
expect "corrupt safetensors" 1 "model.safetensors" "$peng" generate -m "$tmp/hf_bad" -p hi
expect "corrupt config.json" 1 "config.json" "$peng" generate -m "$tmp/hf_badjson" -p hi
expect "tokenize missing file" 1 "cannot open" "$peng" tokenize -m "$tmp/none.gguf" --text hi
expect "negative temperature" 2 "temp" "$peng" generate -m x.gguf -p hi --temp -1
expect "zero max tokens" 2 "max-tokens" "$peng" generate -m x.gguf -p hi -n 0
expect "non-numeric threads" 2 "threads" "$peng" generate -m x.gguf -p hi -t abc
expect "missing prompt" 2 "prompt" "$peng" generate -m x.gguf
expect "bad token ids" 1 "is not a token id" "$peng" logits -m "$tmp/unknown_arch.gguf" --tokens 1,x --out "$tmp/o.npy"

expect "quantize unknown scheme" 2 "scheme" "$peng" quantize "$src/tests/data/hf_tiny/llama" "$tmp/q0" --scheme w4a4
expect "quantize missing input" 1 "cannot open" "$peng" quantize "$tmp/none.gguf" "$tmp/q1" --scheme w8a8
expect "quantize corrupt input" 1 "model.safetensors" "$peng" quantize "$tmp/hf_bad" "$tmp/q2" --scheme w8a8
mkdir -p "$tmp/nonempty" && touch "$tmp/nonempty/x"
expect "quantize into a non-empty folder" 1 "is not an empty folder" \
  "$peng" quantize "$src/tests/data/hf_tiny/llama" "$tmp/nonempty" --scheme w8a8
expect "quantize tiny llama" 0 "14 tensors quantized, 2 skipped" \
  "$peng" quantize -q "$src/tests/data/hf_tiny/llama" "$tmp/tiny_w8a8" --scheme w8a8
expect "quantize an INT8 folder again" 1 "already quantized" \
  "$peng" quantize "$tmp/tiny_w8a8" "$tmp/q3" --scheme w8a16
sed 's/"w8a8"/"w3a3"/' "$tmp/tiny_w8a8/quant_config.json" > "$tmp/qc.json"
cp -r "$tmp/tiny_w8a8" "$tmp/tiny_badqc" && cp "$tmp/qc.json" "$tmp/tiny_badqc/quant_config.json"
expect "unknown scheme in quant_config.json" 1 "unknown quantization scheme 'w3a3'" \
  "$peng" logits -m "$tmp/tiny_badqc" --tokens 1,2 --out "$tmp/o.npy"

# --device: an unknown name, and CUDA without a GPU (or a build without it), are clear errors;
# the host device runs the device graph (the tiny llama folder, token ids).
tiny="$src/tests/data/hf_tiny/llama"
expect "unknown device" 1 "unknown device 'tpu'" "$peng" logits -m "$tiny" --tokens 1,2 --out "$tmp/o.npy" --device tpu
if ! nvidia-smi -L > /dev/null 2>&1; then
  expect "cuda without a gpu" 1 "CUDA" "$peng" logits -m "$tiny" --tokens 1,2 --out "$tmp/o.npy" --device cuda
fi
expect "gpu memory share of 0" 1 "gpu_memory_utilization (--gpu-memory-utilization) must be in (0, 1]" \
  "$peng" serve "$tiny" --gpu-memory-utilization 0 --port 0
expect "host device" 0 "" "$peng" logits -m "$tiny" --tokens 1,2 --out "$tmp/o.npy" --device host
# Pipeline stages: on the CPU only, and in a job of as many processes.
expect "pipeline stages on a device" 1 "pipeline parallelism (--pipeline-parallel-size) runs on the CPU" \
  "$peng" serve "$tiny" -pp 2 --device host --port 0
expect "pipeline stages without mpirun" 1 "--pipeline-parallel-size 2 x --data-parallel-size 1 needs a job of 2 processes" \
  "$peng" generate -m "$tiny" -p hi -n 2 -pp 2
# --kv-cache-dtype: an unknown type is a usage error; q8_0 needs head dimensions of whole 32-value
# blocks (the tiny llama's are 16), and --exact keeps its f32 cache.
expect "unknown kv cache dtype" 2 "q4 not in {f16,f32,q8_0}" \
  "$peng" logits -m "$tiny" --tokens 1,2 --out "$tmp/o.npy" --kv-cache-dtype q4
expect "q8_0 kv cache, head_dim 16" 1 "multiples of 32; layer 0 has 16" \
  "$peng" logits -m "$tiny" --tokens 1,2 --out "$tmp/o.npy" --kv-cache-dtype q8_0
expect "q8_0 kv cache with --exact" 1 "--exact runs with an f32 KV cache" \
  "$peng" logits -m "$tiny" --tokens 1,2 --out "$tmp/o.npy" --kv-cache-dtype q8_0 --exact
expect "f32 kv cache" 0 "" "$peng" logits -m "$tiny" --tokens 1,2 --out "$tmp/o.npy" --kv-cache-dtype F32

model="${PENG_MODELS_DIR:-$src/models}/smollm2-135m-instruct-q4_1.gguf"
if [ -f "$model" ]; then
  expect "prompt longer than context" 1 "exceeds the context length" \
    "$peng" generate -m "$model" -c 16 -n 4 -p "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
  expect "token id out of range" 1 "out of range" "$peng" logits -m "$model" --tokens 1,999999 --out "$tmp/o.npy"
  # peng bench --batch: the engine's batched decode is reported next to the offline numbers.
  expect "bench batched decode" 0 '"batch1_tokens_per_s"' \
    "$peng" bench -m "$model" --pp 0 --tg 3 --reps 1 --batch 2 --json
  # ... with the compute bound of a batch from the model's multiply-adds a token: SmolLM2-135M's
  # 30 x (2 x 576^2 + 2 x 576 x 192 + 3 x 576 x 1536) + the 49152 x 576 LM head, all quantized.
  expect "bench multiply-adds a token" 0 '"int": 134479872' \
    "$peng" bench -m "$model" --pp 0 --tg 3 --reps 1 --batch 2 --json
  # ... and, in the text report, that bound over the 1-sequence rate and over one sequence's
  # bandwidth bound, each the quotient of the numbers the same report prints (to rounding).
  bench_out=$("$peng" bench -m "$model" --pp 0 --tg 3 --reps 1 --batch 2 2>&1)
  if python3 - "$bench_out" <<'PY'
import re, sys
out = sys.argv[1]
bw = float(re.search(r"; bound: ([0-9.]+) tok/s", out).group(1))
one = float(re.search(r"1 sequence: ([0-9.]+) tokens/s", out).group(1))
m = re.search(r"\): ([0-9.]+) tokens/s = ([0-9.]+)x the 1-sequence rate, "
              r"([0-9.]+)x the bandwidth bound of one sequence", out)
bound, over_one, over_bw = (float(g) for g in m.groups())
# Each printed number is rounded to 0.05 (one decimal) and each ratio to 0.005: the quotient
# of two printed numbers is off by up to that much of its own size (14.0 tok/s on a busy
# machine: 0.4% of 123).
def near(printed, num, den):
    return abs(printed - num / den) <= num / den * (0.05 / num + 0.05 / den) + 0.006
ok = near(over_one, bound, one) and near(over_bw, bound, bw)
if not ok:
    print(f"bound {bound} / 1-sequence {one} = {bound / one:.3f} (printed {over_one}), "
          f"/ bandwidth bound {bw} = {bound / bw:.3f} (printed {over_bw})")
sys.exit(0 if ok else 1)
PY
  then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL: bench bound ratios: $bench_out"
  fi
  expect "bench bad batch" 2 "batch" "$peng" bench -m "$model" --batch -1
  # peng bench --depth (llama-bench -d): the context once, then every run after it from the
  # prefix cache (a run that computed other than its pp tokens fails the bench).
  expect "bench at a depth" 0 '"depth": 32' \
    "$peng" bench -m "$model" --pp 16 --tg 3 --reps 2 --depth 32 --json
  expect "bench depth of part of a block" 1 "--depth 17 is not a multiple of the KV block size 16" \
    "$peng" bench -m "$model" --pp 16 --tg 3 --reps 1 --depth 17
  expect "bench depth with batch" 1 "not --batch" \
    "$peng" bench -m "$model" --pp 0 --tg 3 --reps 1 --depth 16 --batch 2
  expect "bench depth past the context" 1 "exceed the model's context length (8192)" \
    "$peng" bench -m "$model" --pp 16 --tg 3 --reps 1 --depth 8192
  # peng eval compare: the honest INT8 model passes, one corrupted scale (x10) fails and is named.
  "$peng" quantize -q "$model" "$tmp/smol_w8a8" --scheme w8a8 > /dev/null
  cp -r "$tmp/smol_w8a8" "$tmp/smol_bad"
  python3 - "$tmp/smol_bad/model.safetensors" <<'PY'
import json, struct, sys
with open(sys.argv[1], 'r+b') as f:
    n = struct.unpack('<Q', f.read(8))[0]
    off = 8 + n + json.loads(f.read(n))['model.layers.10.mlp.down_proj.weight_scale']['data_offsets'][0] + 4 * 7
    f.seek(off); v = struct.unpack('<f', f.read(4))[0]
    f.seek(off); f.write(struct.pack('<f', v * 10))
PY
  text="$src/tests/data/eval/gpl3_excerpt.txt"
  # A q8_0 KV cache, on the CPU and on a device (host: the device graph); its logits within
  # --max-deviation (3%) of the f16 cache's.
  expect "q8_0 kv cache on a device" 0 '"kv_cache_dtype": "q8_0"' \
    "$peng" bench -m "$model" --pp 16 --tg 2 --reps 1 --device host --kv-cache-dtype q8_0 --json
  expect "bench q8_0 kv cache" 0 '"kv_cache_dtype": "q8_0"' \
    "$peng" bench -m "$model" --pp 16 --tg 3 --reps 1 --depth 16 --kv-cache-dtype q8_0 --json
  expect "eval compare q8_0 kv cache" 0 "relative logit deviation: mean 0.0" \
    "$peng" eval compare -m "$model" --reference "$model" --kv-cache-dtype q8_0 --text "$text" --ctx 128 --max-tokens 256
  expect "eval compare honest int8" 0 "relative logit deviation: mean 0.0" \
    "$peng" eval compare -m "$tmp/smol_w8a8" --reference "$model" --exact-reference --text "$text" --ctx 128 --max-tokens 256
  # peng eval on a device (host: the device graph on the CPU kernels, the CPU engine's
  # arithmetic): the CPU engine's perplexity to the digit; compare against the CPU engine
  # (--reference-device) passes; an unknown device is named.
  ppl_cpu=$("$peng" eval ppl -m "$model" --text "$text" --ctx 128 --max-tokens 256 | grep '^PPL: ')
  expect "eval ppl on a device" 0 "${ppl_cpu:-PPL missing on the cpu}" \
    "$peng" eval ppl -m "$model" --text "$text" --ctx 128 --max-tokens 256 --device host
  expect "eval compare a device against the cpu" 0 '"passed": true' \
    "$peng" eval compare -m "$model" --reference "$model" --device host --reference-device cpu \
    --exact-reference --text "$text" --ctx 128 --max-tokens 256 --json
  expect "eval unknown device" 1 "unknown device 'tpu'" \
    "$peng" eval ppl -m "$model" --text "$text" --device tpu
  expect "eval unknown reference device" 1 "unknown device 'tpu'" \
    "$peng" eval compare -m "$model" --reference "$model" --reference-device tpu --text "$text"
  expect "eval compare corrupted scale" 1 "tensor blk.10.ffn_down.weight (relative error 0.37" \
    "$peng" eval compare -m "$tmp/smol_bad" --reference "$model" --exact-reference --text "$text" --ctx 128 --max-tokens 256
else
  echo "note: $model not found; skipping model-dependent cases"
fi

echo "cli_errors: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
