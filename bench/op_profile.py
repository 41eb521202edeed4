#!/usr/bin/env python3
"""Where a decode step spends its time: `perf record` of `peng bench --pp 0 --tg N`, samples
grouped into op classes, as a share of the step.

Samples in model loading and the bandwidth probe (tokenizer, weight binding, ReadSum) and in
the OS kernel (page faults of the mmap'd file at load, scheduler) are counted apart
("excluded") and the shares are of the remaining user-space samples, which are the decode
steps. Symbols are matched by name (the kernels are templates named after their block type),
so the classes are: GEMV per weight type (matmul tiles and packed-panel tiles with one token,
the AVX-512 PanelGemv; GEMM for tiles of several tokens and per-call packing), INT8 GEMV (W8A8 /
W8A16), attention (paged, MLA, the dot/axpy row ops), norms, RoPE, activation functions,
activation quantization, thread-pool waits (a thread that finished its share spinning until
the others are done, plus waking), and other (sampler, engine, copies).

Usage (from the repository root; needs perf):
  python3 bench/op_profile.py -m models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf -t 2 \
      [--tg 128 --reps 3] [--peng build/tools/peng] [--json out/prof.json]
Several -m print one table with a column per model.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

DTYPES = ["F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64", "Q4_0", "Q4_1", "Q5_0",
          "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K"]

EXCLUDED = re.compile(r"ReadSum|MeasureReadBandwidth|MeasurePeak|Tokenizer|Bind|Load|Gguf|"
                      r"DequantizeRow|ModelFiles|MappedFile|Parse|Vocab|Merge|_dl_|ld-linux|"
                      # load-time packing (PackPanels), string-keyed tables (vocabulary, files)
                      r"PackPanels|PackKQuantPanels|PackRowGroups|PackSuperBlock|"
                      r"_Hashtable<std::__cxx11::basic_string")


def classify(sym, kernel_mode):
    if kernel_mode:
        return None
    if EXCLUDED.search(sym):
        return None
    m = re.search(r"Tile(?:32|K)<[^<>]*?KQ(\w+?), (\d+), (\d+)>", sym)
    if m:
        return ("GEMV " if m.group(3) == "1" else "GEMM ") + "Q" + m.group(1)
    # The packed panels: PanelTile<KQ.., T, source>, PanelTileQ4K<T>, PanelTileQ6K<T> (T tokens).
    m = re.search(r"PanelTile<[^<>]*?KQ(\w+?), (\d+),", sym)
    if m:
        return ("GEMV " if m.group(2) == "1" else "GEMM ") + "Q" + m.group(1)
    m = re.search(r"PanelTileQ(\d)K<(\d+)>", sym)
    if m:
        return ("GEMV " if m.group(2) == "1" else "GEMM ") + "Q" + m.group(1) + "_K"
    m = re.search(r"(PanelGemv|PackPanel)<[^<>]*?KQ(\w+?)[>,]", sym)
    if m:
        return ("GEMV " if m.group(1) == "PanelGemv" else "GEMM ") + "Q" + m.group(2)
    # Float weights: TileF<type, R, T> (row-major), PanelTileF<type, T> (row groups).
    m = re.search(r"TileF<\(peng::DType\)(\d+), (?:\d+, )?(\d+)>", sym)
    if m:
        name = DTYPES[int(m.group(1))] if int(m.group(1)) < len(DTYPES) else m.group(1)
        return ("GEMV " if m.group(2) == "1" else "GEMM ") + name
    if re.search(r"TileW8A8|W8A8", sym):
        return "GEMV INT8 (W8A8)"
    if re.search(r"TileW8A16|W8A16", sym):
        return "GEMV INT8 (W8A16)"
    if re.search(r"i8mm|Smmla|Tile2x2", sym, re.I):
        return "GEMM (i8mm)"
    if re.search(r"Attention|Attend|DotRows|AxpyRows|ExpShiftSum|Softmax|Mla|KvWrite|KvRead", sym):
        return "attention"
    if re.search(r"RmsNorm|LayerNorm", sym):
        return "norms"
    if re.search(r"Rope", sym):
        return "RoPE"
    if re.search(r"SiluMul|GeluTanhMul|Silu|Gelu", sym):
        return "activation fn"
    if re.search(r"QuantizeAct|QuantizeActivations", sym):
        return "activation quantization"
    if re.search(r"ThreadPool::(RunImpl|WorkerLoop)|pthread_cond|futex", sym):
        return "thread-pool wait"
    return "other"


def profile(peng, model, threads, tg, reps, freq):
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "perf.data")
        subprocess.run(["perf", "record", "-q", "-F", str(freq), "-o", data, "--", peng, "bench",
                        "-m", model, "-t", str(threads), "--pp", "0", "--tg", str(tg),
                        "--reps", str(reps)], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        rep = subprocess.run(["perf", "report", "-i", data, "--stdio", "--no-children",
                              "--sort", "symbol", "-F", "overhead,sym"], check=True,
                             capture_output=True, text=True).stdout
    classes, excluded = {}, 0.0
    for line in rep.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+\[(.)\]\s+(.*\S)", line)
        if not m:
            continue
        pct, mode, sym = float(m.group(1)), m.group(2), m.group(3)
        c = classify(sym, mode == "k")
        if c is None:
            excluded += pct
        else:
            classes[c] = classes.get(c, 0.0) + pct
    total = sum(classes.values())
    return {"excluded_pct_of_samples": excluded,
            "classes": {k: 100 * v / total for k, v in classes.items()} if total else {}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", action="append", required=True)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--freq", type=int, default=4000, help="perf sampling frequency (Hz)")
    ap.add_argument("--peng", default="build/tools/peng")
    ap.add_argument("--json")
    a = ap.parse_args()
    res = {}
    for m in a.model:
        if not os.path.exists(m):
            sys.exit(f"op_profile: {m} does not exist")
        res[os.path.basename(m)] = profile(a.peng, m, a.threads, a.tg, a.reps, a.freq)
    names = list(res)
    classes = sorted({c for r in res.values() for c in r["classes"]},
                     key=lambda c: -max(r["classes"].get(c, 0) for r in res.values()))
    print("| op class | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for c in classes:
        print(f"| {c} | " + " | ".join(f"{res[n]['classes'].get(c, 0):.1f}%" for n in names) + " |")
    print("| (excluded: load, probe, OS) | " +
          " | ".join(f"{res[n]['excluded_pct_of_samples']:.0f}% of samples" for n in names) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
