"""Property-based API tests: schemathesis against the server's own /openapi.json.

A dedicated `peng serve` (short context, few sequences) is started for this module. The
OpenAPI document is read from the live server's GET /openapi.json, checked to be a valid
OpenAPI 3.0 document that lists every route, and schemathesis generates requests for each
documented operation from it: valid ones and, on purpose, invalid ones (wrong types,
out-of-range values, missing fields). Every response must

  - not be a 5xx (not_a_server_error),
  - have a documented status code (status_code_conformance),
  - have a documented Content-Type (content_type_conformance),
  - match the documented schema for that status (response_schema_conformance);

and a streamed (text/event-stream) answer must also be a well-formed stream: every `data:`
payload a JSON chunk that matches the document's CompletionChunk / ChatCompletionChunk
schema (or its Error object), one response id, every choice finished once, `[DONE]` last.

Generation is kept cheap so the module runs in about a minute on 2 cores: few examples per
operation, and before a request is sent its generation work is capped (n <= 2, max_tokens
<= 4, at most 2 prompts per batch; positive cases without max_tokens get 4). The caps only
shrink in-range values, so a valid request stays valid and an invalid one stays invalid.
Positive cases also have the cross-field rules that OpenAPI 3.0 cannot state made to hold
(see repair_positive), so that most of them reach generation.

PENG_SCHEMATHESIS_EXAMPLES sets the examples per operation and mode (default 25).
"""

import json
import os

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from openapi_schema_validator import OAS30Validator
from openapi_spec_validator import validate as validate_openapi
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from conftest import MODEL_NAME, PengServer

EXAMPLES = int(os.environ.get("PENG_SCHEMATHESIS_EXAMPLES", "25"))
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]
MAX_N = 2
MAX_TOKENS = 4
MAX_PROMPTS = 2
REQUEST_TIMEOUT_S = 60
VOCAB_FLOOR = 1000  # token ids below this are in any test model's vocabulary

