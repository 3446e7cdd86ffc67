"""Contract tests: the native C extend (witcert.native.extend) against the reference spec
(witcert.ref.extend.extend_attention_cert).

Tiers: floating point (out within 2x the plain torch fp32 extend's error against float64 on
the stored prefix and the exact new tokens; lse close to the spec's); certificate (cert >= the
exact TV of every new token between the exact-key softmax and the softmax of the logits the C
code used, tests/fpexact.py; never above the spec's cert, whose rounding model is the looser
one, and close to it); the +inf patterns exactly as the spec; threads and the portable build
give the same bits. The pool-read extend (``pool_read`` / the spec's ``new_from_pool``: the new
tokens read back compressed from the pool, causally) runs through the same matrix, plus: a
row's result does not depend on how the sequence was split into calls (bitwise), and flagged
tokens past a row's limit do not touch it. Skipped with the reason when the library cannot
be built.
"""

from __future__ import annotations

import math

import pytest
import torch

from extend_cases import exact_attention_f64, exact_tv, make_batch
from witcert import native
from witcert.config import CertConfig, QuantConfig
from witcert.native import extend as ne
from witcert.ref import arith
from witcert.ref import attention as ref_attn
from witcert.ref.extend import extend_attention_cert
from witcert.ref.pool import LayerKV, write_

PORTABLE = ("-DWC_NO_CLONES",)


@pytest.fixture(autouse=True, scope="module")
def _needs_native():
    if not native.available():
        pytest.skip(f"native library unavailable: {native.reason()}")


def _native(batch, *, sm, radius="min", delta_loc=None, causal=True, threads=1, debug=None,
            with_cert=True, flags=(), pool_read=False, arith="f32"):
    rows = batch.q.shape[0]
    dl = torch.full((rows,), 1e-6, dtype=torch.float64) if delta_loc is None else delta_loc
    return ne.extend_attention(batch.q, batch.k_new, batch.v_new, batch.layer,
                               q_start=batch.q_start, q_len=batch.q_len,
                               prefix_len=batch.prefix_len, block_table=batch.block_table,
                               page_size=batch.page, sm_scale=sm, radius=radius, delta_loc=dl,
                               causal=causal, num_threads=threads, debug=debug,
                               with_cert=with_cert, pool_read=pool_read, arith=arith,
                               _extra_flags=flags)


def _spec(batch, b, *, sm, radius, delta_loc, causal=True, pool_read=False):
    rows = batch.rows(b)
    return extend_attention_cert(batch.q[rows], batch.k_new[rows], batch.v_new[rows], batch.layer,
                                 batch.prefix_slots(b), sm_scale=sm, cert=CertConfig(radius=radius),
                                 delta_loc=delta_loc[rows], causal=causal, new_from_pool=pool_read)


def _plain(batch, b, *, sm, pool_read):
    """The plain torch fp32 extend (the float tier's yardstick)."""
    r = batch.rows(b)
    if not pool_read:
        return ref_attn.extend_attention(batch.q[r], batch.k_new[r], batch.v_new[r], batch.layer,
                                         batch.prefix_slots(b), sm_scale=sm)
    hq, hkv, T, N = batch.q.shape[1], batch.k_new.shape[1], batch.q_len[b], batch.prefix_len[b]
    kvh = torch.arange(hq) // (hq // hkv)
    kh, vh = batch.stored_prefix(b)
    z = sm * torch.einsum("thd,nhd->thn", batch.q[r], kh[:, kvh])
    z = z.masked_fill((torch.arange(N)[None, :] > N - T + torch.arange(T)[:, None])[:, None],
                      float("-inf"))
    return torch.einsum("thn,nhd->thd", torch.softmax(z, -1), vh[:, kvh])


def _used_keys(batch, b, pool_read, side=0):
    """The keys (side 1: values) the C path reads for sequence b, f64 [N, Hkv, D]: the stored
    (dequantized) prefix, then (unless pool_read) the exact new tokens."""
    kh = batch.stored_prefix(b)[side].double()
    new = (batch.k_new, batch.v_new)[side][batch.rows(b)].double()
    return kh if pool_read else torch.cat([kh, new])


def _f32_slack_holds(batch, b, used, *, sm, pool_read):
    """The fp32 dots' bound (``native_f32_model``, docs/PROOFS.md 5.3): every logit the C path
    used is within ``rel_s sm sum_i |q_i k_i| + abs_err`` of ``sm q.k`` (float64 here: its own
    error, ~2^-47 relative, is far below the fp32 slack). Returns the largest |logit error|."""
    hq, hkv, d = batch.q.shape[1], batch.k_new.shape[1], batch.q.shape[2]
    kvh = torch.arange(hq) // (hq // hkv)
    k = _used_keys(batch, b, pool_read)[:, kvh]  # [N, Hq, D]
    q = batch.q[batch.rows(b)].double()
    z = sm * torch.einsum("thd,nhd->thn", q, k)
    S = torch.einsum("thd,nhd->thn", q.abs(), k.abs())
    m = arith.native_f32_model(d)
    slack = m.rel_s * sm * S + m.abs_err
    live = torch.isfinite(used)
    err = torch.where(live, (used - z).abs(), 0.0)
    assert (err <= slack).all(), (err / slack).max()
    return err.max().item()


