#!/usr/bin/env python3
"""Soak test of a running `peng serve` (or any OpenAI-compatible server) on loopback.

Sends --requests mixed requests (default 10,000) with --concurrency in flight (default 32):

  good        completions and chat, streaming and not, n > 1, batched prompts, logprobs /
              top_logprobs, stop strings, seeds, max_tokens 1..16, include_usage;
  disconnect  the client goes away on purpose: right after sending the request, in the
              middle of sending its body, or in the middle of a stream;
  bad         invalid JSON, wrong types, out-of-range values, unknown model, a prompt longer
              than the context, a body over --max-body-bytes, nesting deeper than 64, missing
              fields: each must get exactly its intended status and error code.

Every good request must get a complete, well-formed answer: non-streaming, a JSON object
with one choice per prompt and sample (indices 0..k-1) each with a finish_reason, logprobs
when asked (one entry per token), consistent usage; streaming, `data:` events of one
response id, no chunk of a choice after its finish_reason, every choice finished, the usage
chunk last when asked, then `data: [DONE]` and nothing after it. Response ids must be unique
over the whole run (no duplicated outputs). No 5xx, and no connection error except the ones
the script causes itself.

Before and after (once the server is idle: nothing running or waiting, no KV block in use),
it reads the server's RSS (/proc/PID/status, with --pid) and the KV blocks in use
(peng_kv_cache_used_blocks on /metrics), and samples the RSS during the run (a plateau
or a steady climb). It prints a JSON summary (and writes it to --out):
requests by class, statuses, errors by class, duration, RSS, KV blocks, lost and duplicated
outputs. The exit status is 1 on any violation, 2 on a usage error.

Loopback only: the URL must resolve to 127.0.0.0/8 or ::1. Bounded: --requests requests,
each with a timeout, and --max-duration for the whole run.

  python bench/soak.py --url http://127.0.0.1:8000 --pid "$(pgrep -n peng)" --requests 2000
"""

import argparse
import asyncio
import json
import random
import sys
import time
from collections import Counter, defaultdict

import aiohttp

from loopback import check_loopback, die

WORDS = ("the of and to in is was for on are with as by at from that this it be or an "
         "have not had but what all were when we there can more if no out so said one "
         "about up time them some could new into two has like other than first been "
         "water people sound year day way find use part long number make write word "
         "place city river music story color light house paper world school north").split()
STOPS = ["\n", ".", ",", " the", " and", "!", "?", " is"]
FINISH_OK = {"stop", "length"}

GOOD = ["comp", "comp_stream", "comp_batch", "chat", "chat_stream"]
DISCONNECT = ["disc_after_send", "disc_mid_body", "disc_mid_stream"]
BAD = ["bad_json", "bad_type", "bad_range", "bad_model", "bad_too_long", "bad_oversize",
       "bad_nesting", "bad_missing"]
DEFAULT_WEIGHTS = {
    "comp": 16, "comp_stream": 16, "comp_batch": 6, "chat": 14, "chat_stream": 16,
    "disc_after_send": 3, "disc_mid_body": 2, "disc_mid_stream": 4,
    "bad_json": 3, "bad_type": 4, "bad_range": 4, "bad_model": 3, "bad_too_long": 3,
    "bad_oversize": 0.5, "bad_nesting": 2, "bad_missing": 3,
}


class Stats:
    def __init__(self):
        self.by_class = Counter()
        self.status = Counter()
        self.status_by_class = defaultdict(Counter)
        self.errors = defaultdict(Counter)      # class -> error kind -> count
        self.examples = []                      # first violations, for the report
        self.caused_disconnects = Counter()     # what happened to our own hang-ups
        self.response_ids = Counter()
        self.lost = 0
        self.complete = 0
        self.tokens = 0

    def violation(self, cls, kind, detail):
        self.errors[cls][kind] += 1
        if len(self.examples) < 20:
            self.examples.append({"class": cls, "error": kind, "detail": str(detail)[:600]})


