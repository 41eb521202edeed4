#!/usr/bin/env python3
"""Failover load driver for scripts/failover_test.sh (Python standard library only).

Runs `peng serve` replicas itself (so that it knows to the millisecond when each one is
killed, drained, restarted and healthy), sends a steady load through an nginx that is already
running in front of them (deploy/nginx/peng.conf), and meanwhile:

  kill    SIGKILLs a replica in the middle of a stream it is serving, keeps the load going on
          the others, restarts it on the same port and waits until it serves again;
  drain   SIGTERMs a replica in the middle of a stream (peng drains: /health and new requests
          answer 503, running requests finish, exit 0), restarts it, waits until it serves.

The load: --concurrency client threads, each sending /v1/completions requests one after the
other, half streaming (SSE) and half not, max_tokens 16..32 with ignore_eos, each on its own
connection with a client timeout (a request that runs into it is "hung"). A request
succeeds when it gets 200 and a complete answer: a JSON completion with a finish_reason, or
SSE events that are all valid JSON completions chunks, end with `data: [DONE]` and a clean
end of the chunked body; either with finish_reason "length" or "stop" (not "abort": a drain
that runs out of time loses the request as surely as a cut connection does). Which replica answered comes from nginx's X-Peng-Upstream header
(the last address when nginx retried), which arrives with the response headers, before the
stream's first event.

Failed requests are split into:
  killed_in_flight  answered by the replica that was SIGKILLed, sent before the kill, cut off
                    after it (a stream the replica was in the middle of cannot be resumed);
  hung              ran into the client timeout (never acceptable: a failure must be quick);
  other             everything else (never acceptable).

Measured per event: for a kill, the time from the kill to the first request sent after it
from which on every request succeeded ("recovery", must be <= --max-recovery), and how fast
the cut-off clients got their error; for every restart, the time from the restarted replica's
/health turning 200 to the first response it served through nginx ("takes load"); for a drain,
that no request failed from the SIGTERM until the replica served again after its restart,
that it exited 0, and how long it drained.

Exit status 1 when any check fails (the summary says which), 2 on a usage or setup error.
Loopback only; bounded in requests (--max-requests) and time (every wait has a deadline).
"""

import argparse
import http.client
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from urllib.parse import urlparse

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "Here is a list of three colors:",
    "The quick brown fox",
    "To make a cup of tea, first",
    "In the year 2050, cities will",
]

# A request that ran to its end (with ignore_eos: "length"); "abort" (the drain timeout ran
# out, or the server stopped) and "error" are failures.
FINISHED = ("length", "stop")

now = time.monotonic


