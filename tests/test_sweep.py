"""The bypass sweep (witcert.eval.sweep) and the gate inside ``model.generate`` on the bundled model."""

from __future__ import annotations

import math

import pytest
import torch

from witcert.config import CertConfig, QuantConfig, RepairPolicy
from witcert.eval.sweep import plot_png, table_markdown


def _result():
    rows = []
    for m, cov in ((0, 0.8), (4, 0.9), (8, 0.95), (16, 0.97)):
        rows.append({"m": m, "coverage": cov, "fallback_rate": 1 - cov, "heads_repaired": 1.0,
                     "kv_bytes_per_token": 12960 + 360 * m, "exact_bytes_per_token": 100.0,
                     "bytes_per_token": 13060.0 + 360 * m, "fp16_fraction": 0.6,
                     "kl_raw": 1e-4, "kl_gated": 1e-5, "top1_raw": 1.0, "top1_gated": 1.0,
                     "cert_mean_raw": 0.1, "k_jaccard": None})
    meta = {"tau": 0.2, "radius": "min", "mode": "block", "block_tokens": 16,
            "prefill_tokens": 256, "steps": 32, "dtype": "torch.float16"}
    return {"rows": rows, "meta": meta}


def test_table_has_one_row_per_m_and_every_column(tmp_path):
    md = table_markdown(_result())
    lines = [ln for ln in md.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert [int(ln.split("|")[1]) for ln in lines] == [0, 4, 8, 16]
    assert all(ln.count("|") == 14 for ln in lines)
    assert "| 14500 |" in md  # the m=4 row's total bytes
    png = plot_png(_result(), tmp_path / "s.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _bundled():
    pytest.importorskip("transformers")
    from witcert.hf.model import bundled_gguf_path, load_model

    try:
        bundled_gguf_path()
    except FileNotFoundError:
        pytest.skip("bundled model not installed")
    return load_model(None, dtype=torch.float16)


def test_gate_inside_generate_batched_delivers_only_certified_steps():
    """``generate(..., repair=...)`` on a batch of 2 with a tight tau: the gate fires and
    repairs inside ``model.generate``; every certificate the CertLog saw (the delivered
    ones) is <= tau, and the gate's counters hold the before/after and the bytes."""
    from witcert.hf.generate import generate

    model, tok = _bundled()
    res = generate(model, tok, ["The prism splits white light into", "Water boils at"],
                   max_new_tokens=4, quant=QuantConfig(seed=3), cert=CertConfig(tau=0.02),
                   chat=False, repair=RepairPolicy(mode="block", block_tokens=4))
    g, log = res.cache_stats["gate"], res.cert_summary
    assert len(res.token_ids) == 2 and all(len(t) >= 1 for t in res.token_ids)
    assert g["heads_gated"] > 0 and g["bytes_paged"] > 0 and g["blocks_paged"] > 0
    assert g["heads_repaired"] == g["heads_gated"]
    assert log["coverage"] == 1.0 and g["cert_after_max"] <= 0.02 < g["cert_before_max"]
    assert g["steps"] == log["steps"] >= 1
    assert res.bytes["exact_store_bytes"] == g["exact_store_bytes"] > 0


def test_sweep_end_to_end_on_the_bundled_model_is_consistent():
    from witcert.commands.eval import reference_text
    from witcert.eval.sweep import sweep

    model, tok = _bundled()
    res = sweep(model, tok, reference_text(), ms=(0, 4), prefill_tokens=32, steps=2,
                calib_tokens=64, tau=0.1, log=lambda s: None)
    r0, r4 = res["rows"]
    for r in (r0, r4):
        assert 0.0 <= r["coverage"] <= 1.0 and 0.0 <= r["fallback_rate"] <= 1.0
        assert r["kl_gated"] >= 0 and not math.isnan(r["kl_raw"])
    # bypass adds 2m fp16 values per (token, layer, kv head, side): 30 layers, 3 kv heads
    assert r4["kv_bytes_per_token"] - r0["kv_bytes_per_token"] == 30 * 3 * 2 * (2 * 4 * 2)
    assert r0["k_jaccard"] is None and 0.0 <= r4["k_jaccard"] <= 1.0
