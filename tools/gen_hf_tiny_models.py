#!/usr/bin/env python3
"""Tiny random Hugging Face model folders + float64 transformers references for hf_model_test.

Builds one tiny model per supported architecture with transformers itself (so config.json and
the safetensors layout are exactly what save_pretrained writes), randomises EVERY parameter
(HF initialises norms to 1 or 0 and biases to 0, which would hide mapping bugs), rounds the
weights to the storage dtype BEFORE computing the reference, and records the float64 eager
logits at every prompt position plus a greedy continuation (with the KV cache).

  llama  : LlamaForCausalLM,  F32, single model.safetensors, untied lm_head
  qwen2  : Qwen2ForCausalLM,  BF16, sharded (model.safetensors.index.json), qkv bias, tied head
  gemma3 : Gemma3ForCausalLM (Gemma3TextConfig, model_type gemma3_text), F16, single file,
           sliding + full layers (window 4 < prompt), qk norms, local rope base != global,
           query_pre_attn_scalar != head_dim, head_dim 32 != hidden / heads

Also writes small broken folders for the loader's error paths (tests/data/hf_tiny/broken/).
No tokenizer files: peng loads such folders with token ids only.

Output: tests/data/hf_tiny/<arch>/ and tests/data/hf_tiny/<arch>.golden.json
Usage:  .venv/bin/python tools/gen_hf_tiny_models.py
"""
import copy
import json
import math
import os
import shutil

import torch
import transformers
from safetensors.torch import load_file, save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "hf_tiny")
# 12 ids; positions 4..11 lie beyond gemma3's sliding window of 4.
PROMPT = [1, 17, 200, 45, 99, 3, 128, 77, 250, 9, 61, 140]
N_GREEDY = 8
ROUND = 6

COMMON = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=256, max_position_embeddings=128, rms_norm_eps=1e-5,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)


def randomise(model, seed, norm_mean, embed_std=None):
    """Every parameter random. Norm weights ~ N(norm_mean, 0.5); linear weights scaled by fan-in
    so activations stay O(1); biases ~ N(0, 0.3); embeddings N(0, 1), or N(0, 2/sqrt(D)) when
    tied to the LM head (keeps logits O(10)), unless embed_std is given."""
    tied = model.config.tie_word_embeddings
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                v = norm_mean + 0.5 * torch.randn(p.shape, generator=g)
            elif name.endswith("bias"):
                v = 0.3 * torch.randn(p.shape, generator=g)
            elif "embed_tokens" in name:
                if embed_std is None:
                    embed_std = 2.0 / math.sqrt(p.shape[1]) if tied else 1.0
                v = torch.randn(p.shape, generator=g) * embed_std
            else:
                v = torch.randn(p.shape, generator=g) * (1.5 / math.sqrt(p.shape[1]))
            p.copy_(v.to(p.dtype))


def round_to(model, dtype):
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(dtype).to(p.dtype))


