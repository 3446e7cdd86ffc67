"""Capacity and decode tokens/s of an SGLang server with and without the witcert plugin.

    python -m witcert.integrations.sglang.bench --backend witcert --model-path DIR [--mem 0.05]

Starts ``sglang.launch_server`` (its own process group, 127.0.0.1), reads SGLang's
``max_total_num_tokens`` (KV capacity it sized from the memory setting) from the log,
times one request of 1 and one of ``--tokens`` new tokens (greedy), and stops the server by
PID. Decode tokens/s = ``(tokens - 1) / (t_tokens - t_1)``. Prints one JSON line.
CPU-only environment: pass ``--device cpu`` (default) with ``SGLANG_USE_CPU_ENGINE=1``,
``TRITON_INTERPRET=1`` and the stand-ins of tests/sglang/stubs on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from witcert.settings import backend_choice


def _post(url, body, timeout):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - 127.0.0.1 only
        return json.loads(r.read())


def _timed(base, n, prompt):
    t0 = time.perf_counter()
    out = _post(base + "/generate", {"text": prompt, "sampling_params": {
        "max_new_tokens": n, "temperature": 0, "ignore_eos": True}}, timeout=1800)
    assert out["meta_info"]["completion_tokens"] == n, out
    return time.perf_counter() - t0


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", required=True, help="witcert, torch_native, triton, ...")
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--mem", type=float, default=0.05, help="--mem-fraction-static")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=9)
    ap.add_argument("--port", type=int, default=31950)
    ap.add_argument("--prompt", default="The capital of France is")
    a = ap.parse_args(argv)
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", a.model_path,
           "--device", a.device, "--attention-backend", a.backend, "--sampling-backend", "pytorch",
           "--disable-cuda-graph", "--grammar-backend", "none", "--dtype", a.dtype,
           "--host", "127.0.0.1", "--port", str(a.port), "--mem-fraction-static", str(a.mem),
           "--skip-server-warmup"]
    log_path = tempfile.mktemp(prefix="witcert-sglang-bench-", suffix=".log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{a.port}"
    try:
        for _ in range(600):
            assert proc.poll() is None, open(log_path).read()[-3000:]
            try:
                urllib.request.urlopen(base + "/health", timeout=5)  # noqa: S310
                break
            except OSError:
                time.sleep(2)
        _timed(base, 1, a.prompt)  # warm the path once
        t1 = _timed(base, 1, a.prompt)
        tn = _timed(base, a.tokens, a.prompt)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    text = open(log_path).read()
    cap = re.search(r"max_total_num_tokens=(\d+)", text)
    cell = re.search(r"witcert: KV cell size (\d+) B/token \(stock SGLang: (\d+) B/token", text)
    res = {"backend": a.backend, "dtype": a.dtype, "mem_fraction_static": a.mem,
           "witcert_backend": backend_choice(),
           "max_total_num_tokens": int(cap.group(1)) if cap else None,
           "cell_bytes": int(cell.group(1)) if cell else None,
           "stock_cell_bytes": int(cell.group(2)) if cell else None,
           "t_1_token_s": round(t1, 3), f"t_{a.tokens}_tokens_s": round(tn, 3),
           "decode_tokens_per_s": round((a.tokens - 1) / (tn - t1), 4), "log": log_path}
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
