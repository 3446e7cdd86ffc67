"""The gate's repair of a whole gated decode call in one C call (``witcert.native.repair``)
against its specification, ``RowCtx.repair_row`` one row at a time (numpy plan inputs, the C
plan and the C decode): the same outputs, certificates, entries made exact (flags and epochs)
and counters, bit for bit, over shared cases (policies, radii, pages shared between rows,
entries live or stale before the step, a bounded copy, non-finite copies and queries, several
steps)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cases import vllm_gated_layer
from witcert import native
from witcert.config import CertConfig, RepairPolicy
from witcert.integrations.vllm.attend import anytime_delta, decode_gated
from witcert.ref.attention import token_slots
from witcert.ref.pool import write_
from witcert.runtime import repair_rows as rr
from witcert.runtime.exact import ExactCopy

HKV, R, D, PAGE, BLOCKS, SM = 3, 3, 64, 16, 12, 0.125
BT = torch.tensor([[3, 1, 0, 0], [7, 6, 0, 0], [2, 0, 0, 0], [8, 9, 10, 11]], dtype=torch.int32)
BT_SHARED = torch.tensor([[3, 1, 0, 2], [7, 6, 5, 4], [4, 0, 1, 2], [2, 3, 4, 5]],
                         dtype=torch.int32)
SL = torch.tensor([40, 17, 1, 64], dtype=torch.int32)


@pytest.fixture(autouse=True)
def _needs_native(monkeypatch):
    if not native.available():
        pytest.skip(f"native library unavailable: {native.reason()}")
    monkeypatch.delenv("WITCERT_BACKEND", raising=False)


def _setup(*, seed=0, bounded=False, nonfinite=False):
    lkv, ex = vllm_gated_layer(blocks=BLOCKS, page=PAGE, hkv=HKV, d=D, layer=2)
    if bounded:  # a bounded copy: some slots hold none (never made exact)
        have = torch.ones(BLOCKS * PAGE, dtype=torch.bool)
        have[torch.arange(5, BLOCKS * PAGE, 7)] = False
        ex = ExactCopy(num_slots=BLOCKS * PAGE, num_kv_heads=HKV, head_dim=D,
                       dtype=torch.bfloat16, epochs=lkv.epochs, have=have)
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(BLOCKS * PAGE, HKV, D, generator=g) * 2
    k[:, :, 3] += 30 * torch.rand(BLOCKS * PAGE, HKV, generator=g)  # wide groups: large radii
    v = torch.randn(BLOCKS * PAGE, HKV, D, generator=g)
    slots = torch.arange(BLOCKS * PAGE)
    lkv.epochs[slots] += 1
    write_(lkv, k.bfloat16(), v.bfloat16(), slots=slots)
    ex.write_(slots, k.bfloat16(), v.bfloat16())
    if nonfinite:  # copies that can never be made exact (a K element, a V element)
        ex.k[50, 1, 7] = float("inf")
        ex.v[51, 1, 9] = float("nan")
        ex.k[130, 2, 0] = float("nan")
    return lkv, ex


def _mark_some(ex):
    """Entries live before the step and a stale one (old epoch, garbage copy)."""
    s = [token_slots(BT[b], int(SL[b]), page_size=PAGE) for b in range(4)]
    ex.mark_(s[0][:16], torch.zeros(16, dtype=torch.int64))
    ex.mark_(s[3][20:40], torch.full((20,), 2, dtype=torch.int64))
    stale = s[3][:8]
    ex.exact[stale, 1] = True
    ex.exact_epoch[stale, 1] = ex.epochs[stale] - 1
    ex.k[stale, 1] = 50.0


def _query(step, *, bad=False):
    g = torch.Generator().manual_seed(100 + step)
    q = torch.randn(4, HKV * R, D, generator=g)
    q[:, :, 3] *= 3
    if bad:
        q[3, 4, 11] = float("nan")  # a non-finite query head: never repaired
    return q


def _steps(monkeypatch, c_rows: bool, *, mode, radius, tau, bt, terms_first, steps=3,
           **setup):
    """decode_gated over ``steps`` steps with the C repair (c_rows) or the spec; returns what
    each step delivered and the copy's flags after it."""
    monkeypatch.setattr(rr.RowCtx, "rows_unsupported",
                        _orig_unsupported if c_rows else (lambda self: "forced: the spec"))
    calls = []
    if c_rows:
        from witcert.native import repair as nrep
        real = nrep.repair_rows

        def spy(*a, **k):
            calls.append(1)
            return real(*a, **k)
        monkeypatch.setattr(nrep, "repair_rows", spy)
    lkv, ex = _setup(**setup)
    _mark_some(ex)
    cert = CertConfig(radius=radius, allocation="anytime", tau=tau)
    d = anytime_delta(cert, num_layers=30, num_q_heads=HKV * R, positions=SL)
    out = []
    for step in range(steps):
        o, c, ev = decode_gated(_query(step, bad=setup.get("nonfinite", False)), lkv, ex, bt, SL,
                                page_size=PAGE, sm_scale=SM, cert=cert, delta_loc=d,
                                repair=RepairPolicy(mode=mode, block_tokens=16), native="on",
                                num_threads=2, terms_first=terms_first)
        out.append((o, c, ev.as_dict(), ex.exact.clone(), ex.exact_epoch.clone()))
    return out, len(calls)


_orig_unsupported = rr.RowCtx.rows_unsupported


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """f32 tensors with the same bits (NaN and inf included)."""
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