def _close_to_f64(c, c64, used, used64, radius, radius64):
    """The fp32 path's certificate against the float64 path's: its radii are larger by the
    fp32 slack (at most ``du``) and its logits differ by at most ``dl``, so each weight ratio
    moves by at most ``e^(2 dl)`` and ``expm1(u)`` by at most a factor ``e^du`` plus
    ``expm1(du)``: ``|c - c64| <= (1 + c64) expm1(2 du + 4 dl)`` (with room)."""
    live = torch.isfinite(used)
    dl = torch.where(live, (used - used64).abs(), 0.0).amax(-1)
    du = torch.where(live, (radius.double() - radius64.double()).abs(), 0.0).amax(-1)
    tol = (1 + c64.double()) * torch.expm1(2 * du + 4 * dl) * 1.01 + 1e-12
    assert ((c.double() - c64.double()).abs() <= tol).all(), (c, c64, tol)


def _close_to_spec(c, spec_c, used, radius):
    """The spec (fp32 logits, ``reference_model``) adds ``2^-24 |l|`` per logit and perturbs the
    weights by as much; the C path (float64 logits, ``native_model``) does neither. So the two
    certificates differ by at most ``~2^-24 max|l| (e^U + cert)`` (U the largest radius)."""
    live = torch.isfinite(used)
    lmax = torch.where(live, used.abs(), 0.0).amax(-1)
    umax = torch.where(live, radius.double(), 0.0).amax(-1)
    tol = 4 * 2.0**-24 * lmax * (torch.exp(umax) + spec_c.double()) + 1e-5 * spec_c.double() + 1e-12
    assert ((c.double() - spec_c.double()).abs() <= tol).all(), (c, spec_c, tol)


CASES = [  # (prefix_lens, new_lens, Hq, Hkv, D, page, pool_read): prefix 0, 1, P-1, P, P+1;
    # new 1, 16, 17, 40 (pool-read: also 130, several chunks of rows)
    ((0, 1, 15, 16, 17), (5, 1, 17, 16, 3), 3, 1, 64, 16, False),  # MQA (GQA 3)
    ((40, 0), (17, 1), 4, 4, 64, 1, False),                          # MHA (GQA 1)
    ((33, 2, 0), (9, 40, 2), 8, 2, 128, 16, False),                   # GQA 4
    ((0, 1, 15, 16, 17), (5, 1, 17, 16, 3), 3, 1, 64, 16, True),
    ((40, 0, 3), (17, 1, 130), 4, 4, 64, 1, True),
    ((33, 2, 0), (9, 40, 2), 8, 2, 128, 16, True),
]


@pytest.mark.parametrize("bits,radius,key", [(8, "det", "slot"), (8, "prob", "slot"),
                                             (8, "min", "slot"), (16, "min", "slot"),
                                             (24, "min", "slot"), (8, "min", "position"),
                                             (24, "prob", "position")])
