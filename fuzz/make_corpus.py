#!/usr/bin/env python3
"""Writes the committed seed corpora fuzz/corpus/{request,jinja,tokenizer}/ (run from anywhere;
rewrites those three folders). The inputs follow each target's format:

  request   byte 0 = endpoint (0 completions, 1 chat), bytes 1..8 = logit seed, then the body
  jinja     template source, NUL, JSON context (messages array or conversations.json object)
  tokenizer byte 0 = tokenizer (0 DeepSeek, 1 tiny_bpe, 2 SentencePiece-style), then the text

Templates and texts come from the committed test data (tests/data/chat_templates,
tests/data/deepseek_tiny, tests/data/tokenizer); the request bodies are written out here.
"""
import json
import os
import shutil
import struct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, 'fuzz', 'corpus')
DATA = os.path.join(ROOT, 'tests', 'data')


def reset(name):
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def write(d, name, data):
    with open(os.path.join(d, name), 'wb') as f:
        f.write(data)


def body(obj):
    return json.dumps(obj, ensure_ascii=False).encode()


# --------------------------------------------------------------------------------------------
# request

def request_corpus():
    d = reset('request')
    bos, eos = '<｜begin▁of▁sentence｜>', '<｜end▁of▁sentence｜>'
    multi = [
        {'role': 'system', 'content': 'You are a terse assistant.'},
        {'role': 'user', 'content': 'What is 2+2?'},
        {'role': 'assistant', 'content': '4'},
        {'role': 'user', 'content': 'And 3+3?'},
    ]
    chat = {
        'chat-simple': {'messages': [{'role': 'user', 'content': 'Hello!'}]},
        'chat-multi-turn': {'model': 'deepseek_tiny', 'messages': multi, 'temperature': 0.7,
                            'top_p': 0.9, 'max_tokens': 32, 'seed': 42},
        'chat-content-parts': {'messages': [
            {'role': 'system', 'content': [{'type': 'text', 'text': 'Be brief.'}]},
            {'role': 'user', 'content': [{'type': 'text', 'text': 'Part one.'},
                                         {'type': 'text', 'text': 'Part two.'}]}],
            'max_completion_tokens': 8},
        'chat-stream': {'messages': multi, 'stream': True,
                        'stream_options': {'include_usage': True,
                                           'continuous_usage_stats': True},
                        'max_tokens': 4},
        'chat-logprobs': {'messages': multi[:2], 'logprobs': True, 'top_logprobs': 5,
                          'temperature': 1.0, 'seed': 3},
        'chat-logprobs-20': {'messages': multi[:2], 'logprobs': True, 'top_logprobs': 20,
                             'temperature': 0},
        'chat-n-stop': {'messages': multi, 'n': 3, 'seed': 7, 'stop': ['\n\n', 'User:'],
                        'stop_token_ids': [601, 0], 'include_stop_str_in_output': True},
        'chat-penalties': {'messages': multi, 'repetition_penalty': 1.3,
                           'presence_penalty': 1.5, 'frequency_penalty': -0.5, 'min_p': 0.05,
                           'top_k': 40, 'min_tokens': 2, 'max_tokens': 6},
        'chat-edge-values': {'messages': multi[:2], 'temperature': 2.0, 'top_p': 1e-30,
                             'top_k': -1, 'min_p': 1.0, 'repetition_penalty': 100,
                             'presence_penalty': -2, 'frequency_penalty': 2, 'min_tokens': 5,
                             'max_tokens': 5, 'seed': 0, 'n': 128},
        'chat-tiny-temperature': {'messages': multi[:2], 'temperature': 1e-6, 'top_k': 1,
                                  'repetition_penalty': 0.01, 'seed': 9223372036854775807},
        'chat-kwargs': {'messages': multi, 'add_generation_prompt': False,
                        'chat_template_kwargs': {'add_generation_prompt': True, 'x': [1, {}]},
                        'response_format': {'type': 'text'}, 'tools': [], 'user': 'u1',
                        'logit_bias': {}, 'ignore_eos': True, 'skip_special_tokens': False,
                        'continue_final_message': False, 'best_of': 1},
        'chat-multilingual': {'messages': [
            {'role': 'system', 'content': 'Réponds en français 🙂'},
            {'role': 'user', 'content': '日本語で: 東京は？ 深度求索 한국어 Ελληνικά русский'},
            {'role': 'assistant', 'content': 'مرحبا بالعالم 👨\u200d👩\u200d👧 e\u0301'},
            {'role': 'user', 'content': 'tab\there\r\nand ' + eos + ' and ' + bos}]},
        'chat-null-content': {'messages': [
            {'role': 'user', 'content': None, 'name': 'alice'},
            {'role': 'assistant', 'content': None, 'tool_calls': []},
            {'role': 'tool', 'content': 'x'}, {'role': 'user', 'content': ''}]},
        'chat-long': {'messages': [{'role': 'user', 'content': 'word ' * 600}],
                      'max_tokens': 16},
        'chat-fits-exactly': {'messages': [{'role': 'user', 'content': 'hi'}],
                              'max_tokens': 500},
        'chat-bad-types': {'messages': multi, 'temperature': 'hot', 'n': 1.5},
        'chat-bad-values': {'messages': multi, 'top_logprobs': 3, 'n': 0, 'top_p': 0},
        'chat-bad-parts': {'messages': [{'role': 'user', 'content': [
            {'type': 'image_url', 'image_url': {'url': 'x'}}]}]},
        'chat-empty': {'messages': []},
        'chat-seed-overflow': {'messages': multi[:2], 'seed': 9223372036854775807, 'n': 2},
        'chat-many-stops': {'messages': multi[:2], 'stop': [str(i) for i in range(33)]},
    }
    completions = {
        'cmpl-string': {'prompt': 'Once upon a time', 'max_tokens': 16},
        'cmpl-batch': {'prompt': ['The capital of France is', '1, 2, 3,', '今天天气'],
                       'max_tokens': 4, 'temperature': 0.8, 'seed': 1},
        'cmpl-ids': {'prompt': [600, 5, 6, 7], 'max_tokens': 3, 'temperature': 0},
        'cmpl-id-batches': {'prompt': [[600, 12], [639, 1, 2], [601]], 'n': 2, 'seed': 5},
        'cmpl-id-out-of-vocab': {'prompt': [640, 2147483647], 'max_tokens': 1},
        'cmpl-id-negative': {'prompt': [[-1]]},
        'cmpl-echo': {'prompt': 'echo me', 'echo': True, 'max_tokens': 2, 'suffix': ''},
        'cmpl-logprobs': {'prompt': 'Hello', 'logprobs': 3, 'max_tokens': 4, 'top_k': 5,
                          'top_p': 0.5, 'best_of': 2, 'n': 2},
        'cmpl-stream': {'prompt': 'Count: 1, 2,', 'stream': True,
                        'stream_options': {'include_usage': True}, 'stop': ',',
                        'ignore_eos': True, 'min_tokens': 1},
        'cmpl-max-tokens-float': {'prompt': 'x', 'max_tokens': 16.0, 'seed': 2.0},
        'cmpl-max-tokens-huge': {'prompt': 'x', 'max_tokens': 2147483647},
        'cmpl-max-tokens-edge': {'prompt': [1], 'max_tokens': 511},
        'cmpl-logit-bias': {'prompt': 'x', 'logit_bias': {'5': 1}},
        'cmpl-special-text': {'prompt': bos + 'User: hi\n\nAssistant:' + eos},
        'cmpl-empty-string': {'prompt': ''},
        'cmpl-empty-in-batch': {'prompt': ['a', '']},
        'cmpl-mixed-batch': {'prompt': ['a', [1, 2]]},
    }
    # Seeds of the logit rows: a few of each kind (the kind comes from the seed's stream).
    for i, (name, b) in enumerate(sorted(chat.items())):
        write(d, name, bytes([1]) + struct.pack('<Q', 0x1234567 * (i + 1)) + body(b))
    for i, (name, b) in enumerate(sorted(completions.items())):
        write(d, name, bytes([0]) + struct.pack('<Q', 0x7654321 * (i + 3)) + body(b))
    # Not JSON objects, and JSON that nests deeper than the 64 levels allowed.
    write(d, 'raw-not-json', bytes([1]) + bytes(8) + b'{"messages": [')
    write(d, 'raw-array', bytes([0]) + bytes(8) + b'[{"prompt": "x"}]')
    write(d, 'raw-deep', bytes([1]) + bytes(8) +
          b'{"messages": ' + b'[' * 70 + b']' * 70 + b'}')
    write(d, 'raw-escapes', bytes([0]) + bytes(8) +
          b'{"prompt": "\\u00e9\\ud83d\\ude00\\n\\"[{", "stop": ["]}"]}')


