"""Tool calling end to end (issue 13) with the official `openai` client on a real model.

The session's Qwen2.5-Coder 0.5B server (conftest.qwen_server: its chat template writes
Hermes-style <tool_call> JSON, detected by --tool-call-parser auto; PENG_E2E_QWEN_MODEL selects
another GGUF with a tool-aware template; skipped when the model is absent).

Covered: tool_choice "required" and a named function, streaming and not, n = 2 (tool_calls with
valid JSON arguments that follow the tool's schema, finish_reason "tool_calls", the streamed
calls equal to the non-streamed ones at temperature 0), parallel_tool_calls false, the round
trip (the call and a `tool` message with its result sent back, a normal answer), "auto" on
this model's untagged calls, "none" (plain content), and 400s for invalid tools.
"""

import json
import os
import re
from pathlib import Path

import jsonschema
import openai
import pytest
import requests

from conftest import MODEL_NAME

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the current local time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string"}},
            "required": ["timezone"],
        },
    },
}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
CALL_ID = re.compile(r"^call_[A-Za-z0-9]{24}$")
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def tserver(qwen_server):
    return qwen_server


@pytest.fixture(scope="module")
def tclient(tserver):
    return tserver.client()


def create(client, **kw):
    kw.setdefault("model", MODEL_NAME)
    kw.setdefault("messages", ASK)
    kw.setdefault("tools", TOOLS)
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 120)
    return client.chat.completions.create(**kw)


def check_calls(calls, names=None):
    """Every call: a call_ id, a declared (or the named) function, JSON arguments that follow
    its schema. Returns [(name, arguments as a dict)]."""
    assert calls, "no tool calls"
    out = []
    for c in calls:
        assert CALL_ID.match(c.id), c.id
        assert c.type == "function"
        assert c.function.name in (names or SCHEMAS), c.function.name
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, SCHEMAS[c.function.name])
        out.append((c.function.name, args))
    return out


def stream_calls(client, **kw):
    """Streams a request and reassembles it the way OpenAI clients do: content, the tool calls
    by index (id, name, argument pieces), the finish reason."""
    content, calls, finish, roles = "", {}, None, 0
    for chunk in create(client, stream=True, **kw):
        for ch in chunk.choices:
            assert finish is None, "a chunk after finish_reason"
            d = ch.delta
            roles += d.role == "assistant"
            content += d.content or ""
            for tc in d.tool_calls or []:
                slot = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                if tc.id:
                    slot["id"] = tc.id
                if tc.function and tc.function.name:
                    slot["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    slot["arguments"] += tc.function.arguments
            if ch.finish_reason:
                finish = ch.finish_reason
    assert roles == 1
    assert sorted(calls) == list(range(len(calls)))
    return content, [calls[i] for i in sorted(calls)], finish


def as_objects(calls):
    class F:
        def __init__(self, c):
            self.name, self.arguments = c["name"], c["arguments"]

    class C:
        def __init__(self, c):
            self.id, self.type, self.function = c["id"], "function", F(c)
    return [C(c) for c in calls]


@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
def test_forced_call(tclient, choice):
    r = create(tclient, tool_choice=choice)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    assert c.message.role == "assistant"
    assert c.message.content is None
    names = ["get_weather"] if choice == NAMED else None
    calls = check_calls(c.message.tool_calls, names)
    assert calls[0][0] == "get_weather"
    assert "paris" in calls[0][1]["city"].lower()


@pytest.mark.parametrize("choice", ["required", NAMED], ids=["required", "named"])
def test_forced_call_streaming(tclient, choice):
    content, calls, finish = stream_calls(tclient, tool_choice=choice)
    assert finish == "tool_calls"
    assert content == ""
    names = ["get_weather"] if choice == NAMED else None
    got = check_calls(as_objects(calls), names)
    # Greedy: the stream carries exactly the non-streamed calls.
    whole = create(tclient, tool_choice=choice).choices[0].message.tool_calls
    assert got == [(c.function.name, json.loads(c.function.arguments)) for c in whole]


def test_n2_streaming_each_choice_calls(tclient):
    """n = 2 sampled choices, streamed: each choice's calls arrive with their own indexes and
    each choice finishes with tool_calls."""
    calls, finish = {}, {}
    for chunk in create(tclient, tool_choice="required", n=2, temperature=0.8, seed=7,
                        stream=True):
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or []:
                slot = calls.setdefault(ch.index, {}).setdefault(
                    tc.index, {"id": tc.id, "name": "", "arguments": ""})
                slot["name"] += tc.function.name or ""
                slot["arguments"] += tc.function.arguments or ""
            if ch.finish_reason:
                finish[ch.index] = ch.finish_reason
    assert finish == {0: "tool_calls", 1: "tool_calls"}
    for i in (0, 1):
        assert sorted(calls[i]) == list(range(len(calls[i])))
        check_calls(as_objects([calls[i][k] for k in sorted(calls[i])]))


def test_parallel_tool_calls_false_gives_one_call(tclient):
    ask = [{"role": "user", "content": "What is the weather in Paris, in Tokyo and in Lima?"}]
    r = create(tclient, messages=ask, tool_choice="required", parallel_tool_calls=False)
    assert r.choices[0].finish_reason == "tool_calls"
    assert len(check_calls(r.choices[0].message.tool_calls)) == 1


def test_round_trip(tclient):
    first = create(tclient, tool_choice="required").choices[0].message
    calls = check_calls(first.tool_calls)
    messages = ASK + [
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": c.id, "type": "function",
                         "function": {"name": c.function.name,
                                      "arguments": c.function.arguments}}
                        for c in first.tool_calls]},
    ] + [{"role": "tool", "tool_call_id": c.id,
          "content": json.dumps({"city": args.get("city", ""), "temperature": 22,
                                 "unit": "celsius", "sky": "sunny"})}
         for c, (_, args) in zip(first.tool_calls, calls)]
    for stream in (False, True):
        if stream:
            content, tool_calls, finish = stream_calls(tclient, messages=messages,
                                                       tool_choice="none")
            assert tool_calls == []
        else:
            r = create(tclient, messages=messages, tool_choice="none")
            content, finish = r.choices[0].message.content, r.choices[0].finish_reason
            assert r.choices[0].message.tool_calls is None
        assert finish in ("stop", "length")
        assert isinstance(content, str) and content.strip(), content
    # With the default ("auto") the model answers or calls again; either way a valid answer.
    r = create(tclient, messages=messages)
    c = r.choices[0]
    if c.message.tool_calls:
        assert c.finish_reason == "tool_calls"
        check_calls(c.message.tool_calls)
    else:
        assert c.finish_reason in ("stop", "length") and c.message.content


