"""The report's instrument without a model: stored values, radii, gating, needle scoring."""

from __future__ import annotations

import math
import random

import pytest
import torch

from cases import gate_rows
from witcert.ref.cert import certificate
from witcert.ref.compressors import get_compressor
from witcert.report import engine, gate, quad
from witcert.report.engine import VARIANT_BY_LABEL, VARIANTS, RunConfig


@pytest.mark.parametrize("label", [v.label for v in VARIANTS])
def test_every_variant_certificate_bounds_true_tv_on_gaussian_keys(label):
    r = quad.synthetic_unit(VARIANT_BY_LABEL[label], tokens=64, queries=3, seed=3, tau=0.2, delta=1e-2)
    v = VARIANT_BY_LABEL[label]
    for kind in v.radius_kinds:
        if kind == "sr_naive":
            continue  # unjustified radius: reported, not relied on
        assert bool((r["tv"] <= r["certs"][kind] + 1e-12).all()), kind
        assert r["exceed"][kind] == 0, kind
    assert bool((r["err"] >= 0).all())


def test_sr_hoeffding_radius_is_sqrt3_times_the_naive_sigma_term():
    k = torch.randn(32, 3, 64).half()
    st = engine.store(VARIANT_BY_LABEL["sr8"], k, k, layer=0, seed=1)
    q = torch.randn(9, 2, 64, dtype=torch.float64)
    n = torch.full((2, 1), 32.0, dtype=torch.float64)
    u = engine.radii(VARIANT_BY_LABEL["sr8"], q, st, sm=0.125, n_tokens=n, delta_loc=1e-4)
    sc = st.kscales[:, torch.arange(9) // 3].transpose(0, 1)[:, None]
    bits = VARIANT_BY_LABEL["sr8"].quant(seed=0).dither_bits
    sigma, bias = engine._sigma_bias(q, sc, sm=0.125, group_size=32, bits=bits, bypass=None)
    lf = math.sqrt(2 * math.log(2 * 32 / 1e-4))
    torch.testing.assert_close(u["sr_hoeffding"], math.sqrt(3) * sigma * lf + bias)
    torch.testing.assert_close(u["sr_naive"], sigma * lf + bias)


def test_gate_row_pages_blocks_until_cert_is_below_tau():
    g = torch.Generator().manual_seed(0)
    zx = torch.randn(100, generator=g, dtype=torch.float64)
    zh = zx + 0.05 * torch.randn(100, generator=g, dtype=torch.float64)
    u = torch.full((100,), 0.5, dtype=torch.float64)
    assert float(certificate(zh, u)[1]) > 0.2
    exact = torch.zeros(1, 100, dtype=torch.bool)
    cfg = RunConfig(VARIANT_BY_LABEL["rtn8"], seed=0, tau=0.2, gated=True, block_tokens=16)
    gate.gate_row(cfg, exact, 0, zh, u, zx)
    zi = torch.where(exact[0], zx, zh)
    ui = torch.where(exact[0], torch.zeros(()), u)
    assert float(certificate(zi, ui)[1]) <= 0.2
    assert 0 < int(exact.sum()) < 100 and int(exact.sum()) % 16 in (0, 100 % 16)


def test_needle_scoring_is_greedy_whole_answer_match():
    from witcert.report.needles import NeedleSample, correct

    feed = torch.tensor([5, 6, 7, 8, 9])  # question 5 6 7, answer 8 9
    smp = NeedleSample("single", "noise", 10, torch.zeros(3, dtype=torch.int64), feed, 2)
    logits = torch.zeros(5, 12)
    logits[2, 8] = 1.0
    logits[3, 9] = 1.0
    assert correct(logits, smp)
    logits[3, 1] = 2.0
    assert not correct(logits, smp)


def test_needle_sample_respects_length_cap_and_contains_the_needle():
    tok = pytest.importorskip("transformers")
    from witcert.hf.model import ensure_local_model

    try:
        path = ensure_local_model()
    except FileNotFoundError:
        pytest.skip("bundled model not installed")
    from transformers import AutoTokenizer

    from witcert.report.needles import make_sample

    tk = AutoTokenizer.from_pretrained(path)
    text_ids = tk("hello world. " * 400, add_special_tokens=False)["input_ids"]
    for task in ("single", "multi_key", "multi_value", "multi_query"):
        s = make_sample(tk, task=task, haystack="text", length=300, rng=random.Random(task),
                        text_ids=text_ids, max_positions=320)
        assert s.context.numel() + s.feed.numel() <= 320
        ctx = tk.decode(s.context)
        ans = tk.decode(s.feed[-s.answer_len:])
        for num in [w.strip(".,") for w in ans.split() if w.strip(".,").isdigit()]:
            assert num in ctx


@pytest.mark.parametrize("label", ["kivi2", "kivi4"])
def test_block_groups_equal_a_fresh_encode_of_each_prefix(label):
    """One encode of all N tokens, masked per position, is bitwise what encoding the
    prefix ``[:n]`` afresh stores (the report engine relies on it for KIVI)."""
    from witcert.report.engine import KV_DTYPE, block_groups, store

    variant = VARIANT_BY_LABEL[label]
    comp = get_compressor(variant.quant(5))
    g = torch.Generator().manual_seed(3)
    N, first_n = 600, 560  # crosses the residual window and a key-block boundary (256)
    k = (torch.randn(N, 2, 64, generator=g) * 2).to(KV_DTYPE)
    v = torch.randn(N, 2, 64, generator=g).to(KV_DTYPE)
    full = store(variant, k, v, layer=0, seed=5)
    groups = block_groups(comp, full, k, v, first_n=first_n, count=N - first_n + 1)
    assert len(groups) > 2
    bounds = [g[0] for g in groups] + [N - first_n + 1]
    for (first, s, _), end in zip(groups, bounds[1:]):
        for i in (first, end - 1):
            n = first_n + i
            fresh = store(variant, k[:n], v[:n], layer=0, seed=5)
            for name in ("khat", "vhat", "kwit", "vwit"):
                assert torch.equal(getattr(s, name)[:n], getattr(fresh, name)), (name, n)


def _gate_rows(count: int, seed: int = 1):
    """(stored logits, radii, exact logits) of ``count`` rows (``cases.gate_rows``)."""
    for _, zh, u, zx in gate_rows(count, seed=seed):
        yield zh, u, zx


@pytest.mark.parametrize("tau,seed", [(0.2, None), (0.05, 2)])
def test_one_pass_gate_row_equals_the_greedy_loop(tau, seed):
    """``gate_row`` (the runtime's one-pass plan, sorted prefix sums) repairs exactly the
    blocks the greedy loop does, on rows where a few, many or all blocks are needed, with an
    inf radius, and none."""
    cfg = RunConfig(VARIANT_BY_LABEL["rtn8"], seed=0, tau=tau, gated=True, block_tokens=16)
    counts = set()
    rows = _gate_rows(120) if seed is None else _gate_rows(200, seed=seed)
    for trial, (zh, u, zx) in enumerate(rows):
        n = zh.numel()
        fast = torch.zeros(1, n, dtype=torch.bool)
        slow = torch.zeros(1, n, dtype=torch.bool)
        gate.gate_row(cfg, fast, 0, zh, u, zx)
        gate.gate_row_greedy(cfg, slow, 0, zh, u, zx)
        assert torch.equal(fast, slow), trial
        counts.add(min(int(fast.sum()) // 16, 3))
    assert counts == {0, 1, 2, 3}  # the trials exercise none, one, few and many blocks