# --------------------------------------------------------------------------------------------
# jinja

def jinja_corpus():
    d = reset('jinja')
    tdir = os.path.join(DATA, 'chat_templates')
    convs = json.load(open(os.path.join(tdir, 'conversations.json'), encoding='utf-8'))
    pick = {
        'chatml': 'system_multi_turn', 'deepseek_v2_5': 'tool_call_dict_args',
        'deepseek_v2_chat': 'unicode', 'features': 'whitespace', 'gemma': 'no_system_multi_turn',
        'llama3': 'tool_call_str_args', 'mistral': 'roles_not_alternating',
        'qwen2_5_coder': 'tool_call_dict_args', 'smollm2': 'single_user',
    }
    for name in sorted(os.listdir(tdir)):
        if not name.endswith('.jinja'):
            continue
        stem = name[:-len('.jinja')]
        src = open(os.path.join(tdir, name), 'rb').read()
        ctx = dict(convs[pick.get(stem, 'single_user')])
        ctx['add_generation_prompt'] = True
        write(d, stem, src + b'\0' + body(ctx))
    cfg = json.load(open(os.path.join(DATA, 'deepseek_tiny', 'serve', 'tokenizer_config.json'),
                         encoding='utf-8'))
    write(d, 'deepseek_tiny', cfg['chat_template'].encode() + b'\0' +
          body(convs['system_multi_turn']['messages']))
    # The language's corners, each small and bounded.
    snippets = {
        'macro-recursion':
            '{% macro f(n) %}{% if n > 0 %}{{ n }},{{ f(n - 1) }}{% endif %}{% endmacro %}'
            '{{ f(10) }}',
        'macro-caller':
            '{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}'
            '{% call wrap("b") %}{{ messages | length }}{% endcall %}',
        'namespace-loop':
            '{% set ns = namespace(n=0, s="") %}{% for m in messages %}'
            '{% set ns.n = ns.n + 1 %}{% set ns.s = ns.s ~ m.role[0] %}{% endfor %}'
            '{{ ns.n }} {{ ns.s }}',
        'loop-vars':
            '{% for m in messages if m.role != "system" %}{{ loop.index }}/{{ loop.length }}'
            '{{ loop.first }}{{ loop.last }}{{ loop.cycle("a", "b") }}'
            '{% if loop.previtem is defined %}<{{ loop.previtem.role }}{% endif %}'
            '{% else %}none{% endfor %}',
        'range-break':
            '{% for i in range(3, 100, 7) %}{% if i > 50 %}{% break %}{% endif %}'
            '{% if i % 2 %}{% continue %}{% endif %}{{ i }} {% endfor %}',
        'filters':
            '{{ messages | map(attribute="content") | join(" | ") | upper | trim }}'
            '{{ messages | selectattr("role", "equalto", "user") | list | length }}'
            '{{ messages | rejectattr("role", "in", ["system"]) | map(attribute="role") '
            '| unique | list | tojson }}{{ messages[0] | tojson(indent=2) }}'
            '{{ "a\\nb" | indent(4, true) }}{{ [3, 1, 2] | reverse | first }}'
            '{{ none | default("d") }}{{ "5" | int + "1.5" | float }}{{ -3 | abs }}',
        'string-methods':
            '{% set s = messages[-1].content %}{{ s.strip().lower().title() }}'
            '{{ s.split(" ", 1) }}{{ s.replace("a", "b", 2) }}{{ s.startswith(("x", "A")) }}'
            '{{ s.find("o") }}{{ s.count("l") }}{{ "-".join(["a", "b"]) }}{{ s[::-1] }}'
            '{{ s[1:-1:2] }}{{ s | capitalize }}{{ "%" in s }}',
        'arithmetic':
            '{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1 / 3 }}'
            '{{ 1e300 * 1e300 }} {{ "ab" * 3 }} {{ [1] * 2 + [3] }} {{ 10 - 2.5 }}'
            '{{ 1 if true else 2 }}{{ "x" if false }}{{ not 1 and 0 or 3 }}',
        'dicts':
            '{% set d = {"b": 1, "a": [1, 2], "c": {"x": none}} %}{{ d }}{{ d.items() | list }}'
            '{{ d.get("z", 3) }}{{ d | tojson }}{{ d.keys() | list }}{{ dict(d, z=1) }}'
            '{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ "a" in d }}',
        'tests':
            '{{ 4 is even }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}{{ x is undefined }}'
            '{{ none is none }}{{ "a" is string }}{{ {} is mapping }}{{ [] is iterable }}'
            '{{ 1.5 is float }}{{ 2 is integer }}{{ f is callable }}{{ 2 is gt 1 }}',
        'whitespace-control':
            '  {%- for m in messages -%}\n  {{ m.role }}  {%+ if true %}\n'
            '[{{- m.content -}}]{% endif %}\n{%- endfor %}\n{# comment #}\n  tail  \n',
        'set-block':
            '{% set x %}{% for m in messages %}{{ m.content }}{% endfor %}{% endset %}'
            '{{ x | length }}{% set a, b = 1, 2 %}{{ a + b }}{% generation %}g{% endgeneration %}',
        'raise':
            '{% if messages[0].role != "user" %}{{ raise_exception("first must be user") }}'
            '{% endif %}{{ strftime_now("%Y") | length }}',
        'errors':
            '{{ messages.nope.deeper }}',
        'syntax-error':
            '{% for m in messages %}{{ m.content }',
    }
    for name, src in snippets.items():
        write(d, name, src.encode() + b'\0' + body(convs['system_multi_turn']['messages']))
    write(d, 'no-context', b'{{ bos_token }}{% for m in messages %}{{ m.content }}'
          b'{% endfor %}{{ eos_token if add_generation_prompt }}')