ROUTES = {("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
          ("GET", "/health"), ("GET", "/metrics"), ("GET", "/openapi.json")}
GENERATE = [("POST", "/v1/completions"), ("POST", "/v1/chat/completions")]
FIXED = [("GET", "/v1/models"), ("GET", "/health"), ("GET", "/metrics"), ("GET", "/openapi.json")]


@pytest.fixture(scope="module")
def st_server():
    s = PengServer("--max-model-len", "128", "--max-num-seqs", "8")
    yield s
    s.kill()


@pytest.fixture(scope="module")
def st_spec(st_server):
    r = requests.get(st_server.base + "/openapi.json", timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("application/json")
    return r.json()


@pytest.fixture(scope="module")
def st_schema(st_server, st_spec):
    return schemathesis.openapi.from_url(st_server.base + "/openapi.json")


@pytest.fixture(scope="module")
def chunk_validators(st_spec):
    def validator(name):
        return OAS30Validator({"$ref": f"#/components/schemas/{name}",
                               "components": st_spec["components"]})
    return {"/v1/completions": validator("CompletionChunk"),
            "/v1/chat/completions": validator("ChatCompletionChunk"),
            "error": validator("ErrorResponse")}


def test_openapi_document(st_spec):
    """The served document is valid OpenAPI 3.0 and documents exactly the server's routes."""
    validate_openapi(st_spec)
    assert st_spec["openapi"].startswith("3.0.")
    documented = {(m.upper(), path) for path, ops in st_spec["paths"].items() for m in ops}
    assert documented == ROUTES
    assert "bearer" in st_spec["components"]["securitySchemes"]


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def cap_generation(body):
    """Shrinks the generation work of a request body in place (see the module docstring)."""
    if not isinstance(body, dict):
        return
    n = body.get("n")
    if _is_int(n) and MAX_N < n <= 128:
        if body.get("best_of") == n:
            body["best_of"] = MAX_N
        body["n"] = MAX_N
    for key in ("max_tokens", "max_completion_tokens"):
        v = body.get(key)
        if _is_int(v) and MAX_TOKENS < v <= 2**31 - 1:
            body[key] = MAX_TOKENS
            mt = body.get("min_tokens")
            if _is_int(mt) and MAX_TOKENS < mt <= v:  # keeps min_tokens <= max_tokens valid
                body["min_tokens"] = MAX_TOKENS
    prompt = body.get("prompt")
    if (isinstance(prompt, list) and MAX_PROMPTS < len(prompt) <= 64 and
            all(isinstance(p, (str, list)) for p in prompt)):
        body["prompt"] = prompt[:MAX_PROMPTS]


def repair_positive(body):
    """Positive cases only. Fixes the cross-field rules that OpenAPI 3.0 cannot state, so
    that more generated requests are answered 200 (each rule's 400/404 is covered by
    test_openai.py): `model` must be the served name, best_of must equal n, stream_options
    needs "stream": true, top_logprobs > 0 needs "logprobs": true, echo excludes logprobs,
    token ids must be in the model's vocabulary.
    Also gives every request a small max_tokens (the defaults, 16 and "the rest of the
    context", cost too much here)."""
    if not isinstance(body, dict):
        return
    if isinstance(body.get("model"), str):
        body["model"] = MODEL_NAME
    if body.get("best_of") is not None:
        body["best_of"] = body.get("n") if body.get("n") is not None else 1
    if body.get("stream_options") is not None:
        body["stream"] = True
    if "messages" in body:
        if body.get("top_logprobs"):
            body["logprobs"] = True
    elif body.get("echo") and body.get("logprobs") is not None:
        body["echo"] = False
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = MAX_TOKENS
        if _is_int(body.get("min_tokens")):
            body["min_tokens"] = min(body["min_tokens"], MAX_TOKENS)
    # Token ids must be below the vocabulary size, which the document cannot know.
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        body["prompt"] = [[t % VOCAB_FLOOR if _is_int(t) else t for t in p]
                          if isinstance(p, list) else p % VOCAB_FLOOR if _is_int(p) else p
                          for p in prompt]


def expected_choices(body):
    """Choices a successful request must answer: prompts x n."""
    n = body.get("n")
    n = n if _is_int(n) else 1
    prompt = body.get("prompt")
    prompts = len(prompt) if (isinstance(prompt, list) and prompt and
                              isinstance(prompt[0], (str, list))) else 1
    return prompts * n


def check_stream(response, path, body, validators):
    """A 200 text/event-stream answer: valid chunks, one id, each choice finished, [DONE]."""
    if response.status_code != 200 or not response.headers.get(
            "Content-Type", "").startswith("text/event-stream"):
        return
    events = [e for e in response.text.split("\n\n") if e.strip()]
    assert events, "empty stream"
    payloads = []
    for e in events:
        assert e.startswith("data: ") and "\n" not in e, f"not one data line: {e!r}"
        payloads.append(e[len("data: "):])
    assert payloads[-1] == "[DONE]", f"stream does not end with [DONE]: {payloads[-1]!r}"
    assert "[DONE]" not in payloads[:-1], "[DONE] before the end"
    ids, finished, failed = set(), {}, False
    for p in payloads[:-1]:
        chunk = json.loads(p)
        if "error" in chunk:
            validators["error"].validate(chunk)
            failed = True
            continue
        validators[path].validate(chunk)
        ids.add(chunk["id"])
        for choice in chunk["choices"]:
            i = choice["index"]
            assert i not in finished, f"choice {i} has a chunk after its finish_reason"
            if choice["finish_reason"] is not None:
                finished[i] = choice["finish_reason"]
    assert len(ids) == 1, f"chunk ids: {ids}"
    if not failed:
        assert sorted(finished) == list(range(expected_choices(body))), finished


def run_cases(strategy, server, path, validators, max_examples, positive=False):
    """Sends max_examples cases drawn from `strategy` and validates each response."""
    @settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def check(case):
        body = case.body if isinstance(case.body, dict) else None
        if body is not None:
            if positive:
                repair_positive(body)
            cap_generation(body)
        response = case.call_and_validate(base_url=server.base, checks=CHECKS,
                                          timeout=REQUEST_TIMEOUT_S)
        if body is not None:
            check_stream(response, path, body, validators)

    check()


# schemathesis' own pytest integration (schemathesis.pytest.from_fixture) relies on pytest
# internals that pytest 9.2 no longer has (Function._nodeid), and the eager one needs the
# server before collection, so each operation is driven through its Hypothesis strategy
# instead: the same generators and the same checks.
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                         ids=["positive", "negative"])
@pytest.mark.parametrize("method,path", GENERATE, ids=[p for _, p in GENERATE])
def test_generation_routes_conform(st_schema, st_server, chunk_validators, method, path, mode):
    operation = st_schema[path][method]
    run_cases(operation.as_strategy(generation_mode=mode), st_server, path, chunk_validators,
              EXAMPLES, positive=mode == GenerationMode.POSITIVE)


@pytest.mark.parametrize("method,path", FIXED, ids=[p for _, p in FIXED])
def test_fixed_routes_conform(st_schema, st_server, chunk_validators, method, path):
    operation = st_schema[path][method]
    run_cases(operation.as_strategy(), st_server, path, chunk_validators, 2)


def test_server_still_healthy(st_server):
    """After the schemathesis run: the server is alive, idle and holds no KV blocks."""
    assert requests.get(st_server.base + "/health", timeout=5).status_code == 200
    assert st_server.wait_idle() == 0
    assert st_server.metric("kv_cache_used_blocks") == 0
    assert st_server.proc.poll() is None