def log(msg):
    print(f"[failover_load {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Replica:
    """One `peng serve` process on a fixed loopback port, restartable."""

    def __init__(self, args, port):
        self.args = args
        self.port = port
        self.addr = f"127.0.0.1:{port}"
        self.proc = None
        self.log_path = os.path.join(args.workdir, f"replica-{port}.log")
        self.pid_path = os.path.join(args.workdir, f"replica-{port}.pid")
        self.starts = 0

    def start(self):
        self.starts += 1
        with open(self.log_path, "ab") as f:
            f.write(f"=== failover_load: start #{self.starts} ===\n".encode())
        out = open(self.log_path, "ab")
        cmd = [self.args.peng, "serve", self.args.model, "--host", "127.0.0.1",
               "--port", str(self.port), "--threads", str(self.args.threads),
               "--drain-timeout", str(self.args.drain_timeout),
               "--max-model-len", "512"]
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        out.close()
        with open(self.pid_path, "w") as f:  # failover_test.sh's exit trap kills what is here
            f.write(f"{self.proc.pid}\n")

    def health(self, timeout=1.0):
        try:
            with urllib.request.urlopen(f"http://{self.addr}/health", timeout=timeout) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return None

    def wait_healthy(self, deadline_s):
        """Polls /health every 20 ms until 200; returns the monotonic time it first did."""
        end = now() + deadline_s
        while now() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"replica {self.addr} exited with {self.proc.returncode} "
                                   f"at start (see {self.log_path})")
            if self.health(timeout=0.5) == 200:
                return now()
            time.sleep(0.02)
        raise RuntimeError(f"replica {self.addr} did not answer /health 200 within "
                           f"{deadline_s} s (see {self.log_path})")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Load:
    """--concurrency threads sending requests through nginx until stopped."""

    def __init__(self, args):
        self.args = args
        u = urlparse(args.url)
        self.host, self.port = u.hostname, u.port
        self.lock = threading.Lock()
        self.records = []
        self.in_flight = {}  # id -> record, while the request runs
        self.stopping = threading.Event()
        self.next_id = 0
        self.threads = []

    def start(self):
        for i in range(self.args.concurrency):
            t = threading.Thread(target=self.worker, args=(i,), daemon=True)
            t.start()
            self.threads.append(t)

    def stop(self):
        self.stopping.set()
        for t in self.threads:
            t.join(self.args.request_timeout + 10)
        return all(not t.is_alive() for t in self.threads)

    def worker(self, index):
        rng = random.Random(1000 + index)
        while not self.stopping.is_set():
            with self.lock:
                if self.next_id >= self.args.max_requests:
                    break
                rid = self.next_id
                self.next_id += 1
            self.one(rid, rng)

    def one(self, rid, rng):
        stream = rng.random() < 0.5
        body = {"prompt": rng.choice(PROMPTS), "max_tokens": rng.randint(16, 32),
                "temperature": 0.7, "seed": rid, "ignore_eos": True, "stream": stream}
        rec = {"id": rid, "stream": stream, "t_start": now(), "t_head": None, "t_end": None,
               "events": 0, "status": None, "upstream": None, "ok": False, "error": None}
        with self.lock:
            self.in_flight[rid] = rec
        deadline = rec["t_start"] + self.args.request_timeout
        conn = http.client.HTTPConnection(self.host, self.port,
                                          timeout=self.args.request_timeout)
        try:
            conn.request("POST", "/v1/completions", body=json.dumps(body),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            rec["t_head"] = now()
            rec["status"] = resp.status
            rec["upstream"] = resp.getheader("X-Peng-Upstream")
            if resp.status != 200:
                resp.read()
                rec["error"] = f"http_{resp.status}"
            elif stream:
                rec["error"] = self.read_stream(resp, rec, deadline)
            else:
                data = json.loads(resp.read())
                choice = data["choices"][0]
                if not isinstance(choice.get("text"), str):
                    rec["error"] = "bad_answer"
                elif choice.get("finish_reason") not in FINISHED:
                    rec["error"] = f"finish_reason_{choice.get('finish_reason')}"
            rec["ok"] = rec["error"] is None
        except TimeoutError:
            rec["error"] = "hung"
        except (http.client.IncompleteRead, ValueError) as e:
            rec["error"] = "truncated" if rec["t_head"] else f"bad_response: {e!r}"[:120]
        except (ConnectionError, http.client.HTTPException, OSError) as e:
            rec["error"] = ("truncated" if rec["t_head"] else "connection_error")
            rec["detail"] = repr(e)[:120]
        finally:
            conn.close()
            rec["t_end"] = now()
            if rec["error"] == "hung" or rec["t_end"] > deadline:
                rec["ok"], rec["error"] = False, "hung"
            with self.lock:
                del self.in_flight[rid]
                self.records.append(rec)

    @staticmethod
    def read_stream(resp, rec, deadline):
        done = False
        finish = None
        while True:
            if now() > deadline:
                raise TimeoutError
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line:
                continue
            if not line.startswith(b"data: "):
                return "bad_event"
            payload = line[6:]
            if payload == b"[DONE]":
                done = True
                continue
            if done:
                return "data_after_done"
            event = json.loads(payload)
            if "error" in event:
                return "error_event"
            if event.get("object") != "text_completion":
                return "bad_event"
            rec["events"] += 1
            for choice in event.get("choices", []):
                finish = choice.get("finish_reason") or finish
        if not done or rec["events"] == 0:
            return "truncated"
        return None if finish in FINISHED else f"finish_reason_{finish}"

    def find_mid_stream(self, addr):
        """A stream served by `addr` that has sent at least one event and not ended."""
        with self.lock:
            for rec in self.in_flight.values():
                if (rec["stream"] and rec["events"] > 0 and rec["upstream"]
                        and served_by(rec) == addr):
                    return rec["id"]
        return None

    def served_since(self, addr, t):
        """The earliest response header from `addr` received after t (finished or not)."""
        with self.lock:
            recs = list(self.records) + list(self.in_flight.values())
        times = [r["t_head"] for r in recs
                 if r["t_head"] is not None and r["t_head"] >= t and served_by(r) == addr]
        return min(times) if times else None


def served_by(rec):
    up = rec.get("upstream") or ""
    return up.split(",")[-1].strip() if up else None


def count_nginx_errors(path):
    if not path or not os.path.exists(path):
        return {}
    pats = {
        "connect_refused": r"connect\(\) failed \(111",
        "prematurely_closed": r"upstream prematurely closed",
        "reset_by_peer": r"reset by peer",
        "no_live_upstreams": r"no live upstreams",
        "timed_out": r"timed out",
    }
    counts = Counter()
    with open(path, errors="replace") as f:
        for line in f:
            for k, p in pats.items():
                if re.search(p, line):
                    counts[k] += 1
    return dict(counts)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True, help="nginx, e.g. http://127.0.0.1:18000")
    ap.add_argument("--peng", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, action="append", required=True,
                    help="replica port (twice or more); the ports nginx's upstream lists")
    ap.add_argument("--workdir", required=True, help="replica logs and pid files")
    ap.add_argument("--nginx-error-log", default="")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--drain-timeout", type=float, default=30)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--request-timeout", type=float, default=30,
                    help="client timeout of one request, s (beyond it: 'hung')")
    ap.add_argument("--max-requests", type=int, default=20000)
    ap.add_argument("--max-recovery", type=float, default=1.0,
                    help="kill -> every new request succeeds, at most this many s")
    ap.add_argument("--max-takes-load", type=float, default=30.0,
                    help="restarted replica healthy -> serves a response, at most (s)")
    ap.add_argument("--events", default="kill,drain",
                    help="the events of one round, in order: kill and/or drain, comma-separated;"
                         " round r's event j hits replica r + j")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of --events")
    ap.add_argument("--steady", type=float, default=5.0,
                    help="s of load before each event and after each restart")
    ap.add_argument("--down", type=float, default=3.0,
                    help="s a killed/drained replica stays down before its restart")
    ap.add_argument("--out", default="")
    args = ap.parse_args()

    for u in [args.url]:
        if urlparse(u).hostname not in ("127.0.0.1", "localhost", "::1"):
            print("failover_load: loopback only", file=sys.stderr)
            return 2
    if any(k.strip() not in ("kill", "drain", "") for k in args.events.split(",")):
        print("failover_load: --events takes kill and drain", file=sys.stderr)
        return 2
    if len(args.port) < 2:
        print("failover_load: need two or more --port", file=sys.stderr)
        return 2

    t0 = now()
    replicas = [Replica(args, p) for p in args.port]
    load = Load(args)
    events = []
    problems = []
    try:
        for r in replicas:
            r.start()
        for r in replicas:
            r.wait_healthy(180)
        log(f"replicas healthy: {', '.join(r.addr for r in replicas)}")
        load.start()
        # Both replicas must take load before anything else happens.
        for r in replicas:
            if not wait_for(lambda r=r: load.served_since(r.addr, t0), 60):
                raise RuntimeError(f"{r.addr} served nothing through nginx in 60 s")
        log("load running, every replica serving")

        kinds = [k.strip() for k in args.events.split(",") if k.strip()]
        # Round r, event j hits replica r + j: with kill,drain and two replicas, round 0 kills
        # the first and drains the second, round 1 the other way round.
        plan = [(kind, replicas[(r + j) % len(replicas)])
                for r in range(args.rounds) for j, kind in enumerate(kinds)]
        for kind, r in plan:
            time.sleep(args.steady)
            events.append(run_event(kind, r, load, args))
        time.sleep(args.steady)
    except RuntimeError as e:
        problems.append(str(e))
        log(f"ERROR: {e}")
    except KeyboardInterrupt:
        problems.append("interrupted")
        log("interrupted")
    finally:
        t_load_end = now()
        if not load.stop():
            problems.append("a client thread did not stop within its timeout")
        for r in replicas:
            r.stop()

    summary = analyze(load.records, events, args, t0, t_load_end, problems)
    summary["nginx_error_log"] = count_nginx_errors(args.nginx_error_log)
    print_summary(summary)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=2)
    return 0 if summary["pass"] else 1


