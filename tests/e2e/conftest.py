"""Fixtures for the end-to-end tests: `peng serve` processes on loopback.

Each server is started on a free port (`--port 0`; the port is read from the server's log
line "... on http://HOST:PORT ..."), waited for until GET /health answers 200, and killed
when its fixture goes out of scope. PENG_BIN selects the binary (default build/tools/peng),
PENG_E2E_MODEL the model (default models/smollm2-135m-instruct-q4_1.gguf); a fixture may pass
another model (PengServer(..., model=path)). PENG_E2E_SERVE_ARGS adds arguments to every
`peng serve` (e.g. "--device host", "--device cuda").
"""

import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import openai
import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
PENG_BIN = Path(os.environ.get("PENG_BIN", ROOT / "build" / "tools" / "peng"))
MODEL = Path(os.environ.get("PENG_E2E_MODEL", ROOT / "models" / "smollm2-135m-instruct-q4_1.gguf"))
MODEL_NAME = "smollm2"
THREADS = os.environ.get("PENG_E2E_THREADS", "2")
SERVE_ARGS = os.environ.get("PENG_E2E_SERVE_ARGS", "").split()
START_TIMEOUT_S = 180


class PengServer:
    """One `peng serve` child process."""

    def __init__(self, *extra_args, api_key=None, model=None):
        if not PENG_BIN.exists():
            pytest.fail(f"{PENG_BIN} not found: build the peng target or set PENG_BIN")
        model = Path(model) if model is not None else MODEL
        if not model.exists():
            pytest.fail(f"{model} not found: run scripts/fetch_models.sh")
        self.api_key = api_key
        args = [str(PENG_BIN), "serve", str(model), "--host", "127.0.0.1", "--port", "0",
                "--served-model-name", MODEL_NAME, "--threads", THREADS, *SERVE_ARGS,
                *extra_args]
        if api_key:
            args += ["--api-key", api_key]
        self.log = tempfile.NamedTemporaryFile(prefix="peng-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        self.port = self._wait_for_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self._wait_healthy()

    def log_text(self):
        return Path(self.log.name).read_text(errors="replace")

    def _wait_for_port(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            m = re.search(r"on http://[^:\s]+:(\d+)", self.log_text())
            if m:
                return int(m.group(1))
            if self.proc.poll() is not None:
                pytest.fail(f"peng serve exited with {self.proc.returncode}:\n{self.log_text()}")
            time.sleep(0.1)
        self.kill()
        pytest.fail(f"peng serve did not report its port:\n{self.log_text()}")

    def _wait_healthy(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                if requests.get(self.base + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            if self.proc.poll() is not None:
                pytest.fail(f"peng serve exited with {self.proc.returncode}:\n{self.log_text()}")
            time.sleep(0.1)
        self.kill()
        pytest.fail(f"/health never answered 200:\n{self.log_text()}")

    def client(self, **kwargs):
        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", 120)
        return openai.OpenAI(base_url=self.base + "/v1", api_key=self.api_key or "unused",
                             **kwargs)

    def headers(self):
        h = {"Content-Type": "application/json"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def metrics_text(self):
        r = requests.get(self.base + "/metrics", timeout=10)
        assert r.status_code == 200, r.text
        return r.text

    def metric(self, name):
        """Value of the first sample of metric `name` ("kv_cache_usage_perc"), labelled or not.

        The prefix is `peng_` (`promtool check metrics` rejects vLLM's `vllm:` style colons);
        `peng:` is accepted too so that these tests check values whatever the prefix.
        """
        pattern = re.compile(r"^peng[:_]" + re.escape(name) + r"(\{[^}]*\})?\s+(\S+)\s*$", re.M)
        m = pattern.search(self.metrics_text())
        assert m, f"metric peng_{name} not in /metrics"
        return float(m.group(2))

    def wait_idle(self, timeout_s=60):
        """Waits until no request runs or waits; returns the final KV usage."""
        deadline = time.monotonic() + timeout_s
        while True:
            running = self.metric("num_requests_running")
            waiting = self.metric("num_requests_waiting")
            usage = self.metric("kv_cache_usage_perc")
            if (running == 0 and waiting == 0 and usage == 0) or time.monotonic() > deadline:
                return usage
            time.sleep(0.2)

    def terminate(self, timeout_s=120):
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout_s)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.log.close()
        os.unlink(self.log.name)


@pytest.fixture(scope="session")
def server():
    """The default server: 64 sequences, a short max model length to keep prompts cheap."""
    s = PengServer("--max-num-seqs", "64", "--max-model-len", "1024")
    yield s
    s.kill()


@pytest.fixture(scope="session")
def client(server):
    return server.client()


# A trained instruct model with a tool-aware chat template, for what needs a model that follows
# instructions (tool calls, structured output over the schema corpus): Qwen2.5-Coder 0.5B
# unless PENG_E2E_QWEN_MODEL says otherwise. These tests run in the default pass only: with
# PENG_E2E_MODEL set (the DeepSeek fixture pass) they are skipped, as they do not depend on it.
QWEN_MODEL = Path(os.environ.get(
    "PENG_E2E_QWEN_MODEL", ROOT / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))


@pytest.fixture(scope="session")
def qwen_server():
    if os.environ.get("PENG_E2E_MODEL"):
        pytest.skip("runs in the default e2e pass only")
    if not QWEN_MODEL.exists():
        pytest.skip(f"{QWEN_MODEL} not found: run scripts/fetch_models.sh")
    s = PengServer("--max-num-seqs", "16", "--max-model-len", "2048", model=QWEN_MODEL)
    yield s
    s.kill()