@pytest.mark.parametrize("prefix_lens,new_lens,hq,hkv,d,page,pool_read", CASES)
@pytest.mark.parametrize("arith", ["f64", "f32"])
def test_native_extend_is_within_2x_torch_error_sound_for_every_new_token_and_close_to_the_spec(
        prefix_lens, new_lens, hq, hkv, d, page, pool_read, bits, radius, key, arith):
    """f64: float64 arithmetic (native_model), never above the spec's certificate and close to
    it. f32 (the default): the fp32 dots and value pass (native_f32_model): every logit within
    its fp32 slack of the exact one, the certificate close to the f64 path's; both sound."""
    batch = make_batch(prefix_lens=prefix_lens, new_lens=new_lens, hq=hq, hkv=hkv, d=d, page=page,
                       bits=bits, seed=sum(prefix_lens) + hq + bits, gap_rows=1, key=key,
                       pool_read=pool_read)
    sm = d ** -0.5
    rows = batch.q.shape[0]
    dl = torch.logspace(-9, -2, rows, dtype=torch.float64)  # a different budget per new token
    dbg, dbg64 = {}, {}
    out, lse, cert = _native(batch, sm=sm, radius=radius, delta_loc=dl, debug=dbg,
                             pool_read=pool_read, arith=arith)
    if arith == "f32":
        _, _, cert64 = _native(batch, sm=sm, radius=radius, delta_loc=dl, debug=dbg64,
                               pool_read=pool_read, arith="f64")
    for b in range(len(prefix_lens)):
        r, Np, T = batch.rows(b), batch.prefix_len[b], batch.q_len[b]
        N = Np if pool_read else Np + T  # keys of the debug rows
        want64 = exact_attention_f64(batch, b, sm=sm, pool_read=pool_read)
        plain = _plain(batch, b, sm=sm, pool_read=pool_read)
        err_t = (plain.double() - want64).abs().max().item()
        err_n = (out[r].double() - want64).abs().max().item()
        floor = 2 * 2.0**-24 * want64.abs().max().item()
        used = dbg["logits"][r][..., :N]
        if arith == "f32":  # plus what the fp32 logits' own error moves: weights by e^(+-2 e)
            e = _f32_slack_holds(batch, b, used, sm=sm, pool_read=pool_read)
            vmax = _used_keys(batch, b, pool_read, side=1).abs().max().item() if N else 0.0
            floor += 2 * math.expm1(2 * e) * vmax
        assert err_n <= 2 * err_t + floor, f"b={b}: out error {err_n:.3g} vs torch fp32 {err_t:.3g}"
        spec = _spec(batch, b, sm=sm, radius=radius, delta_loc=dl, pool_read=pool_read)
        c = cert[r]
        assert torch.isfinite(c).all() and (c >= 0).all()
        rad = dbg["radius"][r][..., :N]
        if arith == "f64":
            torch.testing.assert_close(lse[r], spec.lse, rtol=1e-6, atol=2e-6)
            assert (c.double() <= spec.cert.double() * (1 + 1e-5) + 1e-12).all(), (c, spec.cert)
            _close_to_spec(c, spec.cert, used, rad)
        else:
            used64 = dbg64["logits"][r][..., :N]
            _close_to_f64(c, cert64[r], used, used64, rad, dbg64["radius"][r][..., :N])
            gap = torch.where(torch.isfinite(used), (used - used64).abs(), 0.0).amax(-1)
            assert ((lse[r].double() - spec.lse.double()).abs() <= gap + 1e-6 * spec.lse.abs()
                    + 2e-6).all()
        if Np == 0 and not pool_read:  # only arithmetic slack: tiny; the fp32 dots' is larger
            if arith == "f64":
                assert (c < 1e-9).all()
            else:  # a weighted mean of expm1(u) over the exact tokens, u ~1e-5 |q| |k| sm
                umax = torch.where(torch.isfinite(used), rad.double(), 0.0).amax(-1)
                assert (c.double() <= torch.expm1(umax) * (1 + 1e-6)).all() and (c < 1e-3).all()
        if pool_read and T:  # nothing is read exactly: every row carries compression radii
            assert (c > 0).all()
        tv = exact_tv(batch, b, used, c, sm=sm, pool_read=pool_read)
        assert (c.double() >= tv).all(), f"b={b}: cert {c} below the exact TV {tv}"


@pytest.mark.parametrize("arith", ["f64", "f32"])
def test_non_causal_extend_matches_the_spec_and_is_sound(arith):
    batch = make_batch(prefix_lens=(20, 0), new_lens=(7, 5), hq=6, hkv=2, d=64, page=16, seed=4)
    sm = 0.125
    dl = torch.full((batch.q.shape[0],), 1e-6, dtype=torch.float64)
    dbg, dbg64 = {}, {}
    out, lse, cert = _native(batch, sm=sm, delta_loc=dl, causal=False, debug=dbg, arith=arith)
    _, _, cert64 = _native(batch, sm=sm, delta_loc=dl, causal=False, debug=dbg64, arith="f64")
    for b in range(2):
        r, N = batch.rows(b), batch.prefix_len[b] + batch.q_len[b]
        spec = _spec(batch, b, sm=sm, radius="min", delta_loc=dl, causal=False)
        used, rad = dbg["logits"][r][..., :N], dbg["radius"][r][..., :N]
        torch.testing.assert_close(out[r], spec.out, rtol=2e-5, atol=2e-6)
        if arith == "f64":
            _close_to_spec(cert[r], spec.cert, used, rad)
        else:
            _f32_slack_holds(batch, b, used, sm=sm, pool_read=False)
            _close_to_f64(cert[r], cert64[r], used, dbg64["logits"][r][..., :N], rad,
                          dbg64["radius"][r][..., :N])
        tv = exact_tv(batch, b, used, cert[r], sm=sm, causal=False)
        assert (cert[r].double() >= tv).all()


def _inf_patterns(native_cert, spec_cert):
    assert torch.equal(torch.isinf(native_cert), torch.isinf(spec_cert)), (native_cert, spec_cert)