def words(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


# --- request generation ----------------------------------------------------------------------

def sampling(rng, body):
    """Random valid sampling fields."""
    body["max_tokens"] = rng.randint(1, 16)
    r = rng.random()
    if r < 0.3:
        body["temperature"] = 0
    elif r < 0.8:
        body["temperature"] = round(rng.uniform(0.2, 1.5), 2)
        body["seed"] = rng.randint(0, 2**31)
    if rng.random() < 0.3:
        body["stop"] = rng.choice(STOPS) if rng.random() < 0.5 else rng.sample(STOPS, 2)
    if rng.random() < 0.2:
        body["top_p"] = round(rng.uniform(0.5, 1.0), 2)
    if rng.random() < 0.15:
        body["top_k"] = rng.randint(1, 50)
    if rng.random() < 0.1:
        body["ignore_eos"] = True
    if rng.random() < 0.25:
        body["n"] = rng.randint(2, 4)


def make_good(rng, cls, model):
    stream = cls.endswith("_stream") or (cls == "comp_batch" and rng.random() < 0.5)
    body = {"model": model}
    if cls.startswith("comp"):
        path = "/v1/completions"
        if cls == "comp_batch":
            body["prompt"] = [words(rng, 1, 20) for _ in range(rng.randint(2, 3))]
        elif rng.random() < 0.1:
            body["prompt"] = [rng.randint(10, 5000) for _ in range(rng.randint(1, 20))]
        else:
            body["prompt"] = words(rng, 1, 30)
        sampling(rng, body)
        if rng.random() < 0.3:
            body["logprobs"] = rng.randint(0, 5)
        elif rng.random() < 0.1:
            body["echo"] = True
    else:
        path = "/v1/chat/completions"
        msgs = []
        if rng.random() < 0.3:
            msgs.append({"role": "system", "content": words(rng, 3, 12)})
        for _ in range(rng.choice([1, 1, 1, 2])):
            if msgs and msgs[-1]["role"] == "user":
                msgs.append({"role": "assistant", "content": words(rng, 2, 10)})
            content = words(rng, 1, 25)
            if rng.random() < 0.15:
                content = [{"type": "text", "text": content}]
            msgs.append({"role": "user", "content": content})
        body["messages"] = msgs
        sampling(rng, body)
        if rng.random() < 0.3:
            body["logprobs"] = True
            body["top_logprobs"] = rng.randint(0, 5)
        if rng.random() < 0.2:
            body["max_completion_tokens"] = body.pop("max_tokens")
    if stream:
        body["stream"] = True
        if rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
    return path, body


def make_bad(rng, cls, model, max_model_len, max_body_bytes):
    """(path, raw body bytes, expected status, expected error code)."""
    comp = rng.random() < 0.5
    path = "/v1/completions" if comp else "/v1/chat/completions"
    base = ({"model": model, "prompt": words(rng, 1, 5), "max_tokens": 4} if comp else
            {"model": model, "messages": [{"role": "user", "content": words(rng, 1, 5)}],
             "max_tokens": 4})
    if cls == "bad_json":
        raw = json.dumps(base)
        cut = rng.choice([raw[:-1], raw[: len(raw) // 2], raw.replace(":", "", 1),
                          raw + "}", "{'prompt': 'x'}", "", "null x", "\xff\xfe"])
        return path, cut.encode("utf-8", "surrogateescape"), 400, "invalid_json"
    if cls == "bad_type":
        field, value = rng.choice([("max_tokens", "8"), ("temperature", "hot"), ("n", "2"),
                                   ("stream", "yes"), ("stop", 5), ("seed", 1.5),
                                   ("top_p", [1]), ("model", 7), ("logit_bias", [])])
        base[field] = value
        return path, json.dumps(base).encode(), 400, "invalid_type"
    if cls == "bad_range":
        field, value = rng.choice([("temperature", 5), ("n", 0), ("n", 129), ("top_p", 0),
                                   ("max_tokens", 0), ("presence_penalty", 3),
                                   ("frequency_penalty", -2.5), ("min_p", 1.5),
                                   ("seed", -2), ("top_k", -2)])
        base[field] = value
        return path, json.dumps(base).encode(), 400, "invalid_value"
    if cls == "bad_model":
        base["model"] = "no-such-model-" + str(rng.randint(0, 999))
        return path, json.dumps(base).encode(), 404, "model_not_found"
    if cls == "bad_too_long":
        if comp:
            base["prompt"] = [rng.randint(10, 5000) for _ in range(max_model_len)]
        else:
            base["messages"][0]["content"] = "hello " * (max_model_len + 8)
        return path, json.dumps(base).encode(), 400, "context_length_exceeded"
    if cls == "bad_oversize":
        pad = max_body_bytes + 1 - len(json.dumps(base)) + 20
        base["user"] = "x" * max(pad, 1)
        raw = json.dumps(base).encode()
        assert len(raw) > max_body_bytes
        return path, raw, 413, "request_too_large"
    if cls == "bad_nesting":
        depth = rng.randint(65, 400)
        raw = json.dumps(base)[:-1] + ', "extra": ' + "[" * depth + "]" * depth + "}"
        return path, raw.encode(), 400, "invalid_json"
    if cls == "bad_missing":
        base.pop("prompt" if comp else "messages")
        return path, json.dumps(base).encode(), 400, "missing_required"
    raise ValueError(cls)


# --- checks -----------------------------------------------------------------------------------

def n_choices(body):
    prompt = body.get("prompt")
    prompts = len(prompt) if isinstance(prompt, list) and prompt and isinstance(
        prompt[0], (str, list)) else 1
    return prompts * body.get("n", 1)


def max_tokens_of(body):
    return body.get("max_completion_tokens", body.get("max_tokens", 16))


def check_logprobs(lp, chat, body, finish, where):
    """Problems with one choice's logprobs object (None when fine)."""
    if lp is None:
        return f"{where}: logprobs missing"
    want_top = body.get("top_logprobs", 0) if chat else body.get("logprobs", 0)
    if chat:
        entries = lp.get("content")
        if not isinstance(entries, list):
            return f"{where}: logprobs.content not a list"
        for e in entries:
            if not isinstance(e.get("logprob"), (int, float)) or len(e.get("top_logprobs", [])) > want_top:
                return f"{where}: bad logprob entry {e}"
        count = len(entries)
    else:
        keys = ("text_offset", "token_logprobs", "tokens", "top_logprobs")
        if not all(isinstance(lp.get(k), list) for k in keys):
            return f"{where}: logprobs fields missing"
        lens = {len(lp[k]) for k in keys}
        if len(lens) != 1:
            return f"{where}: logprobs arrays of different lengths {lens}"
        if any(len(t) > want_top for t in lp["top_logprobs"]):
            return f"{where}: more top_logprobs than asked"
        count = lens.pop()
    if count > max_tokens_of(body):
        return f"{where}: {count} logprob entries > max_tokens"
    if finish == "length" and count != max_tokens_of(body) and not body.get("stream"):
        return f"{where}: finish_reason length with {count} tokens != max_tokens"
    return None


def check_full(data, path, body):
    """Problems with a non-streaming answer (None when fine)."""
    chat = path.endswith("chat/completions")
    if not isinstance(data, dict):
        return "body is not a JSON object"
    if data.get("object") != ("chat.completion" if chat else "text_completion"):
        return f"object = {data.get('object')!r}"
    choices = data.get("choices")
    if not isinstance(choices, list) or len(choices) != n_choices(body):
        return f"{len(choices) if isinstance(choices, list) else choices} choices, want {n_choices(body)}"
    if sorted(c.get("index") for c in choices) != list(range(n_choices(body))):
        return f"choice indices {[c.get('index') for c in choices]}"
    for c in choices:
        if c.get("finish_reason") not in FINISH_OK:
            return f"choice {c.get('index')} finish_reason {c.get('finish_reason')!r}"
        if chat:
            m = c.get("message") or {}
            if m.get("role") != "assistant" or not isinstance(m.get("content"), str):
                return f"choice {c.get('index')} message {m}"
        elif not isinstance(c.get("text"), str):
            return f"choice {c.get('index')} text {c.get('text')!r}"
        # chat: "logprobs": true; completions: "logprobs": N (0 included)
        wants_lp = body.get("logprobs") is True if chat else body.get("logprobs") is not None
        if wants_lp:
            err = check_logprobs(c.get("logprobs"), chat, body, c["finish_reason"],
                                 f"choice {c['index']}")
            if err:
                return err
        elif c.get("logprobs") is not None:
            return f"choice {c['index']} has logprobs nobody asked for"
    u = data.get("usage") or {}
    if not all(isinstance(u.get(k), int) for k in ("prompt_tokens", "completion_tokens",
                                                   "total_tokens")):
        return f"usage {u}"
    if u["total_tokens"] != u["prompt_tokens"] + u["completion_tokens"]:
        return f"usage does not add up: {u}"
    if not 0 < u["completion_tokens"] <= n_choices(body) * max_tokens_of(body):
        return f"completion_tokens {u['completion_tokens']} out of range"
    return None


def check_stream(events, path, body):
    """Problems with a streamed answer, given its `data:` payloads (None when fine)."""
    chat = path.endswith("chat/completions")
    if not events or events[-1] != "[DONE]":
        return "stream does not end with data: [DONE]"
    if events.count("[DONE]") != 1:
        return "more than one [DONE]"
    want = n_choices(body)
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    ids, finished, started, usage_seen = set(), {}, set(), False
    for i, p in enumerate(events[:-1]):
        try:
            chunk = json.loads(p)
        except ValueError:
            return f"event {i} is not JSON: {p[:100]!r}"
        if "error" in chunk:
            return f"error event: {chunk['error']}"
        ids.add(chunk.get("id"))
        if chunk.get("object") != ("chat.completion.chunk" if chat else "text_completion"):
            return f"event {i} object {chunk.get('object')!r}"
        if usage_seen:
            return "a chunk after the usage chunk"
        if include_usage and "usage" not in chunk:
            return f"event {i} lacks the usage field"
        if not chunk.get("choices"):
            if not include_usage or not chunk.get("usage"):
                return f"event {i} has no choices and no usage"
            usage_seen = True
            u = chunk["usage"]
            if u.get("total_tokens") != u.get("prompt_tokens", 0) + u.get("completion_tokens", 0):
                return f"usage does not add up: {u}"
            continue
        if len(chunk["choices"]) != 1:
            return f"event {i} has {len(chunk['choices'])} choices"
        c = chunk["choices"][0]
        idx = c.get("index")
        if not isinstance(idx, int) or not 0 <= idx < want:
            return f"event {i} choice index {idx} (want 0..{want - 1})"
        if idx in finished:
            return f"choice {idx} has a chunk after its finish_reason"
        if chat:
            delta = c.get("delta")
            if not isinstance(delta, dict):
                return f"event {i} delta {delta!r}"
            if idx not in started and delta.get("role") != "assistant":
                return f"choice {idx}: first chunk without role"
        elif not isinstance(c.get("text"), str):
            return f"event {i} text {c.get('text')!r}"
        started.add(idx)
        if c.get("finish_reason") is not None:
            if c["finish_reason"] not in FINISH_OK:
                return f"choice {idx} finish_reason {c['finish_reason']!r}"
            finished[idx] = c["finish_reason"]
    if len(ids) != 1:
        return f"{len(ids)} response ids in one stream"
    if sorted(finished) != list(range(want)):
        return f"finished choices {sorted(finished)}, want 0..{want - 1}"
    if include_usage and not usage_seen:
        return "include_usage without a usage chunk"
    return None


# --- the client -------------------------------------------------------------------------------

class Soak:
    def __init__(self, args):
        self.args = args
        self.base = args.url.rstrip("/")
        self.host, self.port = check_loopback(self.base)
        self.headers = {"Content-Type": "application/json"}
        if args.api_key:
            self.headers["Authorization"] = f"Bearer {args.api_key}"
        self.stats = Stats()
        self.timeout = aiohttp.ClientTimeout(total=args.timeout)

    # Server state.
    def rss_kib(self):
        if not self.args.pid:
            return None
        try:
            with open(f"/proc/{self.args.pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            return {k: int(fields[k].split()[0]) for k in ("VmRSS", "VmHWM") if k in fields}
        except OSError:
            return None

    async def metrics(self, session):
        async with session.get(self.base + "/metrics", headers=self.headers,
                               timeout=aiohttp.ClientTimeout(total=10)) as r:
            text = await r.text()
        values = {}
        for line in text.splitlines():
            if line.startswith("peng_") and " " in line:
                name = line.split("{", 1)[0].split(" ", 1)[0]
                try:
                    values.setdefault(name, float(line.rsplit(" ", 1)[1]))
                except ValueError:
                    pass
        return values

    async def wait_idle(self, session, timeout_s):
        deadline = time.monotonic() + timeout_s
        while True:
            m = await self.metrics(session)
            idle = (m.get("peng_num_requests_running", 0) == 0 and
                    m.get("peng_num_requests_waiting", 0) == 0 and
                    m.get("peng_kv_cache_used_blocks", 0) == 0)
            if idle or time.monotonic() > deadline:
                return m, idle
            await asyncio.sleep(0.25)

    # Requests.
    async def good(self, session, cls, path, body):
        st = self.stats
        try:
            async with session.post(self.base + path, json=body, headers=self.headers,
                                    timeout=self.timeout) as r:
                st.status[r.status] += 1
                st.status_by_class[cls][r.status] += 1
                if r.status != 200:
                    st.lost += 1
                    return st.violation(cls, f"status_{r.status}", (await r.text())[:300])
                if body.get("stream"):
                    if not r.headers.get("Content-Type", "").startswith("text/event-stream"):
                        st.lost += 1
                        return st.violation(cls, "content_type", r.headers.get("Content-Type"))
                    events, pending = [], []
                    async for raw in r.content:
                        line = raw.decode("utf-8", "replace").rstrip("\r\n")
                        if line == "":
                            if pending:
                                events.append("\n".join(pending))
                                pending = []
                        elif line.startswith("data: "):
                            pending.append(line[6:])
                        else:
                            st.lost += 1
                            return st.violation(cls, "sse_line", line[:200])
                    if pending:
                        events.append("\n".join(pending))
                    err = check_stream(events, path, body)
                    rid = None
                    if not err:
                        rid = json.loads(events[0]).get("id")
                else:
                    data = await r.json(content_type=None)
                    err = check_full(data, path, body)
                    rid = data.get("id") if isinstance(data, dict) else None
                if err:
                    st.lost += 1
                    return st.violation(cls, "malformed_answer", f"{err} | body={json.dumps(body)[:300]}")
                st.complete += 1
                st.response_ids[rid] += 1
        except asyncio.TimeoutError:
            st.lost += 1
            st.violation(cls, "timeout", f"{path} {json.dumps(body)[:200]}")
        except aiohttp.ClientError as e:
            st.lost += 1
            st.violation(cls, "connection_error", f"{type(e).__name__}: {e}")

    async def bad(self, session, cls, path, raw, want_status, want_code):
        st = self.stats
        try:
            async with session.post(self.base + path, data=raw, headers=self.headers,
                                    timeout=self.timeout) as r:
                st.status[r.status] += 1
                st.status_by_class[cls][r.status] += 1
                text = await r.text()
                if r.status != want_status:
                    return st.violation(cls, f"status_{r.status}_want_{want_status}",
                                        f"{text[:300]} | sent {raw[:200]!r}")
                try:
                    err = json.loads(text)["error"]
                    ok = (isinstance(err["message"], str) and isinstance(err["type"], str) and
                          "param" in err and err.get("code") == want_code)
                except (ValueError, KeyError, TypeError):
                    ok = False
                if not ok:
                    st.violation(cls, "error_body", f"want code {want_code}: {text[:300]}")
        except asyncio.TimeoutError:
            st.violation(cls, "timeout", f"{raw[:200]!r}")
        except aiohttp.ClientError as e:
            st.violation(cls, "connection_error", f"{type(e).__name__}: {e} | sent {raw[:100]!r}")

    def raw_request(self, path, payload, content_length=None):
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: application/json\r\n"
                f"Content-Length: {len(payload) if content_length is None else content_length}\r\n")
        if self.args.api_key:
            head += f"Authorization: Bearer {self.args.api_key}\r\n"
        return (head + "\r\n").encode() + payload

    async def disconnect(self, rng, cls, path, body):
        """Hangs up on purpose; only a refused connection counts as a failure here."""
        st = self.stats
        payload = json.dumps(body).encode()
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), 10)
        except (OSError, asyncio.TimeoutError) as e:
            return st.violation(cls, "connect_failed", e)
        what = "closed"
        try:
            if cls == "disc_mid_body":
                cut = rng.randint(0, len(payload) - 1)
                writer.write(self.raw_request(path, payload[:cut], content_length=len(payload)))
                await writer.drain()
                await asyncio.sleep(rng.uniform(0, 0.05))
            elif cls == "disc_after_send":
                writer.write(self.raw_request(path, payload))
                await writer.drain()
                await asyncio.sleep(rng.choice([0, 0, rng.uniform(0, 0.3)]))
            else:  # disc_mid_stream: read a few events, then hang up
                writer.write(self.raw_request(path, payload))
                await writer.drain()
                want_events = rng.randint(1, 4)
                seen = 0
                deadline = time.monotonic() + self.args.timeout
                while seen < want_events and time.monotonic() < deadline:
                    line = await asyncio.wait_for(reader.readline(), self.args.timeout)
                    if not line:
                        what = "server_closed_first"
                        break
                    if line.startswith(b"HTTP/1.1 ") and not line.startswith(b"HTTP/1.1 200"):
                        what = "status_" + line.split()[1].decode()
                        st.violation(cls, what, line[:100])
                        break
                    if line.startswith(b"data: [DONE]"):
                        what = "stream_ended_first"
                        break
                    if line.startswith(b"data: "):
                        seen += 1
        except (OSError, asyncio.TimeoutError) as e:
            what = type(e).__name__
        finally:
            if rng.random() < 0.5:
                writer.transport.abort()  # RST
            else:
                writer.close()
            try:
                await asyncio.wait_for(writer.wait_closed(), 5)
            except (OSError, asyncio.TimeoutError):
                pass
        st.caused_disconnects[f"{cls}:{what}"] += 1

    # The run.
    def plan(self, model, max_model_len):
        rng = random.Random(self.args.seed)
        weights = dict(DEFAULT_WEIGHTS)
        if self.args.no_oversize:
            weights["bad_oversize"] = 0
        classes = list(weights)
        picks = rng.choices(classes, [weights[c] for c in classes], k=self.args.requests)
        for i, cls in enumerate(picks):
            r = random.Random(self.args.seed * 1_000_003 + i)
            if cls in BAD:
                yield cls, r, make_bad(r, cls, model, max_model_len, self.args.max_body_bytes)
            else:
                gcls = cls
                if cls == "disc_mid_stream":
                    gcls = rng.choice(["comp_stream", "chat_stream"])
                elif cls in DISCONNECT:
                    gcls = rng.choice(GOOD)
                path, body = make_good(r, gcls, model)
                if cls == "disc_mid_stream":
                    body["max_tokens"] = 16
                    body.pop("max_completion_tokens", None)
                    body["ignore_eos"] = True
                yield cls, r, (path, body)

    async def run(self):
        a = self.args
        conn = aiohttp.TCPConnector(limit=a.concurrency, force_close=False)
        async with aiohttp.ClientSession(connector=conn) as session:
            async with session.get(self.base + "/v1/models", headers=self.headers,
                                   timeout=aiohttp.ClientTimeout(total=10)) as r:
                models = await r.json()
            model = a.model or models["data"][0]["id"]
            max_model_len = int(models["data"][0].get("max_model_len") or a.max_model_len)
            m0, idle0 = await self.wait_idle(session, 30)
            before = {"rss_kib": self.rss_kib(),
                      "kv_used_blocks": m0.get("peng_kv_cache_used_blocks"),
                      "kv_capacity_blocks": m0.get("peng_kv_cache_capacity_blocks"),
                      "idle": idle0}
            queue = asyncio.Queue()
            for item in self.plan(model, max_model_len):
                queue.put_nowait(item)
            t0 = time.monotonic()
            deadline = t0 + a.max_duration
            done = 0

            async def worker():
                nonlocal done
                while time.monotonic() < deadline:
                    try:
                        cls, rng, spec = queue.get_nowait()
                    except asyncio.QueueEmpty:
                        return
                    self.stats.by_class[cls] += 1
                    if cls in BAD:
                        await self.bad(session, cls, *spec)
                    elif cls in DISCONNECT:
                        await self.disconnect(rng, cls, *spec)
                    else:
                        await self.good(session, cls, *spec)
                    done += 1
                    if a.progress and done % a.progress == 0:
                        print(f"soak.py: {done}/{a.requests} in {time.monotonic() - t0:.0f} s",
                              file=sys.stderr, flush=True)

            rss_samples = []

            async def sample_rss():
                while True:
                    rss = self.rss_kib()
                    if rss:
                        rss_samples.append((round(time.monotonic() - t0, 1), rss["VmRSS"]))
                    await asyncio.sleep(a.rss_interval)

            sampler = asyncio.create_task(sample_rss())
            await asyncio.gather(*(worker() for _ in range(a.concurrency)))
            duration = time.monotonic() - t0
            sampler.cancel()
            not_sent = queue.qsize()
            m1, idle1 = await self.wait_idle(session, a.idle_timeout)
            try:
                async with session.get(self.base + "/health",
                                       timeout=aiohttp.ClientTimeout(total=10)) as r:
                    health = r.status
            except aiohttp.ClientError:
                health = None
            after = {"rss_kib": self.rss_kib(),
                     "kv_used_blocks": m1.get("peng_kv_cache_used_blocks"),
                     "kv_capacity_blocks": m1.get("peng_kv_cache_capacity_blocks"),
                     "running": m1.get("peng_num_requests_running"),
                     "waiting": m1.get("peng_num_requests_waiting"),
                     "idle": idle1, "health": health}
        # At most ~20 samples in the report: enough to tell a plateau from a steady climb.
        step = max(1, len(rss_samples) // 20)
        after["rss_kib_during_run"] = [list(x) for x in rss_samples[::step]]
        return self.report(before, after, duration, not_sent, m0, m1)

    def report(self, before, after, duration, not_sent, m0, m1):
        st = self.stats
        duplicated = sum(c - 1 for rid, c in st.response_ids.items() if rid and c > 1)
        violations = sum(sum(c.values()) for c in st.errors.values())
        server_errors = sum(c for s, c in st.status.items() if s >= 500)
        problems = []
        if violations:
            problems.append(f"{violations} violations")
        if server_errors:
            problems.append(f"{server_errors} 5xx")
        if duplicated:
            problems.append(f"{duplicated} duplicated outputs")
        if not_sent:
            problems.append(f"{not_sent} requests not sent within --max-duration")
        if not after["idle"]:
            problems.append("server not idle afterwards (running/waiting/KV blocks)")
        if after["health"] != 200:
            problems.append(f"/health = {after['health']} afterwards")
        gen = lambda m: m.get("peng_generation_tokens_total", 0)  # noqa: E731
        summary = {
            "ok": not problems,
            "problems": problems,
            "url": self.base,
            "requests": self.args.requests,
            "concurrency": self.args.concurrency,
            "duration_s": round(duration, 1),
            "requests_per_s": round(sum(st.by_class.values()) / duration, 1) if duration else None,
            "generated_tokens": gen(m1) - gen(m0),
            "requests_by_class": dict(sorted(st.by_class.items())),
            "status_counts": {str(k): v for k, v in sorted(st.status.items())},
            "status_by_class": {c: {str(k): v for k, v in sorted(s.items())}
                                for c, s in sorted(st.status_by_class.items())},
            "errors_by_class": {c: dict(e) for c, e in sorted(st.errors.items())},
            "error_examples": st.examples,
            "caused_disconnects": dict(sorted(st.caused_disconnects.items())),
            "good_complete": st.complete,
            "lost_outputs": st.lost,
            "duplicated_outputs": duplicated,
            "not_sent": not_sent,
            "server_before": before,
            "server_after": after,
        }
        if before.get("rss_kib") and after.get("rss_kib"):
            summary["rss_growth_kib"] = after["rss_kib"]["VmRSS"] - before["rss_kib"]["VmRSS"]
        return summary


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL (loopback)")
    p.add_argument("--pid", type=int, help="server process id, for its RSS")
    p.add_argument("-n", "--requests", type=int, default=10000)
    p.add_argument("-c", "--concurrency", type=int, default=32)
    p.add_argument("--model", help="model name (default: the first of /v1/models)")
    p.add_argument("--api-key")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-body-bytes", type=int, default=8 << 20,
                   help="the server's --max-body-bytes (oversize bodies are one byte more)")
    p.add_argument("--no-oversize", action="store_true", help="send no oversize bodies")
    p.add_argument("--max-model-len", type=int, default=4096,
                   help="used when /v1/models does not say")
    p.add_argument("--timeout", type=float, default=120, help="seconds per request")
    p.add_argument("--max-duration", type=float, default=3600,
                   help="stop sending new requests after this many seconds")
    p.add_argument("--idle-timeout", type=float, default=60,
                   help="seconds to wait for the server to become idle at the end")
    p.add_argument("--progress", type=int, default=1000, help="progress line every N requests")
    p.add_argument("--rss-interval", type=float, default=5, help="seconds between RSS samples")
    p.add_argument("--out", help="also write the JSON summary here")
    args = p.parse_args()
    if args.requests < 1 or args.concurrency < 1:
        die("--requests and --concurrency must be >= 1")
    summary = asyncio.run(Soak(args).run())
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    sys.exit(0 if summary["ok"] else 1)


if __name__ == "__main__":
    main()
