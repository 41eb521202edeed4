"""Operations: `peng top --once --json` against live servers, and the utilization metrics.

`peng top` reads only /health and /metrics, so it is tested as an operator runs it: against
two real `peng serve` processes (one of them generating during the scrape window) and one
URL where nothing listens.
"""

import json
import os
import subprocess
import threading

import requests

from conftest import MODEL_NAME, PENG_BIN, PengServer


def generate(server, max_tokens, stream=False):
    body = {"model": MODEL_NAME, "prompt": "Once upon a time", "max_tokens": max_tokens,
            "ignore_eos": True, "stream": stream}
    r = requests.post(server.base + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r


def test_peng_top_once_json_shows_two_live_servers_and_a_dead_one(server):
    other = PengServer("--max-model-len", "512")
    try:
        generate(server, 4, stream=True)
        generate(other, 4, stream=True)
        # `other` generates, request after request (a tiny model finishes one in a blink),
        # while peng top scrapes it twice, 1 s apart.
        stop = threading.Event()

        def keep_generating():
            while not stop.is_set():
                generate(other, 200)

        load = threading.Thread(target=keep_generating)
        load.start()
        try:
            out = subprocess.run(
                [str(PENG_BIN), "top", "--once", "--json", "--interval", "1", "--timeout", "1",
                 server.base, other.base, "http://127.0.0.1:1"],
                capture_output=True, text=True, timeout=60)
        finally:
            stop.set()
            load.join()
        assert out.returncode == 0, out.stderr
        rows = json.loads(out.stdout)
        assert [r["url"] for r in rows] == [server.base, other.base, "http://127.0.0.1:1"]
        assert [r["state"] for r in rows] == ["healthy", "healthy", "down"]
        for r in rows[:2]:
            assert r["model"] == MODEL_NAME
            assert r["ttft_p50_s"] is not None and r["ttft_p50_s"] > 0
            assert 0 <= r["kv_cache_usage"] <= 1
            assert r["waiting"] == 0
        busy = rows[1]
        assert busy["running"] in (0, 1)  # 0 between two requests
        assert busy["generation_tokens_per_s"] > 0
        assert busy["read_bandwidth_gb_per_s"] > 0
        assert 0 < busy["read_bandwidth_utilization"] < 2
        assert 0 < busy["engine_busy"] <= 1
        assert rows[2]["error"].startswith("GET /health")
        assert rows[2]["generation_tokens_per_s"] is not None  # numbers stay numbers
        # The plain table: one line per replica under a header.
        table = subprocess.run([str(PENG_BIN), "top", "--once", "--interval", "0.2",
                                server.base, "http://127.0.0.1:1"],
                               capture_output=True, text=True, timeout=60)
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        assert lines[0].startswith("REPLICA")
        assert "healthy" in lines[1] and "down" in lines[2]
    finally:
        other.kill()


def test_peng_top_rejects_bad_arguments():
    r = subprocess.run([str(PENG_BIN), "top", "--json", "http://127.0.0.1:1"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "--json needs --once" in r.stderr
    r = subprocess.run([str(PENG_BIN), "top"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2


def test_utilization_metrics_after_load(server):
    generate(server, 16)
    m = server.metrics_text()
    for name in ["peng_weight_read_bytes_total", "peng_kv_cache_read_bytes_total",
                 "peng_engine_busy_seconds_total", "peng_engine_steps_total"]:
        assert server.metric(name[len("peng_"):]) > 0, name
    assert server.metric("peak_read_bandwidth_bytes_per_second") > 1e8
    for phase in ["schedule", "forward", "sample", "emit"]:
        assert f'peng_step_phase_seconds_total{{model_name="{MODEL_NAME}",phase="{phase}"}}' in m
    for kind in ["fp32", "int8"]:
        assert f'peng_compute_ops_total{{model_name="{MODEL_NAME}",kind="{kind}"}}' in m
        assert f'peng_peak_compute_ops_per_second{{model_name="{MODEL_NAME}",kind="{kind}"}}' in m
    # Logit rows sampled, by what came back: a row a token (the 16 above at least); on the CPU
    # every row whole, on a device (PENG_E2E_SERVE_ARGS=--device ...) greedy rows as their best.
    rows = {}
    for kind in ["best", "wide", "whole"]:
        line = f'peng_logit_rows_total{{model_name="{MODEL_NAME}",kind="{kind}"}} '
        assert line in m, line
        rows[kind] = float(m.split(line)[1].split()[0])
    on_device = "--device" in os.environ.get("PENG_E2E_SERVE_ARGS", "")
    assert rows["best" if on_device else "whole"] >= 16
    assert server.metric("request_queue_time_seconds_count") >= 1
