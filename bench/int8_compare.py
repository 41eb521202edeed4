#!/usr/bin/env python3
"""INT8 vs F16/BF16 side by side (issue 5): decode and prompt-processing tokens/s of the same
model converted by `peng quantize` into several storage schemes, plus W8A8 prompt processing
with the AVX-512 VNNI kernels vs the AVX2 ones (PENG_ISA=avx2) in the same run.

Every configuration runs once per round, rounds alternate (the machine is shared and noisy),
and the medians over rounds are reported with the ratio to the F16 baseline.

Usage: bench/int8_compare.py --peng build/tools/peng --gguf models/X.gguf --work /tmp/int8b
       [--threads 2] [--pp 256] [--tg 64] [--rounds 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

# name -> (peng quantize arguments, extra environment)
CONFIGS = [
    ("f16", ["--scheme", "f16"], {}),
    ("bf16", ["--scheme", "bf16"], {}),
    ("w8a16", ["--scheme", "w8a16", "--float-dtype", "f16"], {}),
    ("w8a8", ["--scheme", "w8a8", "--float-dtype", "f16"], {}),
    ("w8a8-all", ["--scheme", "w8a8", "--no-default-skip"], {}),
    ("w8a8-all/avx2", None, {"PENG_ISA": "avx2"}),
]


def run(cmd, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(cmd, check=True, capture_output=True, text=True, env=e).stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peng", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=256)
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    for name, qargs, _ in CONFIGS:
        out = os.path.join(a.work, name)
        if qargs is not None and not os.path.exists(out):
            print(run([a.peng, "quantize", "-q", a.gguf, out] + qargs).strip(), file=sys.stderr)
    pp = {n: [] for n, _, _ in CONFIGS}
    tg = {n: [] for n, _, _ in CONFIGS}
    info = {}
    for r in range(a.rounds):
        for name, _, env in CONFIGS:
            folder = os.path.join(a.work, name.split("/")[0])
            j = json.loads(run([a.peng, "bench", "-m", folder, "--pp", str(a.pp), "--tg",
                                str(a.tg), "--reps", "1", "-t", str(a.threads), "--json"], env))
            pp[name] += j["pp"]["tokens_per_s"]
            tg[name] += j["tg"]["tokens_per_s"]
            info[name] = (j["weight_bytes_per_token"], j["isa"])
            print(f"round {r + 1} {name}: pp {pp[name][-1]:.1f} tg {tg[name][-1]:.2f}",
                  file=sys.stderr)
    base_pp, base_tg = statistics.median(pp["f16"]), statistics.median(tg["f16"])
    print(f"| scheme | ISA | weights/token | pp{a.pp} tok/s | vs F16 | tg{a.tg} tok/s | vs F16 |")
    print("|---|---|---|---|---|---|---|")
    for name, _, _ in CONFIGS:
        mp, mt = statistics.median(pp[name]), statistics.median(tg[name])
        wb, isa = info[name]
        print(f"| {name} | {isa} | {wb / 1e6:.0f} MB | {mp:.1f} | {mp / base_pp:.2f}x | "
              f"{mt:.2f} | {mt / base_tg:.2f}x |")


if __name__ == "__main__":
    main()
