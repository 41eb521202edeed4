"""End-to-end tests of `peng serve` with the official `openai` Python client (issue 3).

Completions and chat (streaming and not, n=2, logprobs, stop strings, usage, seeds), every
4xx case in OpenAI's error shape, 64 concurrent streams, preemption under a too-small KV
pool, no leaked KV blocks (also after clients disconnect mid-stream), `promtool check
metrics`, and SIGTERM draining.
"""

import json
import os
import re
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import requests

from conftest import MODEL_NAME, PengServer

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name three colors."}]
IGNORE_EOS = {"ignore_eos": True}


def assert_openai_error(resp, status):
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert isinstance(body.get("error"), dict), body
    assert isinstance(body["error"].get("message"), str) and body["error"]["message"], body
    assert isinstance(body["error"].get("type"), str), body


def post(server, path, body, raw=None, headers=None):
    data = raw if raw is not None else json.dumps(body)
    return requests.post(server.base + path, data=data, headers=headers or server.headers(),
                         timeout=120)


# --- basics ---------------------------------------------------------------------------------

def test_health_and_models(server, client):
    assert requests.get(server.base + "/health", timeout=5).status_code == 200
    ids = [m.id for m in client.models.list().data]
    assert MODEL_NAME in ids


def test_completion(client):
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=8, temperature=0)
    assert r.object == "text_completion"
    assert len(r.choices) == 1
    c = r.choices[0]
    assert c.index == 0 and c.text
    assert c.finish_reason in ("length", "stop")
    assert 0 < r.usage.completion_tokens <= 8
    assert r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completion_max_tokens_is_exact_with_ignore_eos(client):
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=12,
                                  temperature=0, extra_body=IGNORE_EOS)
    assert r.usage.completion_tokens == 12
    assert r.choices[0].finish_reason == "length"


def test_completion_stream_matches_non_stream_and_reports_usage(client):
    whole = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=16,
                                      temperature=0)
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=16,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and
              c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].usage is not None and not chunks[-1].choices
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_chat(client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=16,
                                       temperature=0)
    assert r.object == "chat.completion"
    m = r.choices[0].message
    assert m.role == "assistant" and m.content
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_stream_matches_non_stream(client):
    whole = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=16,
                                           temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=CHAT,
                                                 max_tokens=16, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].object == "chat.completion.chunk"
    roles = [c.choices[0].delta.role for c in chunks if c.choices and c.choices[0].delta.role]
    assert roles == ["assistant"]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_max_completion_tokens(client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=CHAT,
                                       max_completion_tokens=5, temperature=0,
                                       extra_body=IGNORE_EOS)
    assert r.usage.completion_tokens == 5


# --- n, logprobs, stop, seed ----------------------------------------------------------------

def test_n2_completions_and_chat(client):
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=8, n=2,
                                  temperature=1, seed=7)
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert all(c.text for c in r.choices)
    r = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=8, n=2,
                                       temperature=1, seed=7)
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert all(c.message.content for c in r.choices)


def test_n2_stream(client):
    texts = {0: "", 1: ""}
    for chunk in client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=8, n=2,
                                           temperature=1, seed=3, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts[0] and texts[1]


def test_completion_logprobs(client):
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=6, temperature=0,
                                  logprobs=2, extra_body=IGNORE_EOS)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert "".join(lp.tokens) == r.choices[0].text
    for tok, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert logprob <= 0
        assert 1 <= len(top) <= 3  # the top 2, plus the sampled token when it is not in them
        # Greedy: the sampled token is the most likely one.
        assert abs(max(top.values()) - logprob) < 1e-4
    assert lp.text_offset[0] == 0


def test_chat_logprobs(client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=6,
                                       temperature=0, logprobs=True, top_logprobs=2,
                                       extra_body=IGNORE_EOS)
    content = r.choices[0].logprobs.content
    assert len(content) == 6
    assert "".join(t.token for t in content) == r.choices[0].message.content
    for t in content:
        assert t.logprob <= 0
        assert len(t.top_logprobs) == 2
        assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-4


