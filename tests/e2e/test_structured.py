"""Structured output end to end (issue 13): response_format json_object / json_schema on chat
and completions, vLLM's guided_* fields, the official client's `parse` with a Pydantic model,
logit_bias, and the 400s for unsupported constraints.

The schema corpus (tests/data/json_schemas/*.json, all but the grammar-only cases marked
"sampling": false) is sampled on the session's Qwen2.5-Coder 0.5B server with a seed per
schema, at temperature 0.8 with frequency_penalty 0.5 (without it a 0.5B model sometimes loops
inside an unbounded string or a recursive structure until max_tokens): every output must
finish by itself ("stop") and validate against its schema with the `jsonschema` package.
json_object and the client's `parse` run on that server too; choices, regexes, grammars,
logit_bias and the 400s on the default server.
"""

import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import pytest
import requests
from pydantic import BaseModel

from conftest import MODEL, MODEL_NAME, PENG_BIN, ROOT

CORPUS_ALL = sorted((ROOT / "tests" / "data" / "json_schemas").glob("*.json"))
CORPUS = [p for p in CORPUS_ALL if json.loads(p.read_text()).get("sampling", True)]


def chat(server, body):
    body = {"model": MODEL_NAME, **body}
    return requests.post(server.base + "/v1/chat/completions", json=body,
                         headers=server.headers(), timeout=300)


def complete(server, body):
    body = {"model": MODEL_NAME, **body}
    return requests.post(server.base + "/v1/completions", json=body, headers=server.headers(),
                         timeout=300)


def schema_request(path, i):
    schema = json.loads(path.read_text())["schema"]
    name = re.sub(r"[^a-zA-Z0-9_-]", "_", path.stem)[:64]
    return schema, {
        "messages": [{"role": "user",
                      "content": "Reply with a JSON document that follows this schema: "
                                 + json.dumps(schema)}],
        "response_format": {"type": "json_schema",
                            "json_schema": {"name": name, "schema": schema, "strict": True}},
        "temperature": 0.8, "frequency_penalty": 0.5, "seed": 1000 + i, "max_tokens": 1000,
    }


def test_schema_corpus_instances_agree_with_jsonschema():
    """The corpus' own valid/invalid instances (which the grammar unit tests accept/reject)
    are valid/invalid for the jsonschema package too."""
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "check_schema_corpus.py")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("0 failures"), r.stdout


def test_schema_corpus_outputs_validate(qwen_server):
    server = qwen_server
    assert len(CORPUS) >= 30, f"only {len(CORPUS)} schemas in the corpus"

    def run(item):
        i, path = item
        schema, body = schema_request(path, i)
        r = chat(server, body)
        return path, schema, r

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(run, enumerate(CORPUS)))
    failures = []
    for path, schema, r in results:
        if r.status_code != 200:
            failures.append(f"{path.name}: HTTP {r.status_code} {r.text[:300]}")
            continue
        choice = r.json()["choices"][0]
        text = choice["message"]["content"]
        if choice["finish_reason"] != "stop":
            failures.append(f"{path.name}: finish_reason {choice['finish_reason']}: {text[:200]}")
            continue
        try:
            jsonschema.validate(json.loads(text), schema)
        except (ValueError, jsonschema.ValidationError) as e:
            failures.append(f"{path.name}: {str(e)[:300]}\n  output: {text[:300]}")
    assert not failures, "\n".join(failures)
    assert server.wait_idle() == 0


def test_json_object_on_chat_and_completions_streaming_too(qwen_server):
    server = qwen_server
    r = chat(server, {"messages": [{"role": "user", "content": "Describe a cat in JSON."}],
                      "response_format": {"type": "json_object"}, "max_tokens": 300,
                      "temperature": 0.7, "seed": 3})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "stop"
    assert isinstance(json.loads(r.json()["choices"][0]["message"]["content"]), dict)

    r = complete(server, {"prompt": "A JSON object describing a dog:", "max_tokens": 300,
                          "response_format": {"type": "json_object"}, "seed": 4,
                          "temperature": 0.7, "n": 2})
    assert r.status_code == 200, r.text
    for c in r.json()["choices"]:
        assert c["finish_reason"] == "stop", c
        assert isinstance(json.loads(c["text"]), dict)

    body = {"model": MODEL_NAME, "stream": True, "max_tokens": 300, "seed": 5,
            "messages": [{"role": "user", "content": "A JSON object about a tree."}],
            "response_format": {"type": "json_object"}}
    text, finish = "", None
    with requests.post(server.base + "/v1/chat/completions", json=body, stream=True,
                       headers=server.headers(), timeout=300) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            ev = json.loads(line[6:])
            for c in ev["choices"]:
                text += c["delta"].get("content") or ""
                finish = c["finish_reason"] or finish
    assert finish == "stop"
    assert isinstance(json.loads(text), dict)


