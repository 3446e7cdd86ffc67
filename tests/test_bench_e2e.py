"""benchmarks/bench_e2e_gpu.py: the --quick run on CPU proves the whole code path (every
method, the table, JSON, plot, capacity) in seconds; the cell order and the budget gate
are checked without running a model. The GPU numbers come from the full run on the GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_e2e_gpu as bench  # noqa: E402
from e2e_models import ARCHS, witcert_pool_accounting  # noqa: E402
from e2e_report import capacity  # noqa: E402


def test_quick_run_measures_every_method_and_writes_table_json_plot(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OUT=str(tmp_path / "out"))
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_e2e_gpu.py"), "--quick",
                           "--device", "cpu"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "out"
    data = json.loads((out / "e2e.json").read_text())
    assert "meaningless" in data["note"] and data["env"]["device"] == "cpu"
    rows = data["results"]
    ok = {(r["batch"], r["context"], r["method"]) for r in rows if r["status"] == "ok"}
    for method in ("sdpa-dynamic", "sdpa-static", "witcert-graph", "witcert-graph-nocert",
                   "witcert-eager", "witcert-eager-nocert"):
        assert (2, 256, method) in ok and (1, 64, method) in ok, method
    for r in rows:
        if r["status"] == "ok":
            assert r["ms_per_step"] > 0 and r["tokens_per_s"] > 0 and r["steps"] == 3
        else:
            assert r["status"] == "skipped" and r["reason"], r
        if r["status"] == "ok" and r["method"].startswith("witcert"):
            assert r["ttft_s"] > 0 and r["kv_bytes"] > 0
            if r["cert"] == "on":
                assert r["cert_complete"] and r["cert_invalid"] == 0 and r["cert_records"] > 0
    assert all(r["status"] == "skipped" for r in rows if r["method"].endswith("compiled"))
    cap = data["capacity"][0]
    assert cap["witcert_batch"] > cap["fp16_batch"] >= 1
    assert cap["measured"]["fp16_best"] and cap["measured"]["witcert_best_cert_on"]
    assert (out / "e2e.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| arch | B | context | method |" in (out / "e2e.md").read_text()
    assert proc.stdout.rstrip().splitlines()[-1].startswith("| tiny-llama | 256 |")  # table last


def test_cells_run_in_priority_order_then_capacity_then_the_rest_by_size():
    args = bench.parse_args(["--archs", "llama3-8b"])
    arch = ARCHS["llama3-8b"]
    cap = capacity(arch, witcert_pool_accounting(arch, bench.QuantConfig()), budget_bytes=32 << 30,
                   context=32768)
    assert (cap["fp16_batch"], cap["witcert_batch"]) == (8, 14)  # 4 GiB vs 2.25 GiB per sequence
    cells = bench.plan_cells(arch, args, cap)
    order = [(c.batch, c.context, c.tag) for c in cells]
    assert order[:7] == [(4, 8192, ""), (2, 32768, ""), (4, 32768, ""), (16, 8192, ""), (1, 131072, ""),
                         (8, 32768, "capacity-fp16"), (14, 32768, "capacity-witcert")]
    rest = [(b, n) for b, n, _ in order[7:]]
    assert rest[:2] == [(1, 8192), (1, 32768)] and len(rest) == 12 - 4
    assert all(m.startswith("sdpa") for m in cells[5].methods)
    assert all(m.startswith("witcert") for m in cells[6].methods)


def test_budget_gate_skips_what_does_not_fit_the_time_left_and_limits_compiled_cells():
    import torch

    args = bench.parse_args(["--archs", "llama3-8b", "--budget-s", "30", "--compile-cells", "1"])
    budget = bench.Budget(args, torch.device("cpu"))

    class Rc:
        warmup, steps = args.warmup, args.steps

        @staticmethod
        def real_prefill(cell):
            return cell.batch * cell.context <= args.prefill_max_tokens

    budget.rc = Rc
    small = bench.Cell(ARCHS["llama3-8b"], 1, 8192)
    assert "time budget" in budget.gate(small, "sdpa-static-compiled", need_bytes=0, prefill=True)
    budget.args.budget_s = 10_000
    assert budget.gate(small, "sdpa-static-compiled", need_bytes=0, prefill=True) is None
    other = bench.Cell(ARCHS["llama3-8b"], 4, 8192)
    assert "--compile-cells" in budget.gate(other, "sdpa-static-compiled", need_bytes=0, prefill=True)
    assert budget.gate(other, "witcert-graph", need_bytes=0, prefill=True) is None
