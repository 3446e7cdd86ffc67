"""``witcert report --quick`` end to end on the bundled model, at CI size.

Checks the structure of report.json / report.md / the plots, the zero-violation invariant
(true TV <= certificate for every recorded (layer, head, step) and every reported radius;
exact worst case <= certificate), and that a rerun resumes entirely from the cache.
"""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.model, pytest.mark.slow]

ARGS = ["--prefill", "32", "--steps", "4", "--variants", "fp16", "rtn4", "sr8", "kivi2", "witcert-m0",
        "witcert-m4", "--worst-variants", "rtn4", "witcert-m0", "--runtime-variants", "witcert-m0",
        "witcert-m4", "--needle-lengths", "160",
        "--needle-tasks", "single", "--needle-haystacks", "noise", "--needle-variants", "fp16",
        "witcert-m0", "--synth-tokens", "128", "--latency-tokens", "128", "--calib-tokens", "64",
        "--threads", "2"]


def _run(out):
    from witcert.cli import main

    return main(["report", "--quick", "--out", str(out), *ARGS])


def test_quick_report_structure_zero_violations_and_resume(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "rep"
    assert _run(out) == 0
    for name in ("report.md", "report.json", "soundness.png", "quad.png", "budget.png", "needles.png",
                 "quality.png", "tightness.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    rep = json.loads((out / "report.json").read_text())
    res = rep["results"]
    assert set(res) >= {"quad", "soundness", "runtime_soundness", "worst", "needles", "budget", "quality",
                        "violations_total", "violations_runtime"}
    assert res["violations_total"] == 0
    # the runtime paths' own certificates: on CPU native C for both (outlier bypass included)
    rt = res["runtime_soundness"]
    assert set(rt) == {"witcert-m0", "witcert-m4"}
    import torch
    from witcert import native
    if torch.cuda.is_available():
        assert rt["witcert-m0"]["path"] == rt["witcert-m4"]["path"] == "triton"
    else:
        want = "native" if native.available() else "reference"
        assert rt["witcert-m0"]["path"] == rt["witcert-m4"]["path"] == want
    for lab, row in rt.items():
        assert row["checked"] == 2 * 30 * 9 * 4, lab  # domains x layers x query heads x steps (SmolLM2-135M)
        assert row["violations"] == row["nan"] == row["negative"] == 0, lab
        assert row["engine"]["violations"] == 0 and row["engine"]["checked"] == row["checked"], lab
        assert row["tight_median"] >= 1.0, lab
        # rows pair with the engine's (same stored keys, same order): certificates agree up to
        # the paths' arithmetic (a misaligned row or a wrong outlier set would be far off)
        assert abs(row["cert_excess_min"]) < 1e-3 and abs(row["cert_excess_max"]) < 1e-3, lab
    for lab, row in res["soundness"].items():
        assert row["checked"] > 0
        assert row["kinds"][row["radius"]]["violations"] == 0, lab
        for kind in ("det", "prob", "min", "sr_hoeffding"):  # every justified radius holds
            if kind in row["kinds"]:
                assert row["kinds"][kind]["violations"] == 0, (lab, kind)
                assert row["kinds"][kind]["radius_exceed"] == 0, (lab, kind)
    for lab, w in res["worst"].items():
        assert w["exact_short"]["n"] > 0
        assert w["exact_short"]["w_above_cert"] == 0 and w["exact_short"]["w_below_tv"] == 0
    quad = res["quad"]
    assert any(k.startswith("synthetic") for k in quad) and sum(k.startswith("real") for k in quad) == 2
    for rows in quad.values():
        assert set(rows) == {"fp16", "rtn4", "sr8", "kivi2", "witcert-m0", "witcert-m4"}
        for row in rows.values():
            assert row["bytes"] > 0 and row["latency_ms"] > 0 and 0.0 <= row["coverage"] <= 1.0
    nd = res["needles"]["rows"]
    assert set(nd) == {"exact", "fp16", "fp16+gated", "witcert-m0", "witcert-m0+gated"}
    assert "mcnemar" in nd["witcert-m0"] and nd["witcert-m0"]["vs_ref"]["resamples"] == 10_000
    assert set(res["quality"]) == {"docs", "code"}
    md = (out / "report.md").read_text()
    assert md.splitlines()[4].strip().startswith("witcert report --quick --out")
    for h in ("## 1.", "## 2.", "## 3.", "## 4.", "## 5."):
        assert h in md
    # rerun: every cached unit is a hit
    assert _run(out) == 0
    rep2 = json.loads((out / "report.json").read_text())
    assert rep2["meta"]["cache"]["misses"] == 0
    assert rep2["results"]["soundness"] == res["soundness"]