def reference(model):
    """float64 eager logits at every prompt position + greedy continuation with the KV cache."""
    m = model.double().eval()
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        out = m(ids, use_cache=True)
        logits = out.logits[0]
        past = out.past_key_values
        greedy, gaps = [], []
        last = logits[-1]
        for _ in range(N_GREEDY):
            top2 = torch.topk(last, 2).values
            gaps.append(float(top2[0] - top2[1]))
            nxt = int(torch.argmax(last))
            greedy.append(nxt)
            out = m(torch.tensor([[nxt]]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            last = out.logits[0, -1]
        # Cross-check the cached continuation against a full recompute.
        full = m(torch.tensor([PROMPT + greedy[:-1]])).logits[0]
        assert [int(t) for t in full[len(PROMPT) - 1:].argmax(-1)] == greedy
    prompt_gaps = [float(g[0] - g[1]) for g in torch.topk(logits, 2, dim=-1).values]
    rows = [[round(float(x), ROUND) for x in row] for row in logits]
    return rows, greedy, min(prompt_gaps), min(gaps)


def write_golden(arch, make_model, seed, save_dtype, **save_kw):
    """make_model(seed) -> randomised model (rounded to save_dtype). Tries seeds from `seed` on
    until the reference has no near ties (top-2 gap > 0.01 at every prompt position and greedy
    step) and a greedy continuation that is not one repeated token."""
    for s in range(seed, seed + 50):
        model = make_model(s)
        rows, greedy, pgap, ggap = reference(copy.deepcopy(model).to(torch.float32))
        if pgap > 1e-2 and ggap > 1e-2 and len(set(greedy)) >= 3:
            break
    else:
        raise RuntimeError(arch + ": no seed without near ties")
    folder = os.path.join(ROOT, arch)
    shutil.rmtree(folder, ignore_errors=True)
    # Save first (storage dtype), then compute the reference in float64 from the same values.
    model.to(save_dtype).save_pretrained(folder, **save_kw)
    golden = {"tokens": PROMPT, "seed": s, "logits": rows, "greedy": greedy,
              "transformers_version": transformers.__version__, "torch_version": torch.__version__,
              "min_top2_gap_prompt": round(pgap, ROUND), "min_top2_gap_greedy": round(ggap, ROUND)}
    with open(os.path.join(ROOT, arch + ".golden.json"), "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")
    files = sorted(os.listdir(folder))
    size = sum(os.path.getsize(os.path.join(folder, x)) for x in files)
    print(f"{arch}: seed {s}; {files} {size} bytes; greedy {greedy}; min top-2 gap prompt "
          f"{pgap:.4f} greedy {ggap:.4f}")


def build_llama():
    cfg = transformers.LlamaConfig(**COMMON, num_hidden_layers=2, head_dim=16,
                                   rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
                                   tie_word_embeddings=False)

    def make(seed):
        m = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="eager")
        randomise(m, seed, norm_mean=1.0)
        return m
    write_golden("llama", make, 100, torch.float32)


def build_qwen2():
    cfg = transformers.Qwen2Config(**COMMON, num_hidden_layers=2,
                                   rope_parameters={"rope_type": "default", "rope_theta": 20000.0},
                                   tie_word_embeddings=True)

    def make(seed):
        m = transformers.Qwen2ForCausalLM._from_config(cfg, attn_implementation="eager")
        randomise(m, seed, norm_mean=1.0)
        round_to(m, torch.bfloat16)  # the reference sees exactly the stored BF16 values
        return m
    write_golden("qwen2", make, 200, torch.bfloat16, max_shard_size=100_000)
    assert os.path.exists(os.path.join(ROOT, "qwen2", "model.safetensors.index.json"))


def build_gemma3():
    cfg = transformers.Gemma3TextConfig(
        **COMMON, num_hidden_layers=3, head_dim=32, query_pre_attn_scalar=20, sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_theta=100000.0, rope_local_base_freq=2000.0, final_logit_softcapping=None,
        attn_logit_softcapping=None, tie_word_embeddings=True)
    assert cfg.rope_parameters["sliding_attention"]["rope_theta"] == 2000.0, cfg.rope_parameters
    assert cfg.rope_parameters["full_attention"]["rope_theta"] == 100000.0, cfg.rope_parameters

    def make(seed):
        m = transformers.Gemma3ForCausalLM._from_config(cfg, attn_implementation="eager")
        # HF Gemma norms scale by (1 + w). Small embeddings (x sqrt(64) at the input): with tied
        # embeddings a large input embedding makes every position predict its own token.
        randomise(m, seed, norm_mean=0.0, embed_std=0.08)
        round_to(m, torch.float16)  # the reference sees exactly the stored F16 values
        return m
    write_golden("gemma3", make, 300, torch.float16)


def build_broken():
    """Micro llama folders (a few KB each) for the loader's error paths."""
    base = os.path.join(ROOT, "broken")
    shutil.rmtree(base, ignore_errors=True)
    cfg = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_attention_heads=2,
                                   num_key_value_heads=1, head_dim=8, vocab_size=32,
                                   num_hidden_layers=1, max_position_embeddings=64,
                                   tie_word_embeddings=True)
    torch.manual_seed(0)
    m = transformers.LlamaForCausalLM._from_config(cfg)
    ok = os.path.join(base, "ok")
    m.save_pretrained(ok)
    tensors = load_file(os.path.join(ok, "model.safetensors"))
    config = json.load(open(os.path.join(ok, "config.json")))

    def make(name, cfg_json, tensors_out):
        d = os.path.join(base, name)
        os.makedirs(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg_json, f, indent=2)
        save_file(tensors_out, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})

    no_hidden = dict(config)
    del no_hidden["hidden_size"]
    make("no_hidden_size", no_hidden, tensors)
    wrong = dict(tensors)
    k = "model.layers.0.self_attn.k_proj.weight"  # [8, 16] -> [16, 8]
    wrong[k] = wrong[k].t().contiguous()
    make("wrong_shape", config, wrong)
    missing = {n: t for n, t in tensors.items() if n != "model.layers.0.mlp.up_proj.weight"}
    make("missing_tensor", config, missing)
    shutil.rmtree(ok)  # the intact copy is not needed by the tests
    print("broken:", sorted(os.listdir(base)))


def main():
    os.makedirs(ROOT, exist_ok=True)
    torch.set_num_threads(2)
    build_llama()
    build_qwen2()
    build_gemma3()
    build_broken()
    total = 0
    for dirpath, _, files in os.walk(ROOT):
        total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    print(f"total {total} bytes under {os.path.relpath(ROOT)}")


if __name__ == "__main__":
    main()