# --------------------------------------------------------------------------------------------
# tokenizer

def tokenizer_corpus():
    d = reset('tokenizer')
    texts = json.load(open(os.path.join(DATA, 'tokenizer', 'corpus.json'), encoding='utf-8'))
    golden = json.load(open(os.path.join(DATA, 'deepseek_tiny', 'tokenizer.golden.json'),
                            encoding='utf-8'))
    gtexts = [c['text'] for c in golden['cases']]
    # Longer multilingual samples, one per tokenizer, and a handful of short ones.
    def join(xs):
        return '\n'.join(xs).encode()
    write(d, 'deepseek-golden', bytes([0]) + join(gtexts))
    write(d, 'tiny-bpe-corpus', bytes([1]) + join(texts))
    write(d, 'spm-corpus', bytes([2]) + join(texts[:20]))
    picks = [0, 5, 9, 12, 14, 16, 17, 19, 20, 21, 22, 26, 27, 28, 34, 35]
    for i in picks:
        write(d, f'text-{i:02d}', bytes([i % 3]) + texts[i].encode())
    write(d, 'deepseek-special', bytes([0]) + gtexts[-2].encode())
    write(d, 'spm-hello', bytes([2]) + 'hello world 你好<start_of_turn><tool>the</s>\n'.encode())
    write(d, 'invalid-utf8', bytes([0]) + b'a\xff\xfe\xc3(\xe4\xbb \xf0\x9f\x98 \xed\xa0\x80 \xc0\xaf')
    write(d, 'invalid-utf8-spm', bytes([2]) + b'\xe4\xbd\xe5\xa5\xbd\x80\xc3\xa9 z\x00')
    write(d, 'space-runs', bytes([1]) + b' ' * 64 + b'\t\t\r\n\r\n' + b'\n' * 16 + b'x')
    write(d, 'digits', bytes([0]) + b'0123456789' * 8 + '٣٤٥ ①②'.encode())
    write(d, 'nul-bytes', bytes([1]) + b'a\x00b\x00\x00<|im_end|>\x00')


if __name__ == '__main__':
    request_corpus()
    jinja_corpus()
    tokenizer_corpus()
    total = 0
    for root, _, files in os.walk(OUT):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    print(f'{OUT}: {total} bytes')