def test_stop_string(client):
    full = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=24,
                                     temperature=0).choices[0].text
    # A stop string taken from the middle of the greedy output: the output must end right
    # before its first occurrence.
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert stop.strip(), f"unlucky output {full!r}"
    cut = full.index(stop)
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=24, temperature=0,
                                  stop=[stop, "never-appears-xyz"])
    assert r.choices[0].finish_reason == "stop"
    assert stop not in r.choices[0].text
    assert r.choices[0].text == full[:cut]


def test_stop_string_stream_and_chat(client):
    full = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=24,
                                          temperature=0).choices[0].message.content
    stop = full[len(full) // 2:len(full) // 2 + 2]
    assert stop.strip(), f"unlucky output {full!r}"
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=CHAT,
                                                 max_tokens=24, temperature=0, stop=stop,
                                                 stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert stop not in text
    assert text == full[:full.index(stop)]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_seed_reproducible_at_temperature_1(client):
    def run(seed):
        return client.completions.create(model=MODEL_NAME, prompt="Once upon a time",
                                         max_tokens=24, temperature=1, seed=seed,
                                         extra_body=IGNORE_EOS).choices[0].text
    a, b = run(1234), run(1234)
    assert a == b
    chat = [client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=16,
                                           temperature=1, seed=99).choices[0].message.content
            for _ in range(2)]
    assert chat[0] == chat[1]


# --- errors -----------------------------------------------------------------------------------

def test_bad_json_is_400(server):
    assert_openai_error(post(server, "/v1/completions", None, raw="{not json"), 400)
    assert_openai_error(post(server, "/v1/chat/completions", None, raw="[1, 2"), 400)


def test_wrong_typed_field_is_400(server):
    assert_openai_error(post(server, "/v1/completions",
                             {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": "ten"}), 400)
    assert_openai_error(post(server, "/v1/chat/completions",
                             {"model": MODEL_NAME, "messages": "hello"}), 400)
    assert_openai_error(post(server, "/v1/completions",
                             {"model": MODEL_NAME, "prompt": PROMPT, "stream": "yes"}), 400)


def test_out_of_range_values_are_400(server, client):
    for bad in ({"temperature": 5}, {"temperature": -1}, {"top_p": 1.5}, {"max_tokens": -3},
                {"n": 0}, {"presence_penalty": 3}, {"frequency_penalty": -2.5}):
        body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 2, **bad}
        r = post(server, "/v1/completions", body)
        assert r.status_code == 400, f"{bad} was accepted: {r.status_code}"
        assert_openai_error(r, 400)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL_NAME, prompt=PROMPT, temperature=5)


def test_prompt_longer_than_context_is_400(server, client):
    long_prompt = " ".join(["hello"] * 3000)  # --max-model-len is 1024
    assert_openai_error(post(server, "/v1/completions",
                             {"model": MODEL_NAME, "prompt": long_prompt, "max_tokens": 4}), 400)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL_NAME, max_tokens=4,
                                       messages=[{"role": "user", "content": long_prompt}])


def test_api_key():
    s = PengServer("--max-model-len", "512", api_key="sk-e2e-secret")
    try:
        body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 2}
        no_key = {"Content-Type": "application/json"}
        assert_openai_error(post(s, "/v1/completions", body, headers=no_key), 401)
        wrong = {**no_key, "Authorization": "Bearer sk-wrong"}
        assert_openai_error(post(s, "/v1/completions", body, headers=wrong), 401)
        assert_openai_error(requests.get(s.base + "/v1/models", headers=wrong, timeout=10), 401)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=s.base + "/v1", api_key="sk-wrong",
                          max_retries=0).completions.create(model=MODEL_NAME, prompt=PROMPT,
                                                            max_tokens=2)
        r = s.client().completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=2)
        assert r.choices[0].text is not None
    finally:
        s.kill()