@pytest.mark.parametrize("mode", ["block", "head"])
@pytest.mark.parametrize("radius,tau", [("min", 0.15), ("det", 0.35), ("prob", 0.15)])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("terms_first", [False, True])
def test_c_repair_of_the_call_is_the_row_by_row_repair(monkeypatch, mode, radius, tau, shared,
                                                        terms_first):
    kw = dict(mode=mode, radius=radius, tau=tau, bt=BT_SHARED if shared else BT,
              terms_first=terms_first)
    got, calls = _steps(monkeypatch, True, **kw)
    ref, _ = _steps(monkeypatch, False, **kw)
    assert calls > 0 and ref[0][2]["fired"] > 0 and ref[0][2]["tokens"] > 0
    for s, (a, b) in enumerate(zip(got, ref)):
        assert _same(a[0], b[0]) and _same(a[1], b[1]), (s, "out / cert")
        assert a[2] == b[2], s
        assert torch.equal(a[3], b[3]) and torch.equal(a[4], b[4]), (s, "flags / epochs")


@pytest.mark.parametrize("bounded,nonfinite", [(True, False), (False, True), (True, True)])
def test_c_repair_skips_what_cannot_be_made_exact_like_the_spec(monkeypatch, bounded, nonfinite):
    kw = dict(mode="block", radius="min", tau=0.12, bt=BT_SHARED, terms_first=False,
              bounded=bounded, nonfinite=nonfinite)
    got, calls = _steps(monkeypatch, True, **kw)
    ref, _ = _steps(monkeypatch, False, **kw)
    assert calls > 0 and ref[0][2]["fired"] > 0
    for s, (a, b) in enumerate(zip(got, ref)):
        assert _same(a[0], b[0]) and _same(a[1], b[1]), (s, "out / cert")
        assert a[2] == b[2], s
        assert torch.equal(a[3], b[3]) and torch.equal(a[4], b[4]), (s, "flags / epochs")
    if nonfinite:
        assert torch.isinf(got[0][1][3, 4])  # the NaN query head: +inf, not repaired


def test_only_an_exact_copy_marked_by_the_copy_itself_goes_to_c():
    lkv, ex = _setup()
    q = _query(0)
    cert = CertConfig(radius="min", allocation="anytime", tau=0.15)
    mk = dict(copy=ex, tau=0.15, policy=RepairPolicy(mode="block"), native=True)
    ctx = rr.RowCtx(q, lkv, BT, SL, PAGE, SM, cert, 1e-4, **mk)
    assert ctx.rows_unsupported() is None
    assert "mark" in rr.RowCtx(q, lkv, BT, SL, PAGE, SM, cert, 1e-4, **mk,
                               mark=lambda s, h: 0).rows_unsupported()
    assert "native" in rr.RowCtx(q, lkv, BT, SL, PAGE, SM, cert, 1e-4,
                                 **{**mk, "native": False}).rows_unsupported()
    ex.rounds = True
    assert "rounding" in ctx.rows_unsupported()


def test_dot4_is_four_partial_sums_in_order():
    g = np.random.default_rng(0)
    a = g.standard_normal((3, 8)).astype(np.float32).astype(np.float64)
    b = (g.standard_normal((5, 8)) * 1e3).astype(np.float32).astype(np.float64)
    want = np.empty((3, 5))
    for i in range(3):
        for j in range(5):
            s = [0.0] * 4
            for d in range(8):
                s[d % 4] += a[i, d] * b[j, d]
            want[i, j] = (s[0] + s[1]) + (s[2] + s[3])
    assert np.array_equal(rr.dot4(a, b), want)
    # a head dim that is not a multiple of 4: zero padding, the same sums
    assert np.array_equal(rr.dot4(a[:, :6], b[:, :6]),
                          rr.dot4(np.pad(a[:, :6], ((0, 0), (0, 2))), np.pad(b[:, :6], ((0, 0), (0, 2)))))


@pytest.mark.parametrize("terms_first", [False, True])
def test_a_later_row_on_the_same_slots_is_decoded_again_in_c_as_in_the_spec(monkeypatch,
                                                                          terms_first):
    """Rows with the same slots and query: the later one starts from the earlier one's
    repair (decoded again, not the first pass's stale state), in C as in the spec."""
    res = {}
    for c_rows in (True, False):
        monkeypatch.setattr(rr.RowCtx, "rows_unsupported",
                            _orig_unsupported if c_rows else (lambda self: "forced: the spec"))
        lkv, ex = _setup()
        cert = CertConfig(radius="min", allocation="anytime", tau=0.15)
        q, bt, sl = _query(0)[[3, 0, 3]], BT[[3, 0, 3]], SL[[3, 0, 3]]
        d = anytime_delta(cert, num_layers=30, num_q_heads=HKV * R, positions=sl)
        o, c, ev = decode_gated(q, lkv, ex, bt, sl, page_size=PAGE, sm_scale=SM, cert=cert,
                                delta_loc=d, repair=RepairPolicy(mode="block"), native="on",
                                terms_first=terms_first)
        res[c_rows] = (o, c, ev.as_dict(), ex.exact.clone())
    (o, c, ev, x), (o1, c1, ev1, x1) = res[True], res[False]
    assert ev["fired"] > 0 and ev == ev1 and torch.equal(x, x1)
    assert _same(o, o1) and _same(c, c1)
    assert _same(o[2], o[0]) and _same(c[2], c[0])  # the later row adds nothing
