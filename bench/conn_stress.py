#!/usr/bin/env python3
"""Connection stress test of a running `peng serve` on loopback, in two parts.

1. Burst: --burst connections (default 500) are opened at once; when all are open (or have
   failed), each sends one short completion request (Connection: close) at the same moment.
   Reported: connection errors (must be 0), statuses (200, and 429/503 when the server says
   it is at capacity, counted apart), latency percentiles.

2. Idle hold: --idle connections (default 1,000) are opened and held for --hold seconds:
   a third send nothing, a third send a partial request header once, a third are slowloris
   clients that send one more header byte every --drip seconds. Meanwhile a normal client
   streams a completion and GET /health is timed every half second. Reported: the normal
   client's time to first token and total time and /health latency, both also measured
   before the idle connections were opened for comparison; how many idle connections the
   server closed (and after how long, and what it answered) by kind; then all are closed.

The exit status is 1 when a burst connection failed, a burst request got another status
than 200/429/503 or no answer, an idle connection could not be opened, or the normal
client or /health failed or took longer than --timeout / --health-timeout, or the whole run
took longer than --max-duration (600 s); 2 on a usage error. A JSON summary
goes to stdout (and --out).

Loopback only: the URL must resolve to 127.0.0.0/8 or ::1. Bounded: a fixed number of
connections, --timeout on every wait, --hold for the idle part; all sockets are closed at
the end. Raises its own open-file limit to the hard limit (1,000+ sockets need more than
the usual 1,024).

  python bench/conn_stress.py --url http://127.0.0.1:8000
"""

import argparse
import asyncio
import json
import resource
import statistics
import sys
import time
from collections import Counter, defaultdict

import aiohttp

from loopback import check_loopback, die


def raise_nofile(need):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, need)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < need:
        die(f"open-file limit {soft} < {need} needed (raise it: ulimit -n)")
    return soft


def pct(values, q):
    if not values:
        return None
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))] * 1000, 1)


def latency_summary(values):
    return {"n": len(values), "p50_ms": pct(values, 0.5), "p90_ms": pct(values, 0.9),
            "max_ms": pct(values, 1.0)}