def test_flagged_prefix_token_gives_inf_for_its_kv_group_like_the_spec():
    batch = make_batch(prefix_lens=(30, 12), new_lens=(4, 3), hq=4, hkv=2, d=64, page=16, seed=8)
    k, v = batch.exact_prefix[0]
    kbad = k.clone()
    kbad[3, 1, 5] = float("nan")
    write_(batch.layer, kbad, v, slots=batch.prefix_slots(0))  # sequence 0, KV head 1 flagged
    out, _, cert = _native(batch, sm=0.125)
    dl = torch.full((batch.q.shape[0],), 1e-6, dtype=torch.float64)
    for b in range(2):
        _inf_patterns(cert[batch.rows(b)], _spec(batch, b, sm=0.125, radius="min", delta_loc=dl).cert)
    c0 = cert[batch.rows(0)]
    assert torch.isinf(c0[:, 2:]).all() and torch.isfinite(c0[:, :2]).all()
    assert torch.isfinite(cert[batch.rows(1)]).all() and torch.isfinite(out).all()


@pytest.mark.parametrize("side", ["k", "v"])
def test_nonfinite_new_token_row_gives_inf_from_that_token_on_like_the_spec(side):
    batch = make_batch(prefix_lens=(9,), new_lens=(6,), hq=4, hkv=2, d=64, page=16, seed=2)
    getattr(batch, f"{side}_new")[2, 0, 7] = float("inf")  # new token 2, KV head 0
    out, _, cert = _native(batch, sm=0.125)
    dl = torch.full((6,), 1e-6, dtype=torch.float64)
    spec = _spec(batch, 0, sm=0.125, radius="min", delta_loc=dl)
    _inf_patterns(cert, spec.cert)
    assert torch.isinf(cert[2:, :2]).all() and torch.isfinite(cert[:2]).all()
    assert torch.isfinite(cert[:, 2:]).all() and torch.isfinite(out).all()
    torch.testing.assert_close(out, spec.out, rtol=2e-5, atol=2e-6)


def test_nonfinite_query_head_gets_inf_and_a_finite_output_like_the_spec():
    batch = make_batch(prefix_lens=(17,), new_lens=(5,), hq=6, hkv=2, d=64, page=16, seed=3)
    batch.q[1, 4, 7] = float("nan")
    batch.q[3, 0, 0] = float("-inf")
    out, _, cert = _native(batch, sm=0.125)
    dl = torch.full((5,), 1e-6, dtype=torch.float64)
    spec = _spec(batch, 0, sm=0.125, radius="min", delta_loc=dl)
    _inf_patterns(cert, spec.cert)
    assert int(torch.isinf(cert).sum()) == 2 and torch.isfinite(out).all()
    torch.testing.assert_close(out, spec.out, rtol=2e-5, atol=2e-6)


def test_threads_and_the_portable_build_give_the_same_bits():
    batch = make_batch(prefix_lens=(70, 3, 0), new_lens=(40, 20, 9), hq=8, hkv=2, d=64, page=16,
                       seed=5)
    one = _native(batch, sm=0.125)
    for kw in (dict(threads=3), dict(flags=PORTABLE)):
        other = _native(batch, sm=0.125, **kw)
        for a, b in zip(one, other):
            assert torch.equal(a, b), kw


@pytest.mark.parametrize("d,g", [(64, 16), (40, 8), (24, 8)])
@pytest.mark.parametrize("pool_read", [False, True])
def test_the_avx512_avx2_portable_and_uncached_builds_give_the_same_bits(d, g, pool_read):
    """The phases run 8-wide on a CPU with AVX-512, 4-wide otherwise (-DWCX_NO_WIDE keeps the
    AVX2 clone only); a sequence read by several items has its keys and values loaded once
    per call (-DWCX_KV_BUDGET=0: every item loads its own). Odd row counts (GQA 3), head
    dims off the 32-channel blocks, row lengths off the 16-token steps, sequences of two
    chunks (61 and 45 new tokens, 42 per item; the second a fresh prompt, prefix 0, whose
    new tokens are cached) next to one-chunk ones, a non-finite new key and
    query entry, every radius, causal or not (pool-read: causal); the logits and radii used
    too; two threads."""
    batch = make_batch(prefix_lens=(37, 0, 5, 0), new_lens=(61, 18, 7, 45), hq=6, hkv=2, d=d,
                       page=16, seed=11, group=g, pool_read=pool_read)
    batch.k_new[40, 1, 3] = float("inf")
    batch.q[9, 4, 1] = float("nan")
    builds = ((), ("-DWCX_NO_WIDE",), PORTABLE, ("-DWCX_KV_BUDGET=0",))
    for radius in ("min", "det", "prob"):
        for causal in ((True,) if pool_read else (True, False)):
            dbg = [{} for _ in builds]
            runs = [_native(batch, sm=0.3, radius=radius, causal=causal, flags=f, debug=dbg[i],
                            threads=1 + i % 2, pool_read=pool_read)
                    for i, f in enumerate(builds)]
            for other, od, f in zip(runs[1:], dbg[1:], builds[1:]):
                for a, b in zip(runs[0], other):
                    assert torch.equal(a, b), (radius, causal, f)
                for k in dbg[0]:
                    assert torch.equal(dbg[0][k].nan_to_num(7.0), od[k].nan_to_num(7.0)), (k, f)