def test_guided_choice_regex_and_grammar(server):
    r = complete(server, {"prompt": "The best season is", "guided_choice": ["spring", "summer",
                          "autumn", "winter"], "n": 4, "seed": 9, "max_tokens": 20})
    assert r.status_code == 200, r.text
    for c in r.json()["choices"]:
        assert c["text"] in {"spring", "summer", "autumn", "winter"}
        assert c["finish_reason"] == "stop"
    r = complete(server, {"prompt": "An IPv4 address:", "guided_regex":
                          r"((25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(25[0-5]|2[0-4]\d|1?\d?\d)",
                          "seed": 2, "max_tokens": 30, "temperature": 1.0})
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["text"]
    assert re.fullmatch(r"((25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(25[0-5]|2[0-4]\d|1?\d?\d)", text), text
    r = complete(server, {"prompt": "Answer:", "max_tokens": 10,
                          "guided_grammar": 'root ::= "yes" | "no"'})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] in {"yes", "no"}


class Address(BaseModel):
    street: str
    city: str
    zip_code: str


class Person(BaseModel):
    name: str
    age: int
    email: str
    addresses: list[Address]


def test_openai_client_parse_with_pydantic(qwen_server):
    client = qwen_server.client()
    completion = client.beta.chat.completions.parse(
        model=MODEL_NAME,
        messages=[{"role": "system", "content": "Extract the person as JSON."},
                  {"role": "user", "content": "Ada Lovelace, 36, ada@example.com, lives at "
                                              "12 St James's Square, London, SW1Y 4JH."}],
        response_format=Person, max_tokens=400, temperature=0.5, seed=11)
    msg = completion.choices[0].message
    assert completion.choices[0].finish_reason == "stop", msg.content
    assert isinstance(msg.parsed, Person), msg.content
    Person.model_validate_json(msg.content)


def test_logit_bias_through_the_api(server):
    out = subprocess.run([str(PENG_BIN), "tokenize", "-m", str(MODEL), "--text", " the",
                          "--no-bos"], capture_output=True, text=True, timeout=120, check=True)
    ids = json.loads(out.stdout)
    assert len(ids) == 1, ids
    the = str(ids[0])
    body = {"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0,
            "logprobs": 0}
    forced = complete(server, {**body, "logit_bias": {the: 100}})
    assert forced.status_code == 200, forced.text
    assert forced.json()["choices"][0]["text"] == " the the the"
    # -100 on it: it never comes, whatever the prompt asks for.
    banned = complete(server, {**body, "prompt": "the the the the the the the",
                               "logit_bias": {the: -100}, "max_tokens": 8})
    assert banned.status_code == 200, banned.text
    assert " the" not in banned.json()["choices"][0]["logprobs"]["tokens"]


def test_unsupported_constraints_are_400s(server):
    msgs = [{"role": "user", "content": "hi"}]
    cases = [
        ({"response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object", "patternProperties": {"a": {}}}}}},
         "patternProperties"),
        ({"response_format": {"type": "yaml"}}, "yaml"),
        ({"guided_regex": "(a)\\1"}, "guided_regex"),
        ({"guided_grammar": "root ::= undefined-rule"}, "guided_grammar"),
        ({"guided_choice": ["a"], "guided_regex": "a"}, "only one output constraint"),
        ({"logit_bias": {"abc": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 1000}}, "logit_bias"),
        ({"logit_bias": {"999999999": 1}}, "logit_bias"),
    ]
    for extra, needle in cases:
        r = chat(server, {"messages": msgs, "max_tokens": 5, **extra})
        assert r.status_code == 400, (extra, r.text)
        assert needle in r.text, (extra, r.text)