def wait_for(fn, seconds, every=0.02):
    end = now() + seconds
    while now() < end:
        v = fn()
        if v:
            return v
        time.sleep(every)
    return None


def run_event(kind, r, load, args):
    ev = {"kind": kind, "replica": r.addr}
    # In the middle of a stream on this replica, so that the event hits a running request.
    rid = wait_for(lambda: load.find_mid_stream(r.addr), 20, every=0.005)
    ev["hit_running_stream"] = rid is not None
    pid = r.proc.pid
    if kind == "kill":
        ev["t"] = now()
        os.kill(pid, signal.SIGKILL)
        r.proc.wait()
        log(f"SIGKILL {r.addr} (pid {pid})" + (f", stream #{rid} running" if rid is not None
                                                 else ", no stream running on it"))
    else:
        ev["t"] = now()
        os.kill(pid, signal.SIGTERM)
        log(f"SIGTERM {r.addr} (pid {pid})" + (f", stream #{rid} running" if rid is not None
                                                 else ", no stream running on it"))
        try:
            code = r.proc.wait(timeout=args.drain_timeout + 20)
        except subprocess.TimeoutExpired:
            r.proc.kill()
            code = r.proc.wait()
            ev["drain_hung"] = True
        ev["exit_code"] = code
        ev["drain_s"] = round(now() - ev["t"], 3)
        log(f"{r.addr} exited {code} after draining {ev['drain_s']} s")
    time.sleep(args.down)
    ev["t_restart"] = now()
    r.start()
    ev["t_healthy"] = r.wait_healthy(180)
    t_served = wait_for(lambda: load.served_since(r.addr, ev["t_healthy"]),
                        args.max_takes_load)
    ev["t_served"] = t_served
    log(f"{r.addr} restarted: healthy after {ev['t_healthy'] - ev['t_restart']:.2f} s, "
        + (f"serving {t_served - ev['t_healthy']:.2f} s later" if t_served else
           f"served nothing within {args.max_takes_load} s"))
    ev["t_end"] = now()
    return ev


