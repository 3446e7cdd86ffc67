"""The fp16 q.k routes' slack (benchmarks/aligned_slack_study.py --fp16-keys, BENCHMARKS.md 13ai): a
pricing study of the CUDA extend's routes (one fp16 key is the kernel's since 2026-12-07e, with the
Cauchy-Schwarz form). Its forms must order as the bounds they price: the per-group forms a kernel
can fold into its radius sums are never below the per-token one, and each term vanishes where the
route is exact."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from witcert.ref.arith import tc_dot_slack

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from aligned_slack_study import fp16_route_slack  # noqa: E402

ONE, HILO = "one fp16 key (8 dots a 16 x 8)", "hi + lo fp16 keys (16 dots)"


def test_the_folded_form_is_never_below_the_per_token_one():
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(4, 128, generator=gen) * 3
    khat = (torch.randn(64, 128, generator=gen) * 40).float()  # 24-bit keys: not fp16 numbers
    slack = fp16_route_slack(q, khat, sm=128 ** -0.5, group=32)
    for route in (ONE, HILO):
        assert (slack[route, "folded"] >= slack[route, "exact"]).all()
        assert (slack[route, "cs"] >= slack[route, "exact"] * (1 - 1e-12)).all()
        assert (slack[route, "exact"] > 0).all()
    assert (slack[HILO, "exact"] < slack[ONE, "exact"]).all()  # the lo key takes most of the rounding


def test_keys_that_are_fp16_numbers_leave_only_the_accumulation():
    """k^ already in fp16: no rounding term, lo = 0; what stays is the accumulation, rel sm sum_i
    |q_i k_i| (witcert.ref.arith.tc_dot_slack)."""
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(2, 128, generator=gen).half().float()
    khat = torch.randn(8, 128, generator=gen).half().float()
    sm = 0.125
    slack = fp16_route_slack(q, khat, sm=sm, group=32)
    acc = tc_dot_slack(128, sm)[0] * sm * q.double().abs() @ khat.double().abs().T
    for route in (ONE, HILO):
        torch.testing.assert_close(slack[route, "exact"], acc, rtol=1e-12, atol=0)


def test_the_model_keys_are_one_kv_heads_keys_and_its_query_rows():
    """--model-keys: the bundled model's keys [N, 1, D] of one KV head and the rows of its query
    heads (the last positions of each), finite."""
    from aligned_slack_study import model_keys

    k, q = model_keys(64, layer=3, kv_head=1, rows=4)
    assert k.shape == (64, 1, 64) and q.shape[1] == 64 and q.shape[0] % 4 == 0 and q.shape[0] >= 4
    assert torch.isfinite(k).all() and torch.isfinite(q).all() and k.abs().max() > 0