def test_full_waiting_queue_is_429():
    s = PengServer("--max-model-len", "512", "--max-num-seqs", "1", "--max-waiting", "1")
    try:
        body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 48, "ignore_eos": True}
        with ThreadPoolExecutor(8) as pool:
            responses = list(pool.map(lambda _: post(s, "/v1/completions", body), range(8)))
        statuses = sorted(r.status_code for r in responses)
        assert 429 in statuses, statuses
        assert set(statuses) <= {200, 429}, statuses
        assert statuses.count(200) >= 1
        for r in responses:
            if r.status_code == 429:
                assert_openai_error(r, 429)
            else:
                assert r.json()["usage"]["completion_tokens"] == 48
        assert s.wait_idle() == 0
    finally:
        s.kill()


# --- load, preemption, leaks, metrics -------------------------------------------------------

def stream_one(client, i, max_tokens=16):
    text, finish = "", None
    for chunk in client.completions.create(model=MODEL_NAME, prompt=f"Story number {i}:",
                                           max_tokens=max_tokens, temperature=0.8, seed=i,
                                           stream=True, extra_body=IGNORE_EOS):
        for c in chunk.choices:
            text += c.text
            finish = c.finish_reason or finish
    return text, finish


def test_64_concurrent_streams_complete(server):
    client = server.client(timeout=600)
    with ThreadPoolExecutor(64) as pool:
        results = list(pool.map(lambda i: stream_one(client, i), range(64)))
    assert len(results) == 64
    for text, finish in results:
        assert text and finish == "length"
    assert server.wait_idle() == 0


def test_small_kv_pool_completes_every_request_by_preemption():
    # 40 blocks of 16 tokens (640 slots) for 16 sequences of at least ~124 tokens each (more
    # with a small vocabulary): whatever the model's KV bytes per token (an MLA cache is tiny),
    # the pool is too small for the load, while any one sequence fits.
    s = PengServer("--max-model-len", "512", "--max-num-seqs", "16",
                   "--num-kv-blocks", "40", "--no-prefix-caching")
    try:
        blocks = s.metric("kv_cache_capacity_blocks")
        prompt_words, max_tokens, n = 60, 64, 16
        needed_blocks = n * ((prompt_words + max_tokens) // 16)
        assert needed_blocks > 1.5 * blocks, (
            f"pool of {blocks} blocks is not too small for the load; lower --num-kv-blocks")
        client = s.client(timeout=600)

        def one(i):
            prompt = " ".join(f"word{i} number{j}" for j in range(prompt_words // 2))
            r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=max_tokens,
                                          temperature=0, extra_body=IGNORE_EOS)
            return r.usage.completion_tokens

        with ThreadPoolExecutor(n) as pool:
            assert list(pool.map(one, range(n))) == [max_tokens] * n
        assert s.metric("num_preemptions_total") > 0
        assert s.wait_idle() == 0
        assert s.metric("kv_cache_used_blocks") == 0
    finally:
        s.kill()


def test_disconnected_streams_free_their_blocks(server):
    def open_and_drop(i):
        body = {"model": MODEL_NAME, "prompt": f"Tell a long tale {i}", "max_tokens": 400,
                "ignore_eos": True, "stream": True}
        with requests.post(server.base + "/v1/completions", json=body, stream=True,
                           headers=server.headers(), timeout=120) as r:
            assert r.status_code == 200
            lines = r.iter_lines()
            got = 0
            for line in lines:
                if line.startswith(b"data: "):
                    got += 1
                    if got == 3:
                        break
        # Leaving the `with` closes the connection mid-stream.
        return got

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(open_and_drop, range(8))) == [3] * 8
    assert server.wait_idle(timeout_s=60) == 0
    assert server.metric("kv_cache_used_blocks") == 0
    assert server.metric("num_requests_running") == 0


def test_metrics_names(server):
    text = server.metrics_text()
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                 "kv_cache_used_blocks", "kv_cache_capacity_blocks", "prompt_tokens_total",
                 "generation_tokens_total", "time_to_first_token_seconds_bucket",
                 "inter_token_latency_seconds_bucket", "e2e_request_latency_seconds_bucket",
                 "prefix_cache_hits_total", "prefix_cache_queries_total",
                 "num_preemptions_total", "request_success_total"):
        assert re.search(r"^peng[:_]" + name + r"[{ ]", text, re.M), name
    assert server.metric("generation_tokens_total") > 0
    assert server.metric("prompt_tokens_total") > 0
    # The KV cache's block size and value type (the default, or PENG_E2E_SERVE_ARGS's).
    dtype = re.search(r"--kv-cache-dtype[ =](\S+)", os.environ.get("PENG_E2E_SERVE_ARGS", ""))
    assert re.search(r'^peng_cache_config_info\{model_name="[^"]*",block_size="16",cache_dtype="'
                     + (dtype.group(1).lower() if dtype else "f16") + r'"\} 1$', text, re.M), \
        "cache_config_info"
    # The layout: scripts/mpi_serve.sh runs the server over PENG_TP x PENG_PP x PENG_DP ranks
    # (test.sh e2e-tp, e2e-pp, e2e-dp).
    assert server.metric("tensor_parallel_size") == int(os.environ.get("PENG_TP", "1"))
    assert server.metric("pipeline_parallel_size") == int(os.environ.get("PENG_PP", "1"))
    dp = int(os.environ.get("PENG_DP", "1"))
    assert server.metric("data_parallel_size") == dp
    if dp > 1:  # each replica's gauges; the requests above ran on replica 0 at least
        for name in ("replica_num_requests_running", "replica_num_requests_waiting",
                     "replica_kv_cache_usage_perc", "replica_forward_seconds_total"):
            for d in range(dp):
                assert re.search(r'^peng_%s\{[^}]*replica="%d"\} \S+$' % (name, d), text, re.M), \
                    (name, d)
        assert server.metric("replica_forward_seconds_total") > 0  # (replica 0's sample)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed "
                    "(Debian package prometheus)")