def analyze(records, events, args, t0, t_load_end, problems):
    records = sorted(records, key=lambda r: r["t_start"])
    kill_events = [e for e in events if e["kind"] == "kill"]
    cats = Counter()
    kinds = Counter()
    for rec in records:
        if rec["ok"]:
            continue
        kinds[rec["error"]] += 1
        if rec["error"] == "hung":
            rec["category"] = "hung"
            continue
        rec["category"] = "other"
        for e in kill_events:
            if (served_by(rec) == e["replica"] and rec["t_start"] < e["t"] <= rec["t_end"]
                    and rec["t_head"] is not None):
                rec["category"] = "killed_in_flight"
                rec["error_after_kill_s"] = rec["t_end"] - e["t"]
        cats[rec["category"]] += 1

    out_events = []
    for e in events:
        # The event's window: from the signal until the replica served again after its
        # restart (what happens in the steady periods between events counts in the totals;
        # a window reaching to the next event would blame its failures on this one).
        w_end = e["t_end"]
        sent_after = [r for r in records if e["t"] <= r["t_start"] < w_end]
        overlapping = [r for r in records if r["t_end"] >= e["t"] and r["t_start"] < w_end]
        o = {"kind": e["kind"], "replica": e["replica"],
             "at_s": round(e["t"] - t0, 3),
             "hit_running_stream": e["hit_running_stream"],
             "requests_overlapping": len(overlapping),
             "failed_overlapping": sum(not r["ok"] for r in overlapping),
             "retried_by_nginx": sum("," in (r["upstream"] or "") for r in overlapping),
             "restart_healthy_after_s": round(e["t_healthy"] - e["t_restart"], 3),
             "takes_load_s": (round(e["t_served"] - e["t_healthy"], 3)
                              if e["t_served"] else None)}
        if e["kind"] == "kill":
            cut = [r for r in records if r.get("category") == "killed_in_flight"
                   and r["t_start"] < e["t"] <= r["t_end"] and served_by(r) == e["replica"]]
            o["killed_in_flight"] = len(cut)
            o["killed_in_flight_error_after_s_max"] = (
                round(max(r["error_after_kill_s"] for r in cut), 3) if cut else None)
            # Recovery: the first request sent after the kill from which on all succeeded.
            rec_t = None
            for j in range(len(sent_after) - 1, -1, -1):
                if not sent_after[j]["ok"]:
                    break
                rec_t = sent_after[j]["t_start"]
            if sent_after and not sent_after[-1]["ok"]:
                rec_t = None
            o["requests_sent_after"] = len(sent_after)
            o["failed_sent_after"] = sum(not r["ok"] for r in sent_after)
            o["recovery_s"] = round(rec_t - e["t"], 3) if rec_t is not None else None
        else:
            in_flight = [r for r in records if r["t_start"] < e["t"] < r["t_end"]
                         and served_by(r) == e["replica"]]
            o["in_flight_on_replica_at_sigterm"] = len(in_flight)
            o["of_them_completed"] = sum(r["ok"] for r in in_flight)
            o["exit_code"] = e["exit_code"]
            o["drain_s"] = e["drain_s"]
            # The drain phase: SIGTERM until the restarted replica served again, and after.
            o["failed"] = o["failed_overlapping"]
        out_events.append(o)

    checks = []

    def check(ok, what):
        checks.append({"ok": bool(ok), "check": what})

    check(not problems, "the run completed" + (f" ({'; '.join(problems)})" if problems else ""))
    check(cats["other"] == 0, f"no 'other' failures ({cats['other']})")
    check(cats["hung"] == 0, f"no hung requests ({cats['hung']})")
    for o in out_events:
        tag = f"{o['kind']} {o['replica']} at {o['at_s']} s"
        if o["kind"] == "kill":
            check(o["recovery_s"] is not None and o["recovery_s"] <= args.max_recovery,
                  f"{tag}: every request sent from {o['recovery_s']} s after the kill on "
                  f"succeeded (limit {args.max_recovery} s)")
        else:
            check(o["failed"] == 0, f"{tag}: no request failed during the drain phase "
                                    f"({o['failed']} of {o['requests_overlapping']})")
            check(o["exit_code"] == 0, f"{tag}: the replica drained and exited 0 "
                                       f"(exit {o['exit_code']}, {o['drain_s']} s)")
        check(o["takes_load_s"] is not None,
              f"{tag}: the restarted replica took load ({o['takes_load_s']} s after its "
              f"/health turned 200; limit {args.max_takes_load} s)")
    ok_count = sum(r["ok"] for r in records)
    summary = {
        "pass": all(c["ok"] for c in checks),
        "duration_s": round(t_load_end - t0, 1),
        "concurrency": args.concurrency,
        "requests": {"sent": len(records), "succeeded": ok_count,
                     "failed": len(records) - ok_count,
                     "streaming": sum(r["stream"] for r in records),
                     "retried_by_nginx": sum("," in (r["upstream"] or "") for r in records)},
        "failed_by_category": {k: cats[k] for k in ("killed_in_flight", "hung", "other")},
        "failed_by_kind": dict(kinds),
        "events": out_events,
        "checks": checks,
        "failures": [{k: (round(v - t0, 3) if k.startswith("t_") and v else v)
                      for k, v in r.items()} for r in records if not r["ok"]][:50],
    }
    return summary