def test_without_certificate_the_output_is_bitwise_the_certified_one():
    batch = make_batch(prefix_lens=(25,), new_lens=(11,), hq=4, hkv=1, d=64, page=16, seed=6)
    out, lse, cert = _native(batch, sm=0.125)
    out2, lse2, cert2 = _native(batch, sm=0.125, with_cert=False)
    assert cert2 is None and torch.equal(out, out2) and torch.equal(lse, lse2)


def test_bad_block_table_and_bad_budget_raise_instead_of_reading_out_of_bounds():
    batch = make_batch(prefix_lens=(20,), new_lens=(3,), hq=4, hkv=2, d=64, page=16, seed=7)
    batch.block_table[0, 0] = 10_000
    with pytest.raises(ValueError, match="slot outside"):
        _native(batch, sm=0.125)
    batch = make_batch(prefix_lens=(20,), new_lens=(3,), hq=4, hkv=2, d=64, page=16, seed=7)
    with pytest.raises(ValueError, match="delta_loc"):
        _native(batch, sm=0.125, delta_loc=torch.tensor([1e-6, 1.5, 1e-6], dtype=torch.float64))
    with pytest.raises(ValueError, match="out of range"):
        ne.extend_attention(batch.q, batch.k_new, batch.v_new, batch.layer, q_start=[1],
                            q_len=[3], prefix_len=[20], block_table=batch.block_table,
                            page_size=16, sm_scale=0.125, radius="det", delta_loc=None)


def test_extend_one_serves_a_slot_list_and_declines_outlier_pools():
    batch = make_batch(prefix_lens=(21,), new_lens=(6,), hq=4, hkv=2, d=64, page=16, seed=9)
    cert = CertConfig(radius="min")
    got = ne.extend_one(batch.q, batch.k_new, batch.v_new, batch.layer, batch.prefix_slots(0),
                        sm_scale=0.125, cert=cert, delta_loc=1e-6)
    out, lse, c = _native(batch, sm=0.125)
    assert torch.equal(got.out, out) and torch.equal(got.cert, c) and got.radius_kind == "min"
    idx = torch.stack([torch.arange(4) for _ in range(2)])
    quant = QuantConfig(outliers=2)
    lkv = LayerKV.allocate(num_slots=8, num_kv_heads=2, head_dim=64, quant=quant, layer=0, seed=1,
                           epochs=torch.zeros(8, dtype=torch.int64), k_outlier_idx=idx,
                           v_outlier_idx=idx)
    assert ne.extend_one(batch.q, batch.k_new, batch.v_new, lkv, torch.arange(4), sm_scale=0.125,
                         cert=cert, delta_loc=1e-6) is None


@pytest.mark.parametrize("flags", [(), PORTABLE])
def test_the_extend_exp_is_within_2_to_minus_45_relative_and_expm1_up_is_an_upper_bound(flags):
    mpmath = pytest.importorskip("mpmath")
    g = torch.Generator().manual_seed(0)
    ln2 = 0.6931471805599453
    x = torch.cat([-700 * torch.rand(4000, generator=g, dtype=torch.float64),
                   -torch.rand(2000, generator=g, dtype=torch.float64),
                   torch.tensor([0.0, -700.0, -0.3465, -0.3467, -1e-300]),
                   torch.arange(-1010, 1, dtype=torch.float64) * ln2 * 0.5])
    x = x[x >= -700]
    got = ne.probe("exp", x, extra_flags=flags)
    with mpmath.workdps(40):
        want = torch.tensor([float(mpmath.e ** mpmath.mpf(v)) for v in x.tolist()],
                            dtype=torch.float64)
    rel = ((got - want) / want).abs()
    assert rel.max().item() < 2.0**-45, (rel.max().item(), x[rel.argmax()].item())
    # the softmax's interleaved exp (and its AVX-512 instantiation where the CPU has one):
    # the same operations per element, so the same bits
    assert torch.equal(ne.probe("exp_n", x, extra_flags=flags), got)
    try:
        wide = ne.probe("exp_wide", x, extra_flags=flags)
    except ValueError:
        wide = None
    assert wide is None or torch.equal(wide, got)
    u = torch.cat([torch.rand(4000, generator=g, dtype=torch.float64) / 16,
                   torch.logspace(-300, -1.21, 500, dtype=torch.float64), torch.tensor([0.0])])
    up = ne.probe("expm1_up", u, extra_flags=flags)
    with mpmath.workdps(40):
        for ui, bi in zip(u.tolist(), up.tolist()):
            e = mpmath.expm1(mpmath.mpf(ui))
            assert mpmath.mpf(bi) >= e and mpmath.mpf(bi) <= e * (1 + mpmath.mpf(1e-6)), (ui, bi)
    # [1/16, 8): (exp(u) - 1)(1 + 2^-39), above expm1 and within 2^-37 of it; the edges and the
    # points where the range reduction's k changes
    v = torch.cat([1 / 16 + (8 - 1 / 16) * torch.rand(3000, generator=g, dtype=torch.float64),
                   torch.tensor([0.0625, 0.06250000000000001, 7.999999999999999, ln2, 2 * ln2]),
                   (torch.arange(1, 12, dtype=torch.float64) + 0.5) * ln2,
                   torch.arange(1, 12, dtype=torch.float64) * ln2 + 1e-12])
    up = ne.probe("expm1_up", v, extra_flags=flags)
    with mpmath.workdps(40):
        for vi, bi in zip(v.tolist(), up.tolist()):
            e = mpmath.expm1(mpmath.mpf(vi))
            assert mpmath.mpf(bi) >= e and mpmath.mpf(bi) <= e * (1 + mpmath.mpf(2) ** -37), (vi, bi)


