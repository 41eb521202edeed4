#!/usr/bin/env python3
"""Writes the tokenizer golden files under tests/data/tokenizer/.

For each GGUF model found in --models-dir, every string of corpus.json is tokenized by
llama.cpp (llama-cpp-python, vocab only, special tokens parsed, no BOS) -- the reference
ids -- and, where transformers can build a fast tokenizer from the GGUF file, by Hugging Face
tokenizers too. Both are recorded; cases where they disagree are listed.

It also trains the tiny byte-level BPE fixture tiny_bpe/tokenizer.json with the `tokenizers`
library (deterministic) and records its ids, so CI can test tokenizer.json loading without
any model file.

usage: .venv/bin/python tools/gen_tokenizer_golden.py [--models-dir models]
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data", "tokenizer")

MODELS = {  # golden name -> file name, as scripts/fetch_models.sh names them
    "smollm2": "smollm2-135m-instruct-q4_1.gguf",
    "qwen2": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}


def llama_cpp_ids(path, corpus):
    import llama_cpp
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    ids = [llm.tokenize(t.encode("utf-8"), add_bos=False, special=True) for t in corpus]
    with_bos = llm.tokenize(corpus[0].encode("utf-8"), add_bos=True, special=True)
    return ids, with_bos


def _allow_gguf_without_torch():
    """transformers reads GGUF metadata only when torch is importable, although building a
    tokenizer needs no tensors. Without torch, install a stand-in module so the metadata
    reader imports; no tensor is ever touched on this path."""
    try:
        import torch  # noqa: F401
        return
    except ImportError:
        pass
    import types
    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    class _Any:
        def __getattr__(self, name):
            return _Any()

        def __call__(self, *args, **kwargs):
            return _Any()

    stub = types.ModuleType("torch")
    stub.__getattr__ = lambda n: None if n in ("__spec__", "__path__") else _Any()
    stub.Tensor = type("Tensor", (), {})
    sys.modules["torch"] = stub
    gguf_utils.is_torch_available = lambda: True


def hf_ids(path, corpus):
    try:
        from transformers import AutoTokenizer
        _allow_gguf_without_torch()
        tok = AutoTokenizer.from_pretrained(os.path.dirname(path),
                                            gguf_file=os.path.basename(path))
        return [tok.encode(t, add_special_tokens=False) for t in corpus], None
    except Exception as e:  # transformers cannot convert every GGUF tokenizer
        return None, f"{type(e).__name__}: {e}"[:300]


def gguf_golden(name, path, corpus):
    ref, with_bos = llama_cpp_ids(path, corpus)
    hf, hf_error = hf_ids(path, corpus)
    cases, disagree = [], []
    for i, text in enumerate(corpus):
        case = {"text": text, "ids": ref[i]}
        if hf is not None and hf[i] != ref[i]:
            case["hf_ids"] = hf[i]
            disagree.append(i)
        cases.append(case)
    out = {
        "file": os.path.basename(path),
        "reference": "llama.cpp (llama-cpp-python) tokenize(add_bos=False, special=True)",
        "hf_tokenizers": "agree" if hf is not None and not disagree else
                         (hf_error or f"disagrees on cases {disagree}"),
        "first_with_bos": with_bos,
        "cases": cases,
    }
    with open(os.path.join(DATA, f"{name}.golden.json"), "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=0)
    print(f"{name}: {len(cases)} cases, hf: {out['hf_tokenizers']}")


TINY_TRAINING_TEXT = """\
The engine reads a model file, tokenizes the prompt and schedules requests. Each step runs
the model on a batch of tokens and samples the next token for every running request. Tokens
are decoded back into text as they are produced, and the text is streamed to the client.
Tokenizers split text into words with a regular expression, then merge bytes into tokens.
It's fast: 1234567 tokens per second, I'm told, DON'T quote me. 3.14159 2024 42
def main():
    for i in range(10):
        print(i)
今天天气很好 日本語 café naïve résumé
"""


def tiny_bpe(corpus):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, min_frequency=1, show_progress=False,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TINY_TRAINING_TEXT] * 3, trainer=trainer)
    folder = os.path.join(DATA, "tiny_bpe")
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
                   "add_bos_token": False,
                   "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"},
                  f, indent=1)
    cases = [{"text": t, "ids": tok.encode(t).ids} for t in corpus]
    with open(os.path.join(DATA, "tiny_bpe.golden.json"), "w") as f:
        json.dump({"reference": "HF tokenizers encode()", "cases": cases}, f,
                  ensure_ascii=False, indent=0)
    print(f"tiny_bpe: {tok.get_vocab_size()} tokens, {len(cases)} cases")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models-dir", default=os.environ.get("PENG_MODELS_DIR", os.path.join(HERE, "..", "models")))
    args = ap.parse_args()
    with open(os.path.join(DATA, "corpus.json")) as f:
        corpus = json.load(f)
    tiny_bpe(corpus)
    for name, file in MODELS.items():
        path = os.path.join(args.models_dir, file)
        if not os.path.exists(path):
            print(f"{name}: {path} missing, skipped", file=sys.stderr)
            continue
        gguf_golden(name, path, corpus)


if __name__ == "__main__":
    main()
