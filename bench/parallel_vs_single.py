#!/usr/bin/env python3
"""Tensor, data or pipeline parallelism against one process on one machine (docs/benchmarks.md).

Alternates, round by round, `peng bench` in one process with --threads T and the same bench
as an MPI job of N ranks with --threads T/N each (`-tp N`, or `-dp N` with --data-parallel for
the batched decode, or `-pp N` with --pipeline-parallel), on the same model file, and prints the medians of every run's
repetitions and the ratio (parallel / one process). Both sides see the same machine state in
each round, so a shared, noisy machine moves them together.

  bench/parallel_vs_single.py -m models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
      --ranks 2 --threads 2 --pp 128 --tg 64 --reps 3 --rounds 3
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out[out.index("{"):])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--peng", default=os.path.join(HERE, "..", "build", "tools", "peng"))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="threads of the one process")
    ap.add_argument("--pp", type=int, default=128)
    ap.add_argument("--tg", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=0, help="also the batched decode of N sequences")
    ap.add_argument("--data-parallel", action="store_true",
                    help="the ranks are data-parallel replicas (-dp) instead of -tp")
    ap.add_argument("--pipeline-parallel", action="store_true",
                    help="the ranks are pipeline stages (-pp) instead of -tp")
    a = ap.parse_args()
    common = ["bench", "-m", a.model, "--pp", str(a.pp), "--tg", str(a.tg), "--reps",
              str(a.reps), "--json"]
    if a.batch:
        common += ["--batch", str(a.batch)]
    single = [a.peng] + common + ["-t", str(a.threads)]
    layout = ["-dp" if a.data_parallel else "-pp" if a.pipeline_parallel else "-tp", str(a.ranks)]
    parallel = ["mpirun", "-np", str(a.ranks), "--bind-to", "core", "--oversubscribe",
                a.peng] + common + ["-t", str(max(1, a.threads // a.ranks))] + layout
    print("one process:", " ".join(single))
    print("parallel:   ", " ".join(parallel))
    keys = ["pp", "tg"] + (["batched"] if a.batch else [])
    got = {"single": {k: [] for k in keys}, "parallel": {k: [] for k in keys}}
    for r in range(a.rounds):
        for side, cmd in (("single", single), ("parallel", parallel)):
            j = run(cmd)
            for k in keys:
                if k == "batched":
                    got[side][k] += j["batch"]["tokens_per_s"]
                elif j.get(k):
                    got[side][k] += j[k]["tokens_per_s"]
        print(f"round {r + 1}: " + ", ".join(
            f"{k} {got['single'][k][-1]:.1f} / {got['parallel'][k][-1]:.1f}" for k in keys
            if got["single"][k]), flush=True)
    print(f"\n{'test':8} {'one process':>12} {'parallel':>10} {'ratio':>7}   (medians, tokens/s)")
    for k in keys:
        if not got["single"][k]:
            continue
        s, p = statistics.median(got["single"][k]), statistics.median(got["parallel"][k])
        print(f"{k:8} {s:12.1f} {p:10.1f} {p / s:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