class Stress:
    def __init__(self, args):
        self.a = args
        self.base = args.url.rstrip("/")
        self.host, self.port = check_loopback(self.base)
        self.auth = f"Authorization: Bearer {args.api_key}\r\n" if args.api_key else ""
        self.problems = []

    def request_bytes(self, model, close=True):
        body = json.dumps({"model": model, "prompt": "Hello, my name is",
                           "max_tokens": self.a.burst_max_tokens, "temperature": 0}).encode()
        return (f"POST /v1/completions HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"{self.auth}Connection: {'close' if close else 'keep-alive'}\r\n\r\n"
                ).encode() + body

    async def read_response(self, reader):
        """(status, body) of one HTTP/1.1 response with a Content-Length."""
        status_line = await reader.readline()
        if not status_line:
            raise ConnectionError("closed before the status line")
        status = int(status_line.split()[1])
        length = None
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            if k.strip().lower() == "content-length":
                length = int(v.strip())
        body = await (reader.readexactly(length) if length is not None else reader.read())
        return status, body

    # --- part 1 --------------------------------------------------------------------------------
    async def burst(self, model):
        n, timeout = self.a.burst, self.a.timeout
        go = asyncio.Event()
        ready = 0
        statuses, errors, latencies = Counter(), Counter(), []
        all_ready = asyncio.Event()
        req = self.request_bytes(model)

        def arrived():
            nonlocal ready
            ready += 1
            if ready == n:
                all_ready.set()

        async def one():
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port), timeout)
            except (OSError, asyncio.TimeoutError) as e:
                errors[f"connect:{type(e).__name__}"] += 1
                arrived()
                return
            arrived()
            try:
                await go.wait()
                t = time.monotonic()
                writer.write(req)
                await writer.drain()
                status, _ = await asyncio.wait_for(self.read_response(reader), timeout)
                latencies.append(time.monotonic() - t)
                statuses[status] += 1
            except (OSError, ValueError, IndexError, asyncio.TimeoutError,
                    asyncio.IncompleteReadError) as e:
                errors[f"request:{type(e).__name__}"] += 1
            finally:
                writer.close()
                try:
                    await asyncio.wait_for(writer.wait_closed(), 5)
                except (OSError, asyncio.TimeoutError):
                    pass

        tasks = [asyncio.create_task(one()) for _ in range(n)]
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(all_ready.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        connect_s = time.monotonic() - t0
        go.set()
        await asyncio.gather(*tasks)
        total_s = time.monotonic() - t0
        capacity = statuses[429] + statuses[503]
        other = {str(s): c for s, c in statuses.items() if s not in (200, 429, 503)}
        if errors:
            self.problems.append(f"burst: {sum(errors.values())} connection/request errors")
        if other:
            self.problems.append(f"burst: unexpected statuses {other}")
        return {"connections": n, "connect_all_s": round(connect_s, 2), "total_s": round(total_s, 2),
                "ok_200": statuses[200], "at_capacity_429": statuses[429],
                "at_capacity_503": statuses[503], "other_statuses": other,
                "errors": dict(errors), "latency": latency_summary(latencies),
                "capacity_answers": capacity}

    # --- part 2 --------------------------------------------------------------------------------
    async def normal_stream(self, session, model):
        """TTFT and total time of one streamed completion, or an error string."""
        body = {"model": model, "prompt": "The history of the city", "max_tokens":
                self.a.stream_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
        headers = {"Authorization": f"Bearer {self.a.api_key}"} if self.a.api_key else {}
        t0 = time.monotonic()
        ttft, done, chunks = None, False, 0
        try:
            async with session.post(self.base + "/v1/completions", json=body, headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=self.a.timeout)) as r:
                if r.status != 200:
                    return {"error": f"status {r.status}: {(await r.text())[:200]}"}
                async for line in r.content:
                    if line.startswith(b"data: [DONE]"):
                        done = True
                    elif line.startswith(b"data: "):
                        chunks += 1
                        if ttft is None:
                            ttft = time.monotonic() - t0
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            return {"error": f"{type(e).__name__}: {e}"}
        if not done:
            return {"error": "stream without [DONE]"}
        return {"ttft_ms": round(ttft * 1000, 1) if ttft else None,
                "total_ms": round((time.monotonic() - t0) * 1000, 1), "chunks": chunks}

    async def health_probe(self, session, samples, interval, until=None):
        """Times GET /health `samples` times (each bounded by --health-timeout), stopping
        at the monotonic time `until`."""
        lat, errors = [], Counter()
        for _ in range(samples):
            t = time.monotonic()
            if until is not None and t >= until:
                break
            try:
                async with session.get(self.base + "/health", timeout=aiohttp.ClientTimeout(
                        total=self.a.health_timeout)) as r:
                    await r.read()
                    if r.status == 200:
                        lat.append(time.monotonic() - t)
                    else:
                        errors[f"status_{r.status}"] += 1
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:
                errors[type(e).__name__] += 1
            await asyncio.sleep(interval)
        return {"latency": latency_summary(lat), "errors": dict(errors)}

    async def reference(self, model):
        """The normal client and /health without idle connections, for comparison."""
        conn = aiohttp.TCPConnector(limit=4, force_close=True)
        async with aiohttp.ClientSession(connector=conn) as session:
            stream = await self.normal_stream(session, model)
            health = await self.health_probe(session, 5, 0.1)
        return {"stream": stream, "health": health}

    async def idle_hold(self, model):
        a = self.a
        kinds = ["silent", "partial_header", "slowloris"]
        partial = (f"POST /v1/completions HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                   "Content-Type: application/json\r\n").encode()
        drip = (f"GET /health HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                + "X-Slow: " + "a" * 4096 + "\r\n\r\n").encode()
        conns = []          # (kind, reader, writer)
        connect_errors = Counter()
        closed = defaultdict(list)    # kind -> seconds until the server closed it
        answered = defaultdict(Counter)  # kind -> first line the server sent
        t_open = time.monotonic()
        ending = False      # set when this script closes them: closes after that are ours

        async def open_one(i):
            kind = kinds[i % 3]
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(self.host, self.port), a.timeout)
            except (OSError, asyncio.TimeoutError) as e:
                connect_errors[type(e).__name__] += 1
                return
            if kind == "partial_header":
                writer.write(partial)
            conns.append((kind, reader, writer))

        await asyncio.gather(*(open_one(i) for i in range(a.idle)))
        open_s = time.monotonic() - t_open
        t_hold = time.monotonic()

        async def watch(kind, reader):
            """Records when (and with what) the server ends this connection."""
            first = None
            try:
                while True:
                    data = await reader.read(65536)
                    if not data:
                        break
                    if first is None:
                        first = data.split(b"\r\n", 1)[0].decode("latin-1")[:40]
            except OSError:
                pass
            if ending:
                return
            closed[kind].append(time.monotonic() - t_hold)
            if first:
                answered[kind][first] += 1

        async def slowloris(writer):
            pos = 0
            try:
                while pos < len(drip):
                    writer.write(drip[pos:pos + 1])
                    pos += 1
                    await asyncio.sleep(a.drip)
            except (OSError, RuntimeError):
                pass

        watchers = [asyncio.create_task(watch(k, r)) for k, r, _ in conns]
        drippers = [asyncio.create_task(slowloris(w)) for k, _, w in conns if k == "slowloris"]
        await asyncio.sleep(min(1.0, a.hold / 4))  # let the server settle on them

        conn = aiohttp.TCPConnector(limit=4, force_close=True)
        async with aiohttp.ClientSession(connector=conn) as session:
            samples = max(1, int((a.hold - 1) / 0.5))
            stream, health = await asyncio.gather(
                self.normal_stream(session, model),
                self.health_probe(session, samples, 0.5, until=t_hold + a.hold))
            rest = a.hold - (time.monotonic() - t_hold)
            if rest > 0:
                await asyncio.sleep(rest)
            # Still usable after the hold?
            health_after = await self.health_probe(session, 3, 0.1)

        held_s = time.monotonic() - t_hold
        still_open = {k: sum(1 for kk, _, _ in conns if kk == k) - len(closed[k]) for k in kinds}
        ending = True
        for t in drippers:
            t.cancel()
        for _, _, w in conns:
            w.transport.abort()
        await asyncio.gather(*watchers, *drippers, return_exceptions=True)

        if connect_errors:
            self.problems.append(f"idle: {sum(connect_errors.values())} connections not opened")
        if "error" in stream:
            self.problems.append(f"idle: the normal client failed: {stream['error']}")
        if health["errors"] or not health["latency"]["n"]:
            self.problems.append(f"idle: /health failed during the hold: {health['errors']}")
        if health_after["errors"] or not health_after["latency"]["n"]:
            self.problems.append(f"idle: /health failed after the hold: {health_after['errors']}")
        return {
            "connections": a.idle, "opened": len(conns), "open_all_s": round(open_s, 2),
            "connect_errors": dict(connect_errors), "held_s": round(held_s, 1),
            "normal_stream": stream, "health_during": health, "health_after": health_after,
            "closed_by_server": {k: {"count": len(v), "first_s": round(min(v), 1) if v else None,
                                     "median_s": round(statistics.median(v), 1) if v else None}
                                 for k, v in closed.items()},
            "server_answers_on_idle": {k: dict(v) for k, v in answered.items()},
            "still_open_at_end": still_open,
        }

    async def run(self):
        """Both parts; what finished is in self.out even when --max-duration cuts it short."""
        out = self.out
        async with aiohttp.ClientSession() as s:
            async with s.get(self.base + "/v1/models", timeout=aiohttp.ClientTimeout(total=10),
                             headers={"Authorization": f"Bearer {self.a.api_key}"}
                             if self.a.api_key else {}) as r:
                model = self.a.model or (await r.json())["data"][0]["id"]
        if self.a.burst:
            out["burst"] = await self.burst(model)
            await asyncio.sleep(1)
        if self.a.idle:
            out["reference"] = await self.reference(model)
            out["idle_hold"] = await self.idle_hold(model)

    async def run_bounded(self):
        self.out = {"url": self.base, "nofile_limit": self.nofile}
        try:
            await asyncio.wait_for(self.run(), self.a.max_duration)
        except asyncio.TimeoutError:
            self.problems.append(f"did not finish within --max-duration {self.a.max_duration} s "
                                 "(the server stopped answering?)")
        self.out["ok"] = not self.problems
        self.out["problems"] = self.problems
        return self.out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL (loopback)")
    p.add_argument("--model", help="model name (default: the first of /v1/models)")
    p.add_argument("--api-key")
    p.add_argument("--burst", type=int, default=500, help="part 1 connections (0 skips it)")
    p.add_argument("--burst-max-tokens", type=int, default=2)
    p.add_argument("--idle", type=int, default=1000, help="part 2 connections (0 skips it)")
    p.add_argument("--hold", type=float, default=20, help="seconds the idle connections are held")
    p.add_argument("--drip", type=float, default=2, help="seconds between slowloris bytes")
    p.add_argument("--stream-tokens", type=int, default=32, help="the normal client's max_tokens")
    p.add_argument("--timeout", type=float, default=60, help="seconds for any one wait")
    p.add_argument("--health-timeout", type=float, default=10,
                   help="seconds for one GET /health")
    p.add_argument("--max-duration", type=float, default=600,
                   help="seconds for the whole run; then it stops and fails")
    p.add_argument("--out", help="also write the JSON summary here")
    args = p.parse_args()
    if args.burst < 0 or args.idle < 0 or args.hold <= 0:
        die("--burst/--idle must be >= 0 and --hold > 0")
    stress = Stress(args)
    stress.nofile = raise_nofile(max(args.burst, args.idle) + 64)
    summary = asyncio.run(stress.run_bounded())
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    sys.exit(0 if summary["ok"] else 1)


if __name__ == "__main__":
    main()
