#!/usr/bin/env python3
"""Writes golden reference data for peng's model tests, computed by llama.cpp.

llama-cpp-python (the vendored llama.cpp, an implementation independent of peng) runs
each GGUF model on a few plain-text prompts (no chat template) and records:

  * the reference token ids (llama.cpp's tokenizer, the model's own add_bos default,
    special tokens parsed),
  * for EVERY prompt position, the top-32 (token id, logit) pairs and the logsumexp of
    the full logit row (enough to check top-k agreement, log-probs of the top tokens
    and the normalisation without storing vocab-sized rows),
  * a greedy continuation of 32 tokens: pure argmax of the raw logits (no sampler, no
    repetition penalty), with the top-2 logits of every step so that a test can tell
    near-ties from real disagreements.

Usage (from the repository root, with the .venv from scripts/setup_dev.sh):
  .venv/bin/python tools/gen_golden_llamacpp.py [MODEL.gguf | DIR ...] [--out-dir tests/golden]

Without arguments it uses every *.gguf in models/. Output: OUT_DIR/<model-stem>.json.
"""

import argparse
import hashlib
import json
import math
import os
import sys
import time

import numpy as np
import llama_cpp

PROMPTS = {
    "prose": "The quick brown fox jumps over the lazy dog. Meanwhile, in the city,",
    "code": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n",
    "chinese": "鲲鹏是中国古代神话中的巨鸟，传说它展翅高飞可达九万里。",
    "paragraph": (
        "Large language models generate text one token at a time. For every new token, "
        "the model reads the keys and values of all previous tokens from a cache, "
        "computes attention, passes the result through a feed-forward network, and "
        "finally projects the hidden state onto the vocabulary to obtain logits. "
        "Because the weights must be streamed from memory for every token, decoding a "
        "single sequence is usually limited by memory bandwidth rather than by "
        "arithmetic, which is why quantized weights make inference faster."
    ),
}

N_CTX = 512
TOP_K = 32
ROUND = 4  # decimals kept for logits; llama.cpp vs peng tolerances are far above 1e-4


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def logsumexp(row):
    m = float(row.max())
    return m + math.log(float(np.exp(row.astype(np.float64) - m).sum()))


def top_k(row, k):
    ids = np.argpartition(-row, k)[:k]
    ids = ids[np.argsort(-row[ids], kind="stable")]
    return [[int(i), round(float(row[i]), ROUND)] for i in ids]


def run_prompt(llm, text, n_predict):
    add_bos = llm._model.add_bos_token()
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True)
    llm.reset()
    llm.eval(tokens)  # one batch: len(tokens) <= n_batch
    scores = llm.scores[: len(tokens)]
    positions = [{"top": top_k(row, TOP_K), "logsumexp": round(logsumexp(row), ROUND)}
                 for row in scores]

    greedy, steps = [], []
    row = scores[-1]
    for _ in range(n_predict):
        best2 = np.argpartition(-row, 2)[:2]
        best2 = best2[np.argsort(-row[best2], kind="stable")]
        tok = int(np.argmax(row))  # first index on exact ties, like a plain argmax
        greedy.append(tok)
        steps.append([round(float(row[best2[0]]), ROUND), round(float(row[best2[1]]), ROUND)])
        if len(tokens) + len(greedy) >= N_CTX:
            break
        llm.eval([tok])
        row = llm.scores[llm.n_tokens - 1]
    return {
        "text": text,
        "add_bos": bool(add_bos),
        "tokens": [int(t) for t in tokens],
        "positions": positions,
        "greedy": {
            "n": len(greedy),
            "tokens": greedy,
            "top2_logits": steps,
            "text": llm.detokenize(greedy).decode("utf-8", errors="replace"),
        },
    }


def load_plain(path, threads):
    """Loads with use_extra_bufts = false: llama.cpp's plain CPU kernels, no weight
    repacking and no AMX. The reference is then the same whichever CPU features the
    llama-cpp-python build enabled (its AMX path crashes in some VMs)."""
    low = llama_cpp.llama_cpp
    orig = low.llama_model_default_params

    def params():
        p = orig()
        p.use_extra_bufts = False
        return p

    low.llama_model_default_params = params
    try:
        return llama_cpp.Llama(model_path=path, n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX,
                               n_threads=threads, n_threads_batch=threads, logits_all=True,
                               seed=0, verbose=False)
    finally:
        low.llama_model_default_params = orig


def golden_for(path, threads, n_predict):
    llm = load_plain(path, threads)
    meta = llm.metadata
    out = {
        "model_file": os.path.basename(path),
        "model_sha256": sha256_of(path),
        "architecture": meta.get("general.architecture", ""),
        "model_desc": llm._model.desc(),
        "n_vocab": llm.n_vocab(),
        "reference": {
            "implementation": "llama.cpp via llama-cpp-python",
            "llama_cpp_python_version": llama_cpp.__version__,
            "n_threads": threads,
            "n_ctx": N_CTX,
            "n_batch": N_CTX,
            "kv_type_k": "f16",
            "kv_type_v": "f16",
            "flash_attn": False,
            "extra_bufts": False,
            "backend": "cpu",
        },
        "format": {
            "top_k": TOP_K,
            "logit_decimals": ROUND,
            "positions": "one entry per prompt token: logits predicting the NEXT token",
            "top": "[token_id, logit] pairs sorted by logit, descending",
            "greedy": "argmax of raw logits, no penalties; top2_logits = [best, second]",
        },
        "prompts": {},
    }
    for name, text in PROMPTS.items():
        t0 = time.time()
        out["prompts"][name] = run_prompt(llm, text, n_predict)
        p = out["prompts"][name]
        print(f"  {name:9s} {len(p['tokens']):4d} tokens  {time.time() - t0:5.1f}s  "
              f"greedy: {p['greedy']['text'][:60]!r}", file=sys.stderr)
    llm.close()
    return out


def model_paths(args):
    paths = []
    for a in args or ["models"]:
        if os.path.isdir(a):
            paths += sorted(os.path.join(a, f) for f in os.listdir(a) if f.endswith(".gguf"))
        else:
            paths.append(a)
    return paths


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", help="GGUF files or folders (default: models/)")
    ap.add_argument("--out-dir", default="tests/golden")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-predict", type=int, default=32)
    args = ap.parse_args()

    os.makedirs(args.out_dir, exist_ok=True)
    for path in model_paths(args.models):
        print(f"{path}:", file=sys.stderr)
        golden = golden_for(path, args.threads, args.n_predict)
        stem = os.path.splitext(os.path.basename(path))[0]
        dest = os.path.join(args.out_dir, stem + ".json")
        with open(dest, "w", encoding="utf-8") as f:
            json.dump(golden, f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")
        print(f"  -> {dest} ({os.path.getsize(dest)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