# ---- pool-read extend: scheduling independence and the masked tail ----------------------

def test_pool_read_rows_do_not_depend_on_the_split_into_calls_bitwise():
    """40 pool tokens of one sequence read in one call (P=0, T=40), as a prefix hit (P=24,
    T=16) or in chunks, and beside another sequence: every row has the same bits."""
    base = make_batch(prefix_lens=(0, 7), new_lens=(40, 5), hq=6, hkv=2, d=64, page=16, seed=11,
                      key="position", pool_read=True)
    sm, N = 0.125, 40
    dl = torch.logspace(-9, -3, base.q.shape[0], dtype=torch.float64)
    whole = _native(base, sm=sm, delta_loc=dl, pool_read=True)
    bt = base.block_table[:1].contiguous()
    for cuts in ([0, 24, 40], [0, 1, 2, 39, 40], [0, 17, 18, 40]):
        got = [torch.empty(N, 6, 64), torch.empty(N, 6), torch.empty(N, 6)]
        for lo, hi in zip(cuts, cuts[1:]):  # one call per chunk, pool up to its last token
            o = ne.extend_attention(base.q[lo:hi], None, None, base.layer, q_start=[0],
                                    q_len=[hi - lo], prefix_len=[hi], block_table=bt, page_size=16,
                                    sm_scale=sm, radius="min", delta_loc=dl[lo:hi], pool_read=True)
            for g, x in zip(got, o):
                g[lo:hi] = x
        for g, w in zip(got, whole):
            assert torch.equal(g, w[:N]), cuts
    # the same chunks in one call of two sequences (B = 2, the same pages twice)
    bt2 = torch.cat([bt, bt]).contiguous()
    o = ne.extend_attention(base.q[:N], None, None, base.layer, q_start=[0, 24], q_len=[24, 16],
                            prefix_len=[24, 40], block_table=bt2, page_size=16, sm_scale=sm,
                            radius="min", delta_loc=dl[:N], pool_read=True)
    for g, w in zip(o, whole):
        assert torch.equal(g, w[:N])


def test_pool_read_flagged_tokens_in_the_masked_tail_touch_no_earlier_row_like_the_spec():
    batch = make_batch(prefix_lens=(10,), new_lens=(9,), hq=4, hkv=2, d=64, page=16, seed=12,
                       pool_read=True)
    k, v = batch.exact_prefix[0]
    k, v = k.clone(), v.clone()
    k[14, 1, 5] = float("nan")  # new token 4, KV head 1
    v[17, 0, 0] = float("inf")  # new token 7, KV head 0
    write_(batch.layer, k, v, slots=batch.prefix_slots(0))
    dl = torch.full((9,), 1e-6, dtype=torch.float64)
    out, lse, cert = _native(batch, sm=0.125, delta_loc=dl, pool_read=True)
    spec = _spec(batch, 0, sm=0.125, radius="min", delta_loc=dl, pool_read=True)
    _inf_patterns(cert, spec.cert)
    assert torch.isinf(cert[4:, 2:]).all() and torch.isfinite(cert[:4, 2:]).all()
    assert torch.isinf(cert[7:, :2]).all() and torch.isfinite(cert[:7, :2]).all()
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()
    torch.testing.assert_close(out, spec.out, rtol=2e-5, atol=2e-6)


