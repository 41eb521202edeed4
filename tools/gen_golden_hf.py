#!/usr/bin/env python3
"""Golden logits from Hugging Face transformers for the GGUF models (independent reference #2).

transformers loads each GGUF file and dequantizes its weights to float; the forward pass then
runs in float64 with eager attention, so the reference carries no activation quantization.
peng compares against it in its exact mode (`--exact`: FP32 activations and KV cache), which
checks the model logic (RoPE, attention, norms, activations, tied heads, sliding windows) to
tight tolerances, independently of llama.cpp.

Prompts and their token ids are taken from the llama.cpp golden files (tests/golden/<stem>.json)
so that both references score the same ids. Output: tests/golden/<stem>.hf.json, same format.

Usage: .venv/bin/python tools/gen_golden_hf.py [models/*.gguf ...]
"""
import argparse
import glob
import json
import math
import os
import sys
import time

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM

TOP_K = 32
ROUND = 5
N_PREDICT = 32


def top_k(row, k):
    ids = np.argpartition(-row, k)[:k]
    ids = ids[np.argsort(-row[ids], kind="stable")]
    return [[int(i), round(float(row[i]), ROUND)] for i in ids]


def logsumexp(row):
    m = float(row.max())
    return m + math.log(float(np.exp(row - m).sum()))


@torch.no_grad()
def run_prompt(model, tokens):
    ids = torch.tensor([tokens])
    out = model(ids, use_cache=True)
    logits = out.logits[0].numpy()
    past = out.past_key_values
    positions = [{"top": top_k(r, TOP_K), "logsumexp": round(logsumexp(r), ROUND)} for r in logits]
    greedy, steps = [], []
    seq = list(tokens)
    row = logits[-1]
    for _ in range(N_PREDICT):
        order = np.argsort(-row, kind="stable")[:2]
        tok = int(np.argmax(row))
        greedy.append(tok)
        steps.append([round(float(row[order[0]]), ROUND), round(float(row[order[1]]), ROUND)])
        seq.append(tok)
        out = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        row = out.logits[0, -1].numpy()
    return positions, greedy, steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*")
    ap.add_argument("--golden-dir", default="tests/golden")
    args = ap.parse_args()
    torch.set_num_threads(2)
    paths = args.models or sorted(glob.glob("models/*.gguf"))
    for path in paths:
        stem = os.path.splitext(os.path.basename(path))[0]
        ref = json.load(open(os.path.join(args.golden_dir, stem + ".json")))
        t0 = time.time()
        model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path),
            dtype=torch.float32, attn_implementation="eager")
        model = model.double().eval()
        out = {
            "model_file": os.path.basename(path),
            "model_sha256": ref["model_sha256"],
            "architecture": ref["architecture"],
            "reference": {
                "implementation": "HF transformers on the GGUF weights dequantized, float64, eager",
                "transformers_version": transformers.__version__,
                "torch_version": torch.__version__,
            },
            "format": ref["format"],
            "prompts": {},
        }
        for name, p in ref["prompts"].items():
            positions, greedy, steps = run_prompt(model, p["tokens"])
            out["prompts"][name] = {
                "text": p["text"], "add_bos": p["add_bos"], "tokens": p["tokens"],
                "positions": positions,
                "greedy": {"n": len(greedy), "tokens": greedy, "top2_logits": steps},
            }
        dest = os.path.join(args.golden_dir, stem + ".hf.json")
        with open(dest, "w") as f:
            json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        print(f"{stem}: {time.time() - t0:.1f}s -> {dest}", file=sys.stderr)


if __name__ == "__main__":
    main()