def print_summary(s):
    r = s["requests"]
    c = s["failed_by_category"]
    print("=" * 72)
    print(f"failover summary ({s['duration_s']} s of load, concurrency {s['concurrency']})")
    print(f"  requests: {r['sent']} sent, {r['succeeded']} succeeded, {r['failed']} failed "
          f"({r['streaming']} streaming; {r['retried_by_nginx']} retried by nginx on "
          f"another replica)")
    print(f"  failed: {c['killed_in_flight']} in flight on a killed replica, {c['hung']} hung, "
          f"{c['other']} other" + (f"  (kinds: {s['failed_by_kind']})" if r["failed"] else ""))
    for o in s["events"]:
        if o["kind"] == "kill":
            print(f"  SIGKILL {o['replica']} at {o['at_s']} s"
                  f"{'' if o['hit_running_stream'] else ' (no stream was running on it)'}: "
                  f"{o['killed_in_flight']} in-flight cut off (error after "
                  f"{o['killed_in_flight_error_after_s_max']} s at most); of "
                  f"{o['requests_sent_after']} sent after the kill {o['failed_sent_after']} "
                  f"failed; all new requests succeed from {o['recovery_s']} s after the kill")
        else:
            print(f"  SIGTERM {o['replica']} at {o['at_s']} s"
                  f"{'' if o['hit_running_stream'] else ' (no stream was running on it)'}: "
                  f"{o['in_flight_on_replica_at_sigterm']} in flight on it, "
                  f"{o['of_them_completed']} completed; drained and exited {o['exit_code']} "
                  f"after {o['drain_s']} s; {o['failed']} of {o['requests_overlapping']} "
                  f"requests in the drain phase failed ({o['retried_by_nginx']} retried)")
        print(f"    restarted: /health 200 after {o['restart_healthy_after_s']} s, takes load "
              f"{o['takes_load_s']} s after that")
    if s.get("nginx_error_log") is not None:
        print(f"  nginx error.log: {s.get('nginx_error_log')}")
    for ch in s["checks"]:
        print(f"  [{'ok' if ch['ok'] else 'FAIL'}] {ch['check']}")
    print(f"failover: {'PASS' if s['pass'] else 'FAIL'}")
    print("=" * 72, flush=True)


if __name__ == "__main__":
    sys.exit(main())