def test_pool_read_threads_portable_build_and_bad_lengths():
    batch = make_batch(prefix_lens=(70, 3, 0), new_lens=(40, 20, 9), hq=8, hkv=2, d=64, page=16,
                       seed=5, pool_read=True)
    one = _native(batch, sm=0.125, pool_read=True)
    for kw in (dict(threads=3), dict(flags=PORTABLE)):
        other = _native(batch, sm=0.125, pool_read=True, **kw)
        for a, b in zip(one, other):
            assert torch.equal(a, b), kw
    with pytest.raises(ValueError, match="out of range"):  # the pool must hold the new tokens
        ne.extend_attention(batch.q, None, None, batch.layer, q_start=[0], q_len=[40],
                            prefix_len=[39], block_table=batch.block_table[:1].contiguous(),
                            page_size=16, sm_scale=0.125, radius="det", delta_loc=None,
                            pool_read=True)
    with pytest.raises(ValueError, match="causal"):
        _native(batch, sm=0.125, pool_read=True, causal=False)


# ---- the fp32 arithmetic at its edges -----------------------------------------------------

@pytest.mark.parametrize("pool_read", [False, True])
def test_f32_dots_hold_their_bound_at_underflow_overflow_and_cancellation(pool_read):
    """Heads whose fp32 products underflow (query and keys ~1e-20: products below the fp32
    normal range, covered by the model's abs_err), overflow (queries ~1e36: the fp32 dot is
    not finite and the token takes the float64 dot, the same logit as the f64 path), and
    cancel (keys orthogonal to the query up to rounding): every logit within the fp32 slack of
    ``sm q.k``, certificates never NaN or negative, and >= the exact TV where finite."""
    batch = make_batch(prefix_lens=(23, 0), new_lens=(9, 21), hq=6, hkv=3, d=64, page=16, seed=13,
                       pool_read=pool_read)
    q = batch.q
    q[:, 0] *= 1e-20                       # KV head 0, query head 0: underflowing products
    q[:, 5] *= 1e37                        # KV head 2, query head 5: overflowing fp32 dots
    k = batch.k_new.float()
    kv1, q2 = k[:, 1], q[:, 2]             # KV head 1, query head 2: cancelling dots
    for t in range(k.shape[0]):            # new key t orthogonal to query t (then rounded)
        kv1[t] = kv1[t] - (kv1[t] @ q2[t]) / (q2[t] @ q2[t]) * q2[t]
    k[:, 0] *= 1e-20
    k[:, 2] *= 1e3
    batch.k_new = k.to(batch.k_new.dtype)
    if pool_read:  # the new tokens' records were written from the old keys: write them again
        for b in range(2):
            kp, vp = batch.exact_prefix[b]
            r = batch.rows(b)
            kp = torch.cat([kp[:batch.prefix_len[b] - batch.q_len[b]], batch.k_new[r]])
            batch.exact_prefix[b] = (kp, vp)
            write_(batch.layer, kp, vp, slots=batch.prefix_slots(b))
    sm = 0.125
    dl = torch.full((q.shape[0],), 1e-6, dtype=torch.float64)
    dbg, dbg64 = {}, {}
    out, lse, cert = _native(batch, sm=sm, delta_loc=dl, debug=dbg, pool_read=pool_read)
    _native(batch, sm=sm, delta_loc=dl, debug=dbg64, pool_read=pool_read, arith="f64")
    assert not torch.isnan(cert).any() and (cert >= 0).all() and torch.isfinite(out).all()
    for b in range(2):
        r, Np, T = batch.rows(b), batch.prefix_len[b], batch.q_len[b]
        N = Np if pool_read else Np + T
        used = dbg["logits"][r][..., :N]
        assert torch.isfinite(torch.where(torch.isnan(used), 0.0, used)).all()
        _f32_slack_holds(batch, b, used, sm=sm, pool_read=pool_read)
        # where a product overflows fp32 the fp32 dot is not finite: the float64 dot was used
        keys = _used_keys(batch, b, pool_read)[:, 2]  # [N, D]
        prod = (q[r, 5].double()[:, None, :] * keys[None]).abs().amax(-1)  # [T, N]
        over = prod > 3.5e38
        if not pool_read or b == 1:
            assert over.any()
        assert torch.equal(used[:, 5][over].nan_to_num(7.0),  # NaN: keys a row does not see
                           dbg64["logits"][r][..., :N][:, 5][over].nan_to_num(7.0))
        c = cert[r]
        fin = torch.isfinite(c)
        fin[:, 5] = False  # logits ~1e37: the exact TV is out of the float64 checker's range
        tv = exact_tv(batch, b, used, torch.where(fin, c, 0.0), sm=sm, pool_read=pool_read)
        assert (c.double()[fin] >= tv[fin]).all()


