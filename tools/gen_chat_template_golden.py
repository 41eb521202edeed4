#!/usr/bin/env python3
"""Golden outputs for src/template/chat_template_test.cc.

Renders every template in tests/data/chat_templates/*.jinja with every conversation below using
Python's jinja2 set up the way transformers' apply_chat_template sets it up
(ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) + loopcontrols, tojson as
json.dumps(ensure_ascii=False), raise_exception, strftime_now, namespace, dict; tools and
documents always passed, None when absent), and writes conversations.json and golden.json there.

Templates of the local models are first refreshed from their GGUF `tokenizer.chat_template`
(needs the `gguf` package; skipped when models/ is absent). Run from the repo root:
  .venv/bin/python tools/gen_chat_template_golden.py
"""

import glob
import json
import os
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "chat_templates")

GGUF_TEMPLATES = {
    "smollm2-135m-instruct-q4_1.gguf": "smollm2.jinja",
    "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf": "qwen2_5_coder.jinja",
    "gemma-3-270m-q4_k_m.gguf": None,  # ships no chat template; gemma.jinja stands in
}

# bos/eos per template (what the model's tokenizer would pass).
TOKENS = {
    "chatml": ("", "<|im_end|>"),
    "smollm2": ("<|im_start|>", "<|im_end|>"),
    "qwen2_5_coder": ("", "<|im_end|>"),
    "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
    "gemma": ("<bos>", "<eos>"),
    "mistral": ("<s>", "</s>"),
    "deepseek_v2_chat": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek_v2_5": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "features": ("<s>", "</s>"),
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}


def tool_conversation(arguments):
    return {
        "tools": [WEATHER_TOOL],
        "messages": [
            {"role": "system", "content": "You can check the weather."},
            {"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
            {"role": "tool", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
            {"role": "assistant", "content": "It is 21.5 °C and clear in Paris."},
        ],
    }


CONVERSATIONS = {
    "single_user": {"messages": [{"role": "user", "content": "Hello!"}]},
    "system_multi_turn": {"messages": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ]},
    "no_system_multi_turn": {"messages": [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the tensor cross the road?"},
    ]},
    "unicode": {"messages": [
        {"role": "system", "content": "Réponds en français 🙂"},
        {"role": "user", "content": "日本語で: 東京は？ — ‘quotes’ \"dq\" \\ back\ttab"},
        {"role": "assistant", "content": "東京は日本の首都です。"},
        {"role": "user", "content": "Ещё раз? ✓"},
    ]},
    "whitespace": {"messages": [
        {"role": "user", "content": "  padded question  \n\n"},
        {"role": "assistant", "content": "\n line one\n line two \n"},
        {"role": "user", "content": "What\n  next?"},
    ]},
    "tool_call_dict_args": tool_conversation({"city": "Paris", "unit": "celsius"}),
    "tool_call_str_args": tool_conversation("{\"city\": \"Paris\", \"unit\": \"celsius\"}"),
    "roles_not_alternating": {"messages": [
        {"role": "user", "content": "First"},
        {"role": "user", "content": "Second"},
    ]},
}


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = dict
    return env


def refresh_gguf_templates():
    models = os.path.join(ROOT, "models")
    if not os.path.isdir(models):
        return
    import gguf  # only needed here
    for name, out in GGUF_TEMPLATES.items():
        path = os.path.join(models, name)
        if not os.path.exists(path):
            continue
        field = gguf.GGUFReader(path).fields.get("tokenizer.chat_template")
        if field is None:
            print(f"{name}: no tokenizer.chat_template")
            continue
        text = bytes(field.parts[field.data[0]]).decode("utf-8")
        with open(os.path.join(DATA, out), "w", encoding="utf-8", newline="") as f:
            f.write(text)


def main():
    refresh_gguf_templates()
    env = make_env()
    cases = []
    for path in sorted(glob.glob(os.path.join(DATA, "*.jinja"))):
        name = os.path.basename(path)[: -len(".jinja")]
        with open(path, encoding="utf-8", newline="") as f:
            template = env.from_string(f.read())
        bos, eos = TOKENS[name]
        for conv_name, conv in CONVERSATIONS.items():
            for add_generation_prompt in (False, True):
                case = {"template": name, "conversation": conv_name,
                        "add_generation_prompt": add_generation_prompt,
                        "bos_token": bos, "eos_token": eos}
                try:
                    case["output"] = template.render(
                        messages=conv["messages"], tools=conv.get("tools"), documents=None,
                        add_generation_prompt=add_generation_prompt, bos_token=bos, eos_token=eos)
                except jinja2.exceptions.UndefinedError as e:
                    case["error"] = {"kind": "undefined", "message": str(e)}
                except jinja2.exceptions.TemplateError as e:
                    case["error"] = {"kind": "raise_exception", "message": str(e)}
                except (TypeError, ValueError) as e:
                    case["error"] = {"kind": "type", "message": str(e)}
                cases.append(case)
    with open(os.path.join(DATA, "conversations.json"), "w", encoding="utf-8") as f:
        json.dump(CONVERSATIONS, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(DATA, "golden.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
        f.write("\n")
    errors = sum("error" in c for c in cases)
    print(f"{len(cases)} cases ({errors} expected errors) -> {DATA}")


if __name__ == "__main__":
    main()
