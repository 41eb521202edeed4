#!/usr/bin/env python3
"""Compares peng's CPU speed with llama.cpp's on the same GGUF file and thread count.

Measures prompt processing (pp: P tokens in one batch) and generation (tg: G tokens,
one at a time) in tokens/s, for both engines, R repetitions each. The repetitions
alternate (peng, llama.cpp, peng, ...) so that both see the same machine noise, and
every repetition runs in a fresh process (peng: `peng bench --reps 1`; llama.cpp: this
script as a worker through llama-cpp-python), so no idle thread pool of one engine
spins while the other one runs.

  llama.cpp pp: n_batch = n_ubatch = P, KV cache cleared, P random token ids decoded in
                one llama_decode, after a warm-up decode.
  llama.cpp tg: an 8-token prompt (untimed), then G single-token decodes (argmax of the
                previous step is not needed for speed; the token ids are random).

Usage (from the repository root, .venv from scripts/setup_dev.sh):
  .venv/bin/python bench/compare_llamacpp.py -m models/smollm2-135m-instruct-q4_1.gguf \
      -t 2 --pp 512 --tg 128 --reps 5 --out out/bench.json
  ... --llamacpp-only      measure llama.cpp alone (no peng binary needed)
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

TG_PROMPT_TOKENS = 8


# ---------------------------------------------------------------- llama.cpp worker

def llamacpp_worker(model, threads, pp, tg, reps):
    """Runs in its own process; prints one JSON object with per-rep tokens/s."""
    import numpy as np
    import llama_cpp

    # llama.cpp runs at its defaults (weight repacking on): peng has no switch for the same.
    n_ctx = max(pp, TG_PROMPT_TOKENS + tg) + 16
    llm = llama_cpp.Llama(model_path=model, n_ctx=n_ctx, n_batch=max(pp, 32),
                          n_ubatch=max(pp, 32), n_threads=threads, n_threads_batch=threads,
                          logits_all=False, seed=0, verbose=False)
    rng = np.random.default_rng(0)
    n_vocab = llm.n_vocab()

    def tokens(n):
        return [int(t) for t in rng.integers(0, n_vocab, size=n)]

    def decode(toks):
        llm.eval(toks)
        llama_cpp.llama_synchronize(llm._ctx.ctx)

    def clear():
        llm.reset()
        llm._ctx.kv_cache_clear()

    clear()
    decode(tokens(min(pp, 32)))  # warm-up: pages weights in, spins up threads
    decode(tokens(1))

    out = {"pp": [], "tg": []}
    for _ in range(reps):
        if pp > 0:
            clear()
            batch = tokens(pp)
            t0 = time.perf_counter()
            decode(batch)
            out["pp"].append(pp / (time.perf_counter() - t0))
        if tg > 0:
            clear()
            decode(tokens(TG_PROMPT_TOKENS))
            steps = tokens(tg)
            t0 = time.perf_counter()
            for tok in steps:
                decode([tok])
            out["tg"].append(tg / (time.perf_counter() - t0))
    out["version"] = llama_cpp.__version__
    out["system_info"] = llama_cpp.llama_print_system_info().decode().strip()
    print(json.dumps(out))


# ---------------------------------------------------------------- orchestration

def run_llamacpp(args, reps):
    cmd = [sys.executable, os.path.abspath(__file__), "--llamacpp-worker", "-m", args.model,
           "-t", str(args.threads), "--pp", str(args.pp), "--tg", str(args.tg),
           "--reps", str(reps)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"llama.cpp worker failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_peng(args, reps):
    cmd = [args.peng, "bench", "-m", args.model, "--pp", str(args.pp), "--tg", str(args.tg),
           "--reps", str(reps), "-t", str(args.threads), "--json"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"peng bench failed ({res.returncode}): {' '.join(cmd)}\n{res.stderr[-3000:]}")
    return parse_last_json(res.stdout)


def parse_last_json(text):
    """The JSON object is the last thing peng prints; log lines may precede it."""
    text = text.strip()
    start = 0 if text.startswith("{") else text.rindex("\n{") + 1
    return json.loads(text[start:])


def stats(samples):
    if not samples:
        return None
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples),
            "samples": samples}


def host_info():
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "machine": platform.machine(), "nproc": os.cpu_count()}


def measure(args):
    peng_pp, peng_tg, ll_pp, ll_tg = [], [], [], []
    peng_last, ll_last = None, None
    for rep in range(args.reps):
        if not args.llamacpp_only:
            peng_last = run_peng(args, 1)
            peng_pp += peng_last["pp"]["tokens_per_s"]
            peng_tg += peng_last["tg"]["tokens_per_s"]
        if not args.peng_only:
            ll_last = run_llamacpp(args, 1)
            ll_pp += ll_last["pp"]
            ll_tg += ll_last["tg"]
        print(f"rep {rep + 1}/{args.reps} done", file=sys.stderr)

    result = {"model": os.path.basename(args.model), "threads": args.threads,
              "pp_n": args.pp, "tg_n": args.tg, "reps": args.reps, "host": host_info()}
    if peng_last:
        result["peng"] = {"isa": peng_last.get("isa"), "pp": stats(peng_pp),
                          "tg": stats(peng_tg),
                          "weight_bytes_per_token": peng_last.get("weight_bytes_per_token"),
                          "mem_bandwidth_gbs": peng_last.get("mem_bandwidth_gbs")}
    if ll_last:
        result["llamacpp"] = {"version": ll_last["version"],
                              "system_info": ll_last["system_info"],
                              "pp": stats(ll_pp), "tg": stats(ll_tg)}
    if peng_last and ll_last:
        result["ratio_peng_over_llamacpp"] = {
            k: result["peng"][k]["median"] / result["llamacpp"][k]["median"]
            for k in ("pp", "tg") if result["peng"][k] and result["llamacpp"][k]}
    return result


def print_table(r):
    print(f"\nmodel {r['model']}  threads {r['threads']}  reps {r['reps']}  "
          f"({r['host']['cpu']})")
    engines = [e for e in ("peng", "llamacpp") if e in r]
    head = f"{'test':8s}" + "".join(f"{e + ' med':>14s}{'min':>9s}{'max':>9s}" for e in engines)
    if len(engines) == 2:
        head += f"{'peng/llama':>12s}"
    print(head + "   (tokens/s)")
    for k, n in (("pp", r["pp_n"]), ("tg", r["tg_n"])):
        if n <= 0:
            continue
        line = f"{k + str(n):8s}"
        for e in engines:
            s = r[e][k]
            line += f"{s['median']:14.1f}{s['min']:9.1f}{s['max']:9.1f}"
        if len(engines) == 2:
            line += f"{r['ratio_peng_over_llamacpp'][k]:12.2f}"
        print(line)
    p = r.get("peng")
    if p and p.get("weight_bytes_per_token") and p.get("mem_bandwidth_gbs") and p["tg"]:
        limit = p["mem_bandwidth_gbs"] * 1e9 / p["weight_bytes_per_token"]
        print(f"tg bandwidth limit {limit:.1f} tokens/s ({p['weight_bytes_per_token'] / 1e6:.1f}"
              f" MB/token at {p['mem_bandwidth_gbs']:.1f} GB/s): peng reaches "
              f"{100 * p['tg']['median'] / limit:.0f}%")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--peng", default="build/tools/peng", help="path of the peng binary")
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--llamacpp-only", action="store_true")
    ap.add_argument("--peng-only", action="store_true")
    ap.add_argument("--llamacpp-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.llamacpp_worker:
        llamacpp_worker(args.model, args.threads, args.pp, args.tg, args.reps)
        return
    if args.llamacpp_only and args.peng_only:
        ap.error("--llamacpp-only and --peng-only exclude each other")

    result = measure(args)
    print_table(result)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