def _row_radius_of_new_tokens(batch, b, *, sm, model, causal):
    """docs/PROOFS.md 5.3: the one radius of a row's exact new tokens, f64 [T, Hq]:
    ``rel_s sm ||q|| max_j ||k_j|| + abs + E`` over the row's live new keys (causal: j <= i)."""
    hq, hkv = batch.q.shape[1], batch.k_new.shape[1]
    kvh = torch.arange(hq) // (hq // hkv)
    r = batch.rows(b)
    kn = batch.k_new[r].double().norm(dim=-1)[:, kvh]  # [T, Hq]
    kmax = kn.cummax(dim=0).values if causal else kn.amax(0, keepdim=True).expand_as(kn)
    qn = batch.q[r].double().norm(dim=-1)
    return model.rel_s * sm * qn * kmax + model.abs_err + model.softmax


@pytest.mark.parametrize("arith_mode", ["f64", "f32"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("large", [False, True])  # radii above 1/16: the per-token route
def test_exact_new_tokens_share_one_radius_per_row_and_stay_sound(arith_mode, causal, large):
    """A row's exact new tokens take one radius, from the largest norm of its live new keys
    (docs/PROOFS.md 5.3): every new token's debug radius is that value rounded up to fp32 (one
    long key raises it for the rows that see it); a fresh prompt's certificate is then
    ``expm1(u)`` up to the sums' slack; with a prefix the rows stay sound against the exact TV.
    ``large`` scales the queries until the radii exceed 1/16 (the route that takes them token
    by token)."""
    batch = make_batch(prefix_lens=(0, 23), new_lens=(37, 19), hq=6, hkv=2, d=64, page=16,
                       seed=21)
    batch.k_new[5] *= 6  # sequence 0's token 5: causal rows from 5 on see a longer key
    if large:
        batch.q.mul_(3e4 if arith_mode == "f32" else 3e12)
    sm = 0.125
    model = arith.native_f32_model(64) if arith_mode == "f32" else arith.native_model(64)
    dbg = {}
    out, _, cert = _native(batch, sm=sm, causal=causal, debug=dbg, arith=arith_mode)
    assert torch.isfinite(out).all()
    for b in range(2):
        r, Np, T = batch.rows(b), batch.prefix_len[b], batch.q_len[b]
        want = _row_radius_of_new_tokens(batch, b, sm=sm, model=model, causal=causal)
        rad = dbg["radius"][r][..., Np:Np + T].double()  # [T, Hq, new keys]
        for t in range(T):
            live = t + 1 if causal else T
            got = rad[t, :, :live]
            assert (got == got[:, :1]).all(), f"b={b} t={t}: one radius per row"
            assert (got[:, 0] >= want[t]).all() and (got[:, 0] <= want[t] * (1 + 2**-22)).all()
        used = dbg["logits"][r][..., :Np + T]
        assert (cert[r].double() >= exact_tv(batch, b, used, cert[r], sm=sm, causal=causal)).all()
        if Np == 0:  # every token new: the certificate is expm1 of the row's radius
            e = torch.expm1(want)
            c = cert[r].double()
            assert (c >= e).all() and (c <= e * (1 + 1e-6) + 1e-300).all()
    if large:  # the case really took the per-token route
        assert (_row_radius_of_new_tokens(batch, 0, sm=sm, model=model, causal=causal)
                >= 1 / 16).any()


def test_new_tokens_far_below_a_prefix_token_keep_a_sound_certificate():
    """A prefix key whose logit is ~675 above every new token's: their weights fall in
    (0, 1e-290], where the new tokens' share is bounded by 1e-291 instead of a product below
    the normal range (docs/PROOFS.md 5.3). The certificate is finite, not NaN, and above the
    exact TV."""
    batch = make_batch(prefix_lens=(12,), new_lens=(9,), hq=4, hkv=2, d=64, page=16, seed=4)
    k, v = batch.exact_prefix[0]
    k = k.clone()
    k[3, 0] = 0
    k[3, 0, 0] = 60000.0
    write_(batch.layer, k, v, slots=batch.prefix_slots(0))
    batch.exact_prefix[0] = (k, v)
    batch.q[:, :2] = 0.0
    batch.q[:, :2, 0] = 0.09  # KV head 0's query heads: logit 0.125 * 0.09 * 60000 = 675 on key 3
    batch.k_new[:, 0, 0] = 0.0
    dbg = {}
    out, _, cert = _native(batch, sm=0.125, debug=dbg)
    used = dbg["logits"][..., :21]
    w = torch.softmax(used[:, :2], dim=-1)[..., 12:]  # the new tokens' weights, heads 0-1
    assert ((w > 0) & (w.sum(-1, keepdim=True) <= 1e-290)).any()
    assert torch.isfinite(cert).all() and torch.isfinite(out).all()
    assert (cert.double() >= exact_tv(batch, 0, used, cert, sm=0.125)).all()
