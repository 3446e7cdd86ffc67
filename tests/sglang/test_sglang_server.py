"""One real SGLang server with the witcert plugin on CPU: start, one short generation, the
scheduler's Prometheus metrics, stop by PID.

``python -m sglang.launch_server --attention-backend witcert`` loads the plugin through its
entry point, sizes the pool with witcert's cell size, builds ``WitcertMHATokenToKVPool``
and the witcert backend in the scheduler process. CPU: ``--device cpu``, SGLang's own Triton
kernels under the interpreter; witcert's ops use its pure-torch reference here
(``WITCERT_BACKEND=ref``: the Triton interpreter would take minutes per token over 30
layers; the kernels are exercised through SGLang in test_sglang_components.py and checked
against this same reference in tests/test_kernels_*.py). Few tokens: tens of seconds.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("sglang", reason="SGLang is not installed here: run scripts/setup_sglang_env.sh")

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
START_TIMEOUT_S = 420


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - 127.0.0.1 only
        return r.read().decode()


def _post(url: str, body: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - 127.0.0.1 only
        return json.loads(r.read())


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} missing from /metrics:\n{text}")


@pytest.fixture(scope="module")
def model_dir():
    from witcert.hf.model import ensure_local_model

    try:
        return ensure_local_model()
    except (FileNotFoundError, ModuleNotFoundError) as e:
        pytest.skip(f"bundled SmolLM2 model unavailable: {e}")


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (it was started in its own session), then
    SIGKILL after 30 s. Only this PID's group is signalled."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_server_generates_and_exports_certificate_metrics(model_dir, tmp_path):
    port, mport = _free_port(), _free_port()
    env = dict(os.environ, SGLANG_USE_CPU_ENGINE="1", TRITON_INTERPRET="1", WITCERT_BACKEND="ref",
               WITCERT_SGLANG_METRICS_PORT=str(mport), WITCERT_SGLANG_EXPORT_EVERY="1",
               PYTHONPATH=os.pathsep.join([str(HERE / "stubs"), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_dir),
           "--device", "cpu", "--attention-backend", "witcert", "--sampling-backend", "pytorch",
           "--disable-cuda-graph", "--grammar-backend", "none", "--dtype", "float32",
           "--host", "127.0.0.1", "--port", str(port), "--max-total-tokens", "2048",
           "--mem-fraction-static", "0.1", "--skip-server-warmup"]
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-4000:]
            try:
                _get(base + "/health")
                break
            except OSError:
                assert time.monotonic() < deadline, "server did not start in time"
                time.sleep(2)
        out = _post(base + "/generate", {"text": "The capital of France is",
                                         "sampling_params": {"max_new_tokens": 4, "temperature": 0}},
                    timeout=300)
        assert out["meta_info"]["completion_tokens"] == 4 and out["text"]
        text = _get(f"http://127.0.0.1:{mport}/metrics")
        logs = (tmp_path / "server.log").read_text()
    finally:
        _stop(proc)
        log.close()
    assert proc.returncode is not None
    assert "witcert: KV cell size 12968 B/token (stock SGLang: 46080 B/token" in logs
    # 4 tokens: 1 from prefill, 3 decode steps; a step is closed (and exported) when the
    # next forward is planned, so the last one is still open: >= 2 closed steps of
    # 30 layers x 9 query heads
    assert _metric(text, "witcert_steps_total") >= 2
    assert _metric(text, "witcert_records_total") == 30 * 9 * _metric(text, "witcert_steps_total")
    cov = _metric(text, "witcert_coverage")
    assert 0.0 <= cov <= 1.0
    assert _metric(text, "witcert_overflow_fraction") == 0.0
    assert _metric(text, "witcert_gate_events_total") >= 0
    assert _metric(text, 'witcert_kv_capacity_tokens{kv="witcert"}') > _metric(
        text, 'witcert_kv_capacity_tokens{kv="stock"}')
    assert "witcert_certificate_bucket" in text
