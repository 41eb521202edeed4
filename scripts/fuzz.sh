#!/usr/bin/env bash
# Fuzzes the readers of untrusted model files (GGUF, safetensors) with libFuzzer + ASan + UBSan.
# Usage: scripts/fuzz.sh [seconds per target, default 30]
# Configures a clang build in build-fuzz (override with PENG_FUZZ_BUILD), builds gguf_fuzz and
# safetensors_fuzz, writes a small seed corpus, runs each target for the given time and exits
# non-zero if any target found a crash, leak, hang or sanitizer report (reproducers are left in
# build-fuzz/fuzz-artifacts/).
set -euo pipefail

secs="${1:-30}"
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${PENG_FUZZ_BUILD:-$root/build-fuzz}"
jobs="${PENG_FUZZ_BUILD_JOBS:-2}"
cxx="$(command -v clang++-14 || command -v clang++)"
cc="$(command -v clang-14 || command -v clang)"

cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_CXX_FLAGS="-fno-sanitize-recover=all" \
  -DPENG_FUZZ=ON -DPENG_SANITIZE=address,undefined \
  -DPENG_BUILD_TESTS=OFF -DPENG_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" --target gguf_fuzz safetensors_fuzz -j"$jobs"

seeds="$build/fuzz-seeds"
rm -rf "$seeds"
mkdir -p "$seeds/gguf" "$seeds/safetensors" "$build/fuzz-corpus/gguf" \
  "$build/fuzz-corpus/safetensors" "$build/fuzz-artifacts"

# Seeds are generated, not committed: a few small valid files of each format.
python3 - "$seeds" <<'PY'
import json, struct, sys
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

with open(f'{out}/safetensors/two.safetensors', 'wb') as f:
    f.write(st([('w', 'F32', [2, 2], bytes(16)), ('b', 'BF16', [3], bytes(6))], {'format': 'pt'}))
with open(f'{out}/safetensors/types.safetensors', 'wb') as f:
    f.write(st([('a', 'F16', [1], bytes(2)), ('b', 'F64', [], bytes(8)), ('c', 'I8', [0, 3], b''),
                ('d', 'I32', [1], bytes(4)), ('e', 'I64', [1], bytes(8)), ('f', 'I16', [1], bytes(2))]))
PY

cat > "$build/fuzz-seeds/safetensors.dict" <<'DICT'
"\"dtype\""
"\"shape\""
"\"data_offsets\""
"\"__metadata__\""
"\"F32\""
"\"BF16\""
"\"I64\""
"18446744073709551615"
DICT

status=0
run() {
  local name="$1" dict="${2:-}"
  echo "== $name: ${secs}s"
  local args=(-max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=2048
              -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/${name}-")
  [[ -n "$dict" ]] && args+=(-dict="$dict")
  if ! "$build/fuzz/${name}_fuzz" "${args[@]}" "$build/fuzz-corpus/$name" "$seeds/$name" \
      >"$build/fuzz-$name.log" 2>&1; then
    echo "!! $name: finding; see $build/fuzz-$name.log and $build/fuzz-artifacts/"
    tail -n 40 "$build/fuzz-$name.log"
    status=1
  else
    grep -E "stat::number_of_executed_units|Done [0-9]+ runs" "$build/fuzz-$name.log" || true
  fi
}
run gguf
run safetensors "$build/fuzz-seeds/safetensors.dict"
exit "$status"