def test_promtool_check_metrics(server):
    r = subprocess.run(["promtool", "check", "metrics"], input=server.metrics_text(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


# --- shutdown ---------------------------------------------------------------------------------

def test_sigterm_drains_running_request():
    s = PengServer("--max-model-len", "512")
    try:
        client = s.client(timeout=300)
        first_chunk = threading.Event()
        result = {}

        def run():
            text, n, finish = "", 0, None
            for chunk in client.completions.create(model=MODEL_NAME, prompt=PROMPT,
                                                   max_tokens=64, temperature=0, stream=True,
                                                   stream_options={"include_usage": True},
                                                   extra_body=IGNORE_EOS):
                for c in chunk.choices:
                    text += c.text
                    finish = c.finish_reason or finish
                    first_chunk.set()
                if chunk.usage:
                    n = chunk.usage.completion_tokens
            result.update(text=text, n=n, finish=finish)

        t = threading.Thread(target=run)
        t.start()
        assert first_chunk.wait(120)
        t0 = time.monotonic()
        s.proc.send_signal(15)
        # New work is refused while draining (503), or the listener is already gone. The signal
        # is handled asynchronously (a waiter thread), so a request sent at once may still be
        # accepted on a busy machine; within a few seconds one must be refused.
        refused = False
        deadline = time.monotonic() + 10
        while not refused and time.monotonic() < deadline:
            try:
                r = post(s, "/v1/completions", {"model": MODEL_NAME, "prompt": PROMPT,
                                                "max_tokens": 2})
                assert r.status_code in (200, 503), r.text
                refused = r.status_code == 503
            except requests.ConnectionError:
                refused = True
            if not refused:
                time.sleep(0.05)
        assert refused, "new requests were still accepted 10 s after SIGTERM"
        t.join(300)
        assert result.get("n") == 64 and result.get("finish") == "length", result
        assert s.proc.wait(timeout=120) == 0, s.log_text()
        assert time.monotonic() - t0 < 120
    finally:
        s.kill()
