#!/usr/bin/env bash
# Fuzzes everything untrusted that peng reads with libFuzzer + ASan + UBSan: the model file
# readers (gguf, safetensors) and what an HTTP client can send (request: JSON body -> parsed
# request -> chat template -> tokenizer -> sampler; jinja: chat templates; tokenizer: encode,
# decode, streaming decode).
# Usage: scripts/fuzz.sh [seconds per target, default 30] [target ...]
# Configures a clang build in build-fuzz (override with PENG_FUZZ_BUILD), builds the targets,
# seeds each from its committed corpus fuzz/corpus/<target>/ (gguf and safetensors also get a
# few generated files), runs the targets for the given time each (as many side by side as there
# are cores, or PENG_FUZZ_JOBS) and exits non-zero if any target found a crash, leak, hang,
# out-of-memory or sanitizer report. The seeds are copied to build-fuzz/fuzz-seeds/ and new
# inputs go to build-fuzz/fuzz-corpus/; nothing under fuzz/ is written. Reproducers are left in
# build-fuzz/fuzz-artifacts/ and their paths printed; replay one with
# build-fuzz/fuzz/<target>_fuzz <file>.
set -euo pipefail

secs="${1:-30}"
shift || true
all_targets=(gguf safetensors request jinja tokenizer grammar)
targets=("$@")
[[ ${#targets[@]} -eq 0 ]] && targets=("${all_targets[@]}")
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${PENG_FUZZ_BUILD:-$root/build-fuzz}"
jobs="${PENG_FUZZ_BUILD_JOBS:-2}"
cxx="$(command -v clang++-14 || command -v clang++)"
cc="$(command -v clang-14 || command -v clang)"

for t in "${targets[@]}"; do
  [[ " ${all_targets[*]} " == *" $t "* ]] || { echo "fuzz.sh: unknown target '$t'" >&2; exit 2; }
done

cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_CXX_FLAGS="-fno-sanitize-recover=all" \
  -DPENG_FUZZ=ON -DPENG_SANITIZE=address,undefined \
  -DPENG_BUILD_TESTS=OFF -DPENG_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" --target "${targets[@]/%/_fuzz}" -j"$jobs"

seeds="$build/fuzz-seeds"
rm -rf "$seeds"
mkdir -p "$seeds" "$build/fuzz-artifacts"
for t in "${targets[@]}"; do
  mkdir -p "$seeds/$t" "$build/fuzz-corpus/$t"
  if [[ -d "$root/fuzz/corpus/$t" ]]; then cp "$root/fuzz/corpus/$t/"* "$seeds/$t/"; fi
done

# A few small valid files of each model format, generated (not committed).
python3 - "$seeds" <<'PY'
import json, os, struct, sys
out = sys.argv[1]

def s(x):
    b = x.encode()
    return struct.pack('<Q', len(b)) + b

def gguf(version, kvs, tensors, align=32):
    body = b''
    for key, typ, payload in kvs:
        body += s(key) + struct.pack('<I', typ) + payload
    infos, data, off = b'', b'', 0
    for name, dims, ggml, raw in tensors:
        infos += s(name) + struct.pack('<I', len(dims)) + b''.join(struct.pack('<Q', d) for d in dims)
        infos += struct.pack('<IQ', ggml, off)
        data += raw + b'\0' * (-len(raw) % align)
        off = len(data)
    head = b'GGUF' + struct.pack('<IQQ', version, len(tensors), len(kvs)) + body + infos
    return head + b'\0' * (-len(head) % align) + data

if os.path.isdir(f'{out}/gguf'):
    kvs = [
        ('general.architecture', 8, s('llama')),
        ('u8', 0, struct.pack('<B', 7)), ('i8', 1, struct.pack('<b', -7)),
        ('u16', 2, struct.pack('<H', 700)), ('i16', 3, struct.pack('<h', -700)),
        ('u32', 4, struct.pack('<I', 70000)), ('i32', 5, struct.pack('<i', -70000)),
        ('f32', 6, struct.pack('<f', 0.5)), ('bool', 7, b'\1'),
        ('u64', 10, struct.pack('<Q', 1 << 40)), ('i64', 11, struct.pack('<q', -1)),
        ('f64', 12, struct.pack('<d', 0.25)),
        ('tokens', 9, struct.pack('<IQ', 8, 3) + s('<s>') + s('') + s('hi')),
        ('ids', 9, struct.pack('<IQ', 5, 2) + struct.pack('<ii', 1, -1)),
    ]
    tensors = [
        ('a', [3, 2], 0, struct.pack('<6f', *range(6))),
        ('q', [32, 2], 8, bytes(range(68))),
        ('h', [4], 1, bytes(8)),
    ]
    with open(f'{out}/gguf/v3.gguf', 'wb') as f: f.write(gguf(3, kvs, tensors))
    with open(f'{out}/gguf/v2_small.gguf', 'wb') as f: f.write(gguf(2, kvs[:2], tensors[:1]))
    with open(f'{out}/gguf/align64.gguf', 'wb') as f:
        f.write(gguf(3, [('general.alignment', 4, struct.pack('<I', 64))], tensors, 64))
    with open(f'{out}/gguf/empty.gguf', 'wb') as f: f.write(gguf(3, [], []))

def st(entries, meta=None):
    header, data = {}, b''
    if meta: header['__metadata__'] = meta
    for name, dtype, shape, raw in entries:
        header[name] = {'dtype': dtype, 'shape': shape, 'data_offsets': [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(header, separators=(',', ':')).encode()
    h += b' ' * (-len(h) % 8)
    return struct.pack('<Q', len(h)) + h + data

if os.path.isdir(f'{out}/safetensors'):
    with open(f'{out}/safetensors/two.safetensors', 'wb') as f:
        f.write(st([('w', 'F32', [2, 2], bytes(16)), ('b', 'BF16', [3], bytes(6))], {'format': 'pt'}))
    with open(f'{out}/safetensors/types.safetensors', 'wb') as f:
        f.write(st([('a', 'F16', [1], bytes(2)), ('b', 'F64', [], bytes(8)), ('c', 'I8', [0, 3], b''),
                    ('d', 'I32', [1], bytes(4)), ('e', 'I64', [1], bytes(8)), ('f', 'I16', [1], bytes(2))]))
PY

# Per target: longest input, per-input time limit (s), memory limit (MB; also the largest
# single allocation). Request bodies go up to 64 KB (plus the 9 bytes of endpoint and seed).
declare -A max_len=([gguf]=4096 [safetensors]=4096 [request]=65545 [jinja]=16384 [tokenizer]=8192 [grammar]=4096)
declare -A timeout=([gguf]=10 [safetensors]=10 [request]=30 [jinja]=30 [tokenizer]=10 [grammar]=10)
declare -A rss=([gguf]=2048 [safetensors]=2048 [request]=2048 [jinja]=2560 [tokenizer]=2048 [grammar]=2048)

# A target is one process on one core: $PENG_FUZZ_JOBS (default: the cores) run side by side.
run() {  # run NAME: fuzzes one target, then prints its report; returns 1 on a finding
  local name="$1"
  local dict="$root/fuzz/dict/$name.dict"
  local args=(-max_total_time="$secs" -max_len="${max_len[$name]}" -timeout="${timeout[$name]}"
              -rss_limit_mb="${rss[$name]}" -print_final_stats=1
              -artifact_prefix="$build/fuzz-artifacts/${name}-")
  [[ -f "$dict" ]] && args+=(-dict="$dict")
  local rc=0 report="== $name: ${secs}s"
  "$build/fuzz/${name}_fuzz" "${args[@]}" "$build/fuzz-corpus/$name" "$seeds/$name" \
    >"$build/fuzz-$name.log" 2>&1 || rc=1
  if [[ $rc -ne 0 ]]; then
    report+=$'\n'"!! $name: finding; see $build/fuzz-$name.log"$'\n'
    report+=$(tail -n 40 "$build/fuzz-$name.log"
              grep -ho "Test unit written to .*" "$build/fuzz-$name.log" |
                sed 's/^/!! reproducer: /' || true)
  else
    report+=$'\n'$(grep -E "stat::number_of_executed_units|Done [0-9]+ runs" \
                      "$build/fuzz-$name.log" || true)
  fi
  printf '%s\n' "$report"  # the whole report at once: targets run side by side
  return "$rc"
}
parallel="${PENG_FUZZ_JOBS:-$(nproc)}"
status=0
running=0
for t in "${targets[@]}"; do
  if (( running >= parallel )); then
    wait -n || status=1
    running=$((running - 1))
  fi
  run "$t" &
  running=$((running + 1))
done
while (( running > 0 )); do
  wait -n || status=1
  running=$((running - 1))
done
exit "$status"
