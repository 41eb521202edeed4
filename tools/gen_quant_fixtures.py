#!/usr/bin/env python3
"""Writes the DequantizeRow fixtures under tests/data/quant/ from an independent reference.

For each weight type: <type>.raw holds random raw GGUF blocks (scale fields set to finite fp16
values so every value is finite) and <type>.f32 the little-endian float32 values that the
`gguf` python package (gguf.quants.dequantize) produces for them. For the 32-value types a
second set quantizes random floats with gguf.quants.quantize, so realistic blocks are covered
as well. src/kernels/matmul_test.cc compares DequantizeRow with these for exact equality.

Usage: .venv/bin/python tools/gen_quant_fixtures.py [out_dir]
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf import quants

# (type, number of blocks)
TYPES = [
    (T.Q4_0, 4), (T.Q4_1, 4), (T.Q5_0, 4), (T.Q5_1, 4), (T.Q8_0, 4),
    (T.Q4_K, 2), (T.Q5_K, 2), (T.Q6_K, 2), (T.F16, 64), (T.BF16, 64),
]
# Byte offsets of fp16 scale fields inside one block, per type.
SCALE_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}


def random_blocks(rng, qtype, n_blocks):
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if qtype == T.F16:
        return rng.standard_normal(n_blocks).astype(np.float16).view(np.uint8)
    if qtype == T.BF16:
        f = rng.standard_normal(n_blocks).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for off in SCALE_FIELDS[qtype]:
        sign = rng.choice([-1.0, 1.0], size=n_blocks)
        d = (sign * rng.uniform(1e-3, 0.1, size=n_blocks)).astype(np.float16)
        raw[:, off:off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


def dequant(qtype, raw):
    if qtype == T.F16:
        return raw.view(np.float16).astype(np.float32)
    return quants.dequantize(raw, qtype).astype(np.float32).reshape(-1)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "tests", "data", "quant")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(1234)
    for qtype, n_blocks in TYPES:
        sets = [random_blocks(rng, qtype, n_blocks)]
        if GGML_QUANT_SIZES[qtype][0] == 32:
            x = rng.standard_normal(32 * n_blocks).astype(np.float32)
            sets.append(quants.quantize(x.reshape(1, -1), qtype).reshape(-1))
        raw = np.concatenate(sets).astype(np.uint8)
        vals = dequant(qtype, raw)
        assert np.all(np.isfinite(vals))
        name = qtype.name.lower()
        raw.tofile(os.path.join(out, name + ".raw"))
        vals.astype("<f4").tofile(os.path.join(out, name + ".f32"))
        print(f"{name}: {raw.size} bytes -> {vals.size} values")


if __name__ == "__main__":
    main()
