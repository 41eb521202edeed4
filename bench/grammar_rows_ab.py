"""Grammar rows on a device: sampled from the device's best logits (the default) against
brought back whole (PENG_DEVICE_TOP_LOGITS=0), each twice, alternating.

    python3 bench/grammar_rows_ab.py PENG_BIN MODEL N_CLIENTS MAX_TOKENS

Serves MODEL with `peng serve --device host` (the device path on the CPU), sends N_CLIENTS
concurrent chat requests with a JSON Schema response_format (temperature 1, top_p 0.95, a seed
each), and prints per run: the wall time, the logit rows sampled (peng_logit_rows_total: from
the best logits, from the best 4096 after the step, whole) and the
engine's schedule / sample / forward / emit seconds (peng_step_phase_seconds_total) over the
load, and how many outputs parse as JSON with the required fields. Needs `requests` (the e2e
venv has it).
"""
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import requests

SCHEMA = {"type": "object",
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                         "city": {"type": "string"}},
          "required": ["name", "age", "city"]}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def metrics(base):
    """The phase seconds and the logit row counts now."""
    text = requests.get(base + "/metrics", timeout=30).text
    out = {}
    for m in re.finditer(r'^peng_step_phase_seconds_total\{[^}]*phase="(\w+)"\} (\S+)$', text,
                         re.M):
        out[m.group(1)] = float(m.group(2))
    for m in re.finditer(r'^peng_logit_rows_total\{[^}]*kind="(\w+)"\} (\S+)$', text, re.M):
        out["rows_" + m.group(1)] = float(m.group(2))
    return out


def run(peng, model, mode, n, max_tokens):
    port = free_port()
    env = dict(os.environ)
    if mode == "whole":
        env["PENG_DEVICE_TOP_LOGITS"] = "0"
    server = subprocess.Popen([peng, "serve", model, "--device", "host", "--port", str(port),
                               "--threads", "2", "--max-model-len", "1024"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if requests.get(base + "/health", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.2)
        name = requests.get(base + "/v1/models", timeout=10).json()["data"][0]["id"]
        before = metrics(base)
        outs = [None] * n

        def one(i):
            body = {"model": name, "max_tokens": max_tokens, "temperature": 1.0, "top_p": 0.95,
                    "seed": i,
                    "messages": [{"role": "user", "content": f"Invent person {i} as JSON."}],
                    "response_format": {"type": "json_schema",
                                        "json_schema": {"name": "p", "schema": SCHEMA}}}
            r = requests.post(base + "/v1/chat/completions", json=body, timeout=600)
            outs[i] = r.json()["choices"][0]["message"]["content"]

        t0 = time.time()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.time() - t0
        after = metrics(base)
    finally:
        server.terminate()
        server.wait()
    d = {k: after[k] - before.get(k, 0) for k in after}
    rows = d["rows_best"] + d.get("rows_wide", 0) + d["rows_whole"]

    def valid(o):
        try:
            return json.loads(o).keys() >= {"name", "age", "city"}
        except (TypeError, ValueError, AttributeError):
            return False

    print(f"{mode}: wall {wall:.1f} s, rows {rows:.0f} (best {d['rows_best']:.0f}, "
          f"wide {d.get('rows_wide', 0):.0f}), "
          f"sample {d['sample']:.2f} s = {1000 * d['sample'] / rows:.2f} ms a row, "
          f"schedule {d['schedule']:.2f} s, forward {d['forward']:.1f} s, emit {d['emit']:.2f} s, "
          f"valid JSON {sum(map(valid, outs))}/{n}", flush=True)


def main():
    peng, model, n, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    for mode in ["best", "whole", "best", "whole"]:
        run(peng, model, mode, n, max_tokens)


if __name__ == "__main__":
    main()
