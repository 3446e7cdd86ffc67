"""The load and fault harness in its CI size (``benchmarks/bench_vllm_load.py --quick``): a
live API server with the plugin and the gate on, concurrent load, KV pressure with
preemption, malformed requests, dropped streams, SIGTERM and SIGKILL mid-load (about 3 min
on 2 cores; the harness stops every server it started by PID)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from witcert_vllm_helpers import NEEDS_VLLM

pytestmark = [pytest.mark.vllm, pytest.mark.slow, NEEDS_VLLM]

REPO = Path(__file__).resolve().parents[2]


def test_quick_harness_serves_cleanly_keeps_counters_true_and_leaves_nothing_behind(tmp_path):
    out = tmp_path / "quick.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("WITCERT_VLLM")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_vllm_load.py"),
                           "--quick", "--out", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1200)
    log = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert out.exists(), log
    rep = json.loads(out.read_text())
    g = rep["configs"]["gated"]
    print("\n" + rep.get("table", ""))
    # 0 failed requests, every answer of the right length, at every level and under pressure
    for lv in [*g["levels"].values(), g["pressure"]]:
        assert lv["failed"] == 0 and lv["finished"] == lv["requests"], lv
    # malformed input: a clean 4xx for every case, and the server keeps serving
    assert g["malformed"] and all(x["ok"] and 400 <= x["status"] < 500 for x in g["malformed"])
    # SIGKILL of the API process: its engine and worker exit by themselves, and nothing of
    # the plugin's (stats directory, snapshot files) is left once they are gone
    k = g["sigkill"]
    assert k["all_gone_s"] is not None and not k["survivors_after_wait"], k
    assert not k["plugin_dirs_left"] and not k["instance_files_left"], k
    assert not k["killed_by_harness"], k
    names = {c["name"]: c for c in g["checks"]}
    # counters: witcert's against each other and vLLM's, including the exact decode identity
    # under preemption (prefix caching off, no chunked prefill)
    counter_checks = [c for n, c in names.items() if n.startswith(("after load:", "KV pressure:"))]
    assert any("sum(completion - 1) - preemptions" in c["name"] for c in counter_checks)
    assert g["pressure"]["preemptions"] > 0
    bad = [f"{c['name']}: {c['detail']}" for c in g["checks"] if not c["ok"]]
    assert not bad, bad
    assert proc.returncode == 0 and rep["ok"], log