def test_auto_parses_the_models_calls(tclient):
    """Qwen2.5-Coder 0.5B writes its calls as bare {"name", "arguments"} JSON (no <tool_call>
    tags) at temperature 0; auto parses them, streaming and not."""
    r = create(tclient)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls", c.message.content
    assert c.message.content is None
    assert check_calls(c.message.tool_calls)[0][0] == "get_weather"
    content, calls, finish = stream_calls(tclient)
    assert finish == "tool_calls" and content == ""
    assert [(x["name"], json.loads(x["arguments"])) for x in calls] == [
        (t.function.name, json.loads(t.function.arguments)) for t in c.message.tool_calls]


def test_tool_choice_none_is_plain_content(tclient):
    r = create(tclient, tool_choice="none")
    c = r.choices[0]
    assert c.message.tool_calls is None
    assert isinstance(c.message.content, str) and c.message.content
    assert c.finish_reason in ("stop", "length")
    content, calls, finish = stream_calls(tclient, tool_choice="none")
    assert calls == [] and content == c.message.content and finish == c.finish_reason


def test_without_tools_nothing_changes(tclient):
    r = tclient.chat.completions.create(model=MODEL_NAME, messages=ASK, temperature=0,
                                        max_tokens=16)
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content


BAD = [
    ({"tools": [{"type": "function", "function": {"name": "get weather"}}]}, "tools"),
    ({"tools": [{"type": "retrieval"}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]}, "tools"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": "get_weather"}, "tools"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"tools": TOOLS, "tool_choice": "required",
      "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "required", "guided_regex": "a+"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "patternProperties": {"x": {}}}}}],
      "tool_choice": "required"}, "tools"),
    ({"tools": TOOLS, "messages": ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{city: Paris}"}}]}]},
     "messages"),
]


@pytest.mark.parametrize("extra,param", BAD, ids=[f"{i}-{p}" for i, (_, p) in enumerate(BAD)])
def test_invalid_tools_400(tserver, extra, param):
    body = {"model": MODEL_NAME, "messages": ASK, "max_tokens": 4, **extra}
    r = requests.post(tserver.base + "/v1/chat/completions", json=body,
                      headers=tserver.headers(), timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert err["type"] == "invalid_request_error" and err["message"]


def test_invalid_tools_400_through_the_client(tclient):
    with pytest.raises(openai.BadRequestError) as e:
        create(tclient, tools=[{"type": "function", "function": {"name": "a b"}}])
    assert e.value.status_code == 400
    with pytest.raises(openai.BadRequestError):
        create(tclient, tool_choice={"type": "function", "function": {"name": "nope"}})
