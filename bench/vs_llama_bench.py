#!/usr/bin/env python3
"""peng vs llama.cpp's own llama-bench: prefill (ppP) and decode (tgG) on the same GGUF file.

Repetitions alternate (peng, llama-bench, peng, ...), each in a fresh process, so both see
the same machine noise; the peer runs at its defaults (weight repacking on, its own choice of
batch sizes), only -t, -p, -n, -d and -r 1 are given, and with --kv-cache-dtype q8_0 the same
KV cache type on both sides (llama-bench -ctk q8_0 -ctv q8_0; llama.cpp then rotates the rows by a
Hadamard transform as peng does). Every peng repetition also measures the
machine's read bandwidth with the widest loads on all threads (`peng bench`'s probe), so
decode is reported as a share of the bandwidth measured in the same run:
share = tg tokens/s x weight bytes read per token / bandwidth.

Usage (from the repository root; bench/build_llama_server.sh builds llama-bench):
  python3 bench/vs_llama_bench.py -m models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
      -t 2 --pp 512 --tg 128 --reps 5 [--depth 4096] [--kv-cache-dtype q8_0] \
      [--json out/vs.json] [--markdown]

Needs only the Python standard library.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys


def run_peng(peng, model, threads, pp, tg, depth, kv):
    cmd = [peng, "bench", "-m", model, "-t", str(threads), "--pp", str(pp), "--tg", str(tg),
           "--depth", str(depth), "--reps", "1", "--json", "--kv-cache-dtype", kv]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    j = json.loads(out)
    return {
        "pp": j["pp"]["tokens_per_s"][0] if pp else None,
        "tg": j["tg"]["tokens_per_s"][0] if tg else None,
        "bw_gbs": j["mem_bandwidth_gbs"],
        "bytes_per_token": j["weight_bytes_per_token"],
    }


def run_llama_bench(llama_bench, model, threads, pp, tg, depth, kv):
    cmd = [llama_bench, "-m", model, "-t", str(threads), "-r", "1", "-o", "json",
           "-p", str(pp), "-n", str(tg), "-d", str(depth)]
    if kv != "f16":  # (f16 is llama-bench's default)
        cmd += ["-ctk", kv, "-ctv", kv]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    res = {"pp": None, "tg": None}
    for row in json.loads(out):
        if row.get("n_prompt", 0) > 0 and row.get("n_gen", 0) == 0:
            res["pp"] = row["avg_ts"]
        elif row.get("n_gen", 0) > 0 and row.get("n_prompt", 0) == 0:
            res["tg"] = row["avg_ts"]
    return res


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("-d", "--depth", type=int, default=0,
                    help="tokens of context before each test (llama-bench -d; peng --depth)")
    ap.add_argument("--kv-cache-dtype", default="f16", choices=["f16", "q8_0"],
                    help="the KV cache's type on both sides")
    ap.add_argument("--peng", default="build/tools/peng")
    ap.add_argument("--llama-bench", default="out/llama.cpp/bin/llama-bench")
    ap.add_argument("--json", help="write all repetitions and medians here")
    ap.add_argument("--markdown", action="store_true", help="print a docs/benchmarks.md row")
    a = ap.parse_args()
    for path in (a.peng, a.llama_bench, a.model):
        if not os.path.exists(path):
            sys.exit(f"vs_llama_bench: {path} does not exist")

    peng_runs, peer_runs = [], []
    for rep in range(a.reps):
        peng_runs.append(run_peng(a.peng, a.model, a.threads, a.pp, a.tg, a.depth,
                                  a.kv_cache_dtype))
        peer_runs.append(run_llama_bench(a.llama_bench, a.model, a.threads, a.pp, a.tg, a.depth,
                                         a.kv_cache_dtype))
        p, q = peng_runs[-1], peer_runs[-1]
        print(f"rep {rep + 1}/{a.reps}: peng pp {p['pp']} tg {p['tg']} (bw {p['bw_gbs']:.1f} GB/s)"
              f" | llama-bench pp {q['pp']} tg {q['tg']}", file=sys.stderr)

    bw = med([r["bw_gbs"] for r in peng_runs])
    bpt = peng_runs[0]["bytes_per_token"]
    res = {"model": a.model, "threads": a.threads, "pp": a.pp, "tg": a.tg, "depth": a.depth,
           "kv_cache_dtype": a.kv_cache_dtype, "reps": a.reps,
           "weight_bytes_per_token": bpt, "bandwidth_gbs_median": bw,
           "peng": peng_runs, "llama_bench": peer_runs}
    for test in ("pp", "tg"):
        mp = med([r[test] for r in peng_runs])
        ml = med([r[test] for r in peer_runs])
        res[test + "_median"] = {"peng": mp, "llama_bench": ml,
                                 "ratio": mp / ml if mp and ml else None}
    tg = res["tg_median"]["peng"]
    # Share of the read bandwidth: each repetition against its own probe, then the median.
    shares = [r["tg"] * r["bytes_per_token"] / (r["bw_gbs"] * 1e9)
              for r in peng_runs if r["tg"] and r["bw_gbs"]]
    res["tg_bandwidth_share_median"] = med(shares)

    name = os.path.basename(a.model)
    at = (f" @ d{a.depth}" if a.depth else "") + \
        (f" (KV {a.kv_cache_dtype})" if a.kv_cache_dtype != "f16" else "")
    for test, n in (("pp", a.pp), ("tg", a.tg)):
        m = res[test + "_median"]
        if m["peng"] is None:
            continue
        ratio = f"{m['ratio']:.2f}x" if m["ratio"] else "-"
        peer = f"{m['llama_bench']:.1f}" if m["llama_bench"] else "-"
        print(f"{name} {test}{n}{at}: peng {m['peng']:.1f} tok/s, llama-bench {peer} tok/s, {ratio}")
    if tg:
        # (after a context decode also reads its keys and values, not counted here)
        print(f"{name} decode{at}: {bpt / 1e6:.1f} MB of weights/token, read bandwidth median "
              f"{bw:.1f} GB/s, share {100 * res['tg_bandwidth_share_median']:.0f}% "
              "(median over reps)")
    if a.markdown:
        pp, tgm = res["pp_median"], res["tg_median"]
        share = res["tg_bandwidth_share_median"]
        print(f"| {name}{at} | {pp['peng']:.1f} | {pp['llama_bench']:.1f} | **{pp['ratio']:.2f}** | "
              f"{tgm['peng']:.1f} | {tgm['llama_bench']:.1f} | **{tgm['ratio']:.2f}** | "
              f"{bw:.1f} | {100 * share:.0f}% |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
