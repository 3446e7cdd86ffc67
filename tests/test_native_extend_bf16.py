"""The native C extend's bf16-pair dots of the exact new tokens (AVX512-BF16 ``vdpbf16ps``;
``witcert.ref.arith.native_bf16_model``, docs/PROOFS.md 5.3).

What is checked (the dots): the route is taken exactly where its conditions hold (the CPU, the fp32
arithmetic, ``sm <= 2^16``, every query of a work item and key of a 16-token tile a bf16 number
without subnormals) and otherwise the fp32 dots run, bit for bit; where taken, every logit is
bitwise the sequence the model describes (four fp32 partial sums of pairs, odd product then
even, combined as a tree, then ``fl64(sm dot)``), within ``native_bf16_model``'s slack of the
exact ``sm q.k`` at adversarial magnitudes (cancellation, products that flush, sums that
overflow), and the certificate is at least the exact TV. The value pass of the same items (bf16 weights times
bf16 values, ``accumulatebf_rows``): bitwise its model through the probe, at adversarial
magnitudes; taken only where its conditions hold (else the fp32 pass, bit for bit); it moves
nothing but the output, which stays within the route's float tier. Skipped without the native library;
the route's own checks are skipped (with the reason) on CPUs without AVX512-BF16.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from extend_cases import exact_tv, make_batch
from witcert import native
from witcert.native import extend as ne
from witcert.ref import arith


@pytest.fixture(autouse=True, scope="module")
def _needs_native():
    if not native.available():
        pytest.skip(f"native library unavailable: {native.reason()}")


def _route():
    if not ne.bf16_route():
        pytest.skip("this CPU (or build) has no AVX512-BF16: the bf16 dots never run here")


def _batch(*, d=64, hq=8, hkv=2, prefix_lens=(0, 24), new_lens=(100, 70), seed=5, q=None,
           k=None):
    """A batch whose queries and new keys are bf16 numbers (make_batch's K/V are bf16; its
    fp32 queries rounded to bf16). 100 / 70 new tokens at GQA 4: several work items per
    sequence, so the call caches the new keys (the route reads the cached pairs)."""
    b = make_batch(prefix_lens=prefix_lens, new_lens=new_lens, hq=hq, hkv=hkv, d=d, page=16,
                   bits=16, seed=seed)
    return dataclasses.replace(b, q=(b.q if q is None else q).bfloat16().float(),
                               k_new=b.k_new if k is None else k.bfloat16())


def _run(batch, *, sm, bf16, debug=None, with_cert=True, flags=()):
    rows = batch.q.shape[0]
    return ne.extend_attention(batch.q, batch.k_new, batch.v_new, batch.layer,
                               q_start=batch.q_start, q_len=batch.q_len,
                               prefix_len=batch.prefix_len, block_table=batch.block_table,
                               page_size=batch.page, sm_scale=sm, radius="min",
                               delta_loc=torch.full((rows,), 1e-6, dtype=torch.float64),
                               debug=debug, with_cert=with_cert, arith="f32", bf16_dots=bf16,
                               _extra_flags=flags)


def _emulated(q, k, sm):
    """The model's logits f64 [T, Hq, N] of q f32 [T, Hq, D] (bf16 numbers) against k [N, Hkv, D]:
    partial j sums the pairs c = j, j + 4, ... from +0 in fp32, each adding q_{2c+1} k_{2c+1}
    then q_{2c} k_{2c} (products of bf16 numbers: exact in fp32), the partials as (s0 + s1) +
    (s2 + s3), the logit fl64(sm dot). (No flush here: the cases keep every product and partial
    sum in the normal range.)"""
    hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
    kk = k.float()[:, torch.arange(hq) // (hq // hkv)].transpose(0, 1)  # [Hq, N, D]
    p = q[:, :, None, :] * kk[None]  # [T, Hq, N, D], exact
    s = []
    for j in range(4):
        acc = torch.zeros(p.shape[:-1], dtype=torch.float32)
        for c in range(j, d // 2, 4):
            acc = acc + p[..., 2 * c + 1]
            acc = acc + p[..., 2 * c]
        s.append(acc)
    return sm * ((s[0] + s[1]) + (s[2] + s[3])).double()


def _new_logits(batch, b, dbg):
    """The logits the C code used for sequence b's new keys, f64 [T, Hq, T] (NaN: not live)."""
    r, np_, t = batch.rows(b), batch.prefix_len[b], batch.q_len[b]
    return dbg["logits"][r][..., np_:np_ + t]


def _causal(t):
    return torch.arange(t)[None, :] <= torch.arange(t)[:, None]  # [row token, key]


@pytest.mark.parametrize("d", [64, 128])
def test_the_bf16_dots_are_bitwise_the_model_and_only_on_the_new_tokens(d):
    _route()
    batch = _batch(d=d)
    sm = d ** -0.5
    on, off = {}, {}
    _run(batch, sm=sm, bf16=True, debug=on)
    _run(batch, sm=sm, bf16=False, debug=off)
    differ = False
    for b in range(len(batch.q_len)):
        r, np_, t = batch.rows(b), batch.prefix_len[b], batch.q_len[b]
        got, fp32 = _new_logits(batch, b, on), _new_logits(batch, b, off)
        want = _emulated(batch.q[r], batch.k_new[r], sm)
        live = _causal(t)[:, None, :].expand_as(got)
        assert torch.equal(got[live], want[live]), (got[live] - want[live]).abs().max()
        differ |= not torch.equal(got[live], fp32[live])
        # the prefix (stored) keys keep the fp32 dots
        assert torch.equal(on["logits"][r][..., :np_], off["logits"][r][..., :np_])
    assert differ, "the fp32 dots gave the same bits everywhere: the route was not exercised"


def test_the_route_is_refused_where_an_operand_is_not_a_bf16_number_or_the_scale_is_large():
    _route()
    base = _batch()
    sm = 0.125
    # a subnormal (for bf16) key in tile 2 of sequence 0: that tile takes the fp32 dots
    k = base.k_new.float().clone()
    k[base.q_start[0] + 37, 1, 5] = 2.0**-130
    sub_k = dataclasses.replace(base, k_new=k.bfloat16())
    # a query that is not a bf16 number: its item takes the fp32 dots
    q = base.q.clone()
    q[base.q_start[1] + 3, 0, 7] = 1.0 + 2.0**-12
    not_bf16_q = dataclasses.replace(base, q=q)
    for batch, s in ((sub_k, sm), (not_bf16_q, sm), (base, 2.0**16 * 1.5)):
        on, off = {}, {}
        _run(batch, sm=s, bf16=True, debug=on)
        _run(batch, sm=s, bf16=False, debug=off)
        for b in range(len(batch.q_len)):
            r, t = batch.rows(b), batch.q_len[b]
            got, fp32 = _new_logits(batch, b, on), _new_logits(batch, b, off)
            want = _emulated(batch.q[r], batch.k_new[r], s)
            live = _causal(t)[:, None, :].expand_as(got)
            if s > 2.0**16:  # the scale: every dot fp32
                assert torch.equal(got[live], fp32[live])
                continue
            heads = torch.zeros(8, dtype=torch.bool)
            if batch is sub_k and b == 0:  # KV head 1's tile 2 (keys 32..47): fp32
                tile = torch.zeros(t, dtype=torch.bool)
                tile[32:48] = True
                heads[4:] = True
                m2 = live & tile[None, None, :] & heads[None, :, None]
                assert torch.equal(got[m2], fp32[m2])
                assert torch.equal(got[live & ~m2], want[live & ~m2])
            elif batch is not_bf16_q and b == 1:  # row 3's item: tokens 0..23 at KV head 0
                items = torch.zeros(t, dtype=torch.bool)
                items[:24] = True  # 70 tokens in 3 even chunks of at most 32 (GQA 4: 128 rows)
                heads[:4] = True
                m2 = live & items[:, None, None] & heads[None, :, None]
                assert torch.equal(got[m2], fp32[m2])
                assert torch.equal(got[live & ~m2], want[live & ~m2])
            else:
                assert torch.equal(got[live], want[live])


def _adversarial(kind, gen, t, hq, hkv, d):
    """Queries and keys (bf16 numbers) of one family, f32 [t, Hq, D] and [t, Hkv, D]."""
    q = torch.randn(t, hq, d, generator=gen)
    k = torch.randn(t, hkv, d, generator=gen)
    if kind == "cancel":  # huge products that cancel, small ones that decide the logit
        q[..., :8] = 2.0**20 * torch.sign(q[..., :8])
        k[..., :8] = torch.sign(k[..., :8]) * 2.0**20
        k[..., 4:8] = -k[..., :4]  # pairs of +-2^40 products
        q[..., 4:8] = q[..., :4]
    elif kind == "flush":  # products near and below 2^-126: some flush to 0
        q = q * 2.0**-60
        k = k * 2.0**-66
        q[..., :4] = 2.0**10  # and a few normal products on top
    elif kind == "huge":  # partial sums near 2^128: some overflow, the float64 dot takes over
        q = q * 2.0**60
        k = k * 2.0**66
    elif kind == "peaked":  # logits in the hundreds: one key takes the weight
        q = q * 8.0
        k = k * 8.0
    return q.bfloat16().float(), k.bfloat16()


@pytest.mark.parametrize("kind", ["cancel", "flush", "huge", "peaked", "plain"])
@pytest.mark.parametrize("sm", [0.125, 2.0**-40, 2.0**16])
def test_the_bf16_dots_stay_within_their_slack_and_the_certificate_covers_the_exact_tv(kind, sm):
    _route()
    gen = torch.Generator().manual_seed(["cancel", "flush", "huge", "peaked", "plain"].index(kind))
    hq, hkv, d, t = 8, 2, 64, 80
    base = make_batch(prefix_lens=(0, 20), new_lens=(t, t), hq=hq, hkv=hkv, d=d, page=16,
                      bits=16, seed=11)
    q = base.q.clone()
    k = base.k_new.float().clone()
    for b in range(2):
        r = base.rows(b)
        q[r], k[r] = _adversarial(kind, gen, t, hq, hkv, d)
    batch = dataclasses.replace(base, q=q.bfloat16().float(), k_new=k.bfloat16())
    dbg = {}
    _, _, cert = _run(batch, sm=sm, bf16=True, debug=dbg)
    m = arith.native_bf16_model(d)
    kvh = torch.arange(hq) // (hq // hkv)
    for b in range(2):
        r, np_ = batch.rows(b), batch.prefix_len[b]
        used = dbg["logits"][r][..., :np_ + t]
        qq = batch.q[r].double()
        kk = batch.k_new[r].double()[:, kvh]
        z = sm * torch.einsum("thd,nhd->thn", qq, kk)
        s_ = torch.einsum("thd,nhd->thn", qq.abs(), kk.abs())
        got = used[..., np_:]
        live = _causal(t)[:, None, :].expand_as(got)
        err = (got - z).abs()
        slack = m.rel_s * sm * s_ + m.abs_err
        assert torch.isfinite(got[live]).all()
        assert (err[live] <= slack[live]).all(), (err[live] / slack[live]).max()
        c = cert[r]
        assert (c >= 0).all() and not torch.isnan(c).any()
        tv = exact_tv(batch, b, used, c, sm=sm)
        assert (c.double() >= tv).all(), (c, tv)


def test_the_rows_that_take_the_bf16_dots_carry_the_larger_slack():
    _route()
    batch = _batch()
    on, off = {}, {}
    _, _, c_on = _run(batch, sm=0.125, bf16=True, debug=on)
    _, _, c_off = _run(batch, sm=0.125, bf16=False, debug=off)
    ratio = arith.native_bf16_model(64).rel_s / arith.native_f32_model(64).rel_s
    for b in range(2):
        r, np_, t = batch.rows(b), batch.prefix_len[b], batch.q_len[b]
        ron = on["radius"][r][..., np_:np_ + t].double()
        roff = off["radius"][r][..., np_:np_ + t].double()
        live = _causal(t)[:, None, :].expand_as(ron)
        assert (ron[live] >= roff[live]).all()
        if np_ == 0:  # a fresh prompt: the slack is the whole radius, larger by the ratio
            q = (ron[live] / roff[live])
            assert (q >= ratio * (1 - 1e-5)).all() and (q <= ratio * (1 + 1e-5)).all(), q
            assert (c_on[r] > c_off[r]).all()


def test_the_environment_switches_the_route_and_a_bad_value_is_a_one_line_error(monkeypatch):
    """WITCERT_NATIVE_EXTEND_BF16: on (default, unset or empty) / off; anything else a
    ValueError naming the variable, from the setting and from an extend call that reads it.
    With off the extend gives the fp32 dots' bits (bf16_dots=False's)."""
    from witcert.settings import ENV_NATIVE_EXTEND_BF16, native_extend_bf16
    monkeypatch.delenv(ENV_NATIVE_EXTEND_BF16, raising=False)
    assert native_extend_bf16() is True
    monkeypatch.setenv(ENV_NATIVE_EXTEND_BF16, " OFF ")
    assert native_extend_bf16() is False
    batch = _batch(new_lens=(40, 3), prefix_lens=(0, 5))
    got, want = {}, {}
    _run(batch, sm=0.125, bf16=None, debug=got)
    _run(batch, sm=0.125, bf16=False, debug=want)
    assert torch.equal(got["logits"].nan_to_num(7.0), want["logits"].nan_to_num(7.0))
    monkeypatch.setenv(ENV_NATIVE_EXTEND_BF16, "yes")
    with pytest.raises(ValueError, match=ENV_NATIVE_EXTEND_BF16):
        native_extend_bf16()
    with pytest.raises(ValueError, match=ENV_NATIVE_EXTEND_BF16):
        _run(batch, sm=0.125, bf16=None)


# --- the value pass (accumulatebf_rows; docs/PROOFS.md 5.3) ---------------------------------

_TINY = 2.0 ** -126
_NO_BFV = ("-DWCX_NO_BFV",)  # a build without the value route (the fp32 value pass)


def _ftz(x):
    return torch.where(x.abs() < _TINY, torch.zeros_like(x), x)


def _bfv_model(z, last, v, acc):
    """The route's model, f64 [rows, D]: acc plus, per row, the weights fl32(z) rounded to bf16
    (RNE; an fp32 weight below 2^-126 reads as 0; past last[r] 0), per channel fp32 sums from +0
    over chunks of 128 tokens, each token pair adding w_{2i+1} v_{2i+1} then w_{2i} v_{2i}
    (products exact, each result rounded and flushed below 2^-126), each chunk's sum added to
    acc in float64. Rows go in pairs: a pair runs the chunks of its longer row (the shorter one
    adds +0 there)."""
    rows, n = z.shape
    w = z.float()
    w = torch.where(w.abs() < _TINY, torch.zeros_like(w), w).bfloat16().float()
    w = torch.where(torch.arange(n)[None, :] < last[:, None], w, torch.zeros_like(w))
    w = torch.cat([w, torch.zeros(rows, v.shape[0] - n)], 1)
    out = acc.clone()
    for r in range(0, rows, 2):
        pair = [r, r + 1] if r + 1 < rows else [r]
        tiles = -(-max(int(last[i]) for i in pair) // 16)
        for c0 in range(0, tiles * 16, 128):
            for i in pair:
                x = torch.zeros(v.shape[1], dtype=torch.float32)
                for t in range(c0, min(c0 + 128, tiles * 16), 2):
                    x = _ftz(x + _ftz(w[i, t + 1] * v[t + 1]))
                    x = _ftz(x + _ftz(w[i, t] * v[t]))
                out[i] += x.double()
    return out


@pytest.mark.parametrize("kind", ["plain", "tiny", "peaked", "huge", "cancel"])
@pytest.mark.parametrize("rows,n,d", [(5, 37, 64), (4, 300, 128), (3, 16, 16), (2, 1, 48),
                                      (1, 129, 32)])
def test_the_bf16_value_pass_is_bitwise_its_model(kind, rows, n, d):
    _route()
    g = torch.Generator().manual_seed(rows * 1000 + n + d)
    z = torch.rand(rows, n, generator=g, dtype=torch.float64)
    v = torch.randn(-(-n // 16) * 16, d, generator=g)
    if kind == "tiny":  # weights in and below fp32's subnormal range: read as 0
        z[:, ::3] *= 2.0 ** -125 * torch.rand(rows, len(range(0, n, 3)), generator=g,
                                               dtype=torch.float64)
        v = v.sign() * (1.0 + v.abs())  # products of the normal weights stay normal
    elif kind == "peaked":  # one weight 1, the others far below it
        z = torch.exp(-40.0 * torch.rand(rows, n, generator=g, dtype=torch.float64))
        z[:, n // 2] = 1.0
    elif kind == "huge":  # values near the top of the range (no overflow: sums stay finite)
        v = v * 2.0 ** 100
    elif kind == "cancel":  # large values of both signs that cancel in the sums
        v[::2] = 2.0 ** 20 * v[::2].sign()
        v[1::2] = -v[::2][: v[1::2].shape[0]]
    v = v.bfloat16().float()
    last = torch.randint(0, n + 1, (rows,), generator=g)
    last[0] = n
    acc = torch.randn(rows, d, generator=g, dtype=torch.float64)
    got = ne.probe_bf16_values(z, last, v, acc)
    want = _bfv_model(z, last, v, acc)
    assert torch.equal(got, want), (got - want).abs().max()


def test_the_bf16_value_probe_refuses_values_that_are_not_bf16_numbers():
    _route()
    z = torch.rand(2, 20, dtype=torch.float64)
    v = torch.randn(32, 64).bfloat16().float()
    v[5, 3] = 1.0 + 2.0 ** -12
    with pytest.raises(ValueError, match="witcert native probe"):
        ne.probe_bf16_values(z, torch.tensor([20, 20]), v, torch.zeros(2, 64, dtype=torch.float64))
    v[5, 3] = 2.0 ** -130  # a subnormal: the instruction would read it as 0
    with pytest.raises(ValueError, match="witcert native probe"):
        ne.probe_bf16_values(z, torch.tensor([20, 20]), v, torch.zeros(2, 64, dtype=torch.float64))


def _tier(batch, b, used, out, np_):
    """The route's float tier (docs/PROOFS.md 5.3): |out - sum_t p_t v_t| <= 2^-8 sum_t p_t |v_t|
    (+ the fp32 rounding of out) with p the float64 softmax of the logits the C code used and
    v the values it read (the stored prefix, then the exact new tokens)."""
    hq, hkv = batch.q.shape[1], batch.k_new.shape[1]
    kvh = torch.arange(hq) // (hq // hkv)
    vp = batch.stored_prefix(b)[1].double()
    vn = batch.v_new[batch.rows(b)].double()
    v = torch.cat([vp, vn])[:, kvh]  # [N, Hq, D]
    p = torch.softmax(used.nan_to_num(float("-inf")), -1)  # [T, Hq, N]
    want = torch.einsum("thn,nhd->thd", p, v)
    bound = torch.einsum("thn,nhd->thd", p, v.abs())
    err = (out.double() - want).abs()
    assert (err <= 2.0 ** -8 * bound + 2.0 ** -23 * want.abs() + 1e-30).all(), \
        (err / (bound + 1e-30)).max()
    return (err / (bound + 1e-30)).max().item()


def test_the_bf16_value_pass_moves_only_the_output_and_stays_in_its_tier():
    """A bf16 batch (several items per sequence: the call caches the new tokens): against the
    build without the value route, the logits, lse and certificates are bitwise equal, the
    output differs (the route ran) and stays within the route's tier; fp32 queries (the dots'
    route refused) leave the fp32 value pass, bit for bit."""
    _route()
    batch = _batch(d=64)
    on, off = {}, {}
    out1, lse1, c1 = _run(batch, sm=0.125, bf16=True, debug=on)
    out0, lse0, c0 = _run(batch, sm=0.125, bf16=True, debug=off, flags=_NO_BFV)
    assert torch.equal(on["logits"].nan_to_num(7.0), off["logits"].nan_to_num(7.0))
    assert torch.equal(lse1, lse0) and torch.equal(c1, c0)
    assert not torch.equal(out1, out0)
    worst = 0.0
    for b in range(2):
        r, np_, t = batch.rows(b), batch.prefix_len[b], batch.q_len[b]
        worst = max(worst, _tier(batch, b, on["logits"][r][..., :np_ + t], out1[r], np_))
    assert worst > 2.0 ** -16, worst  # the bf16 weights' rounding is visible
    q = batch.q.clone()
    q[0, 0, 0] = 1.0 + 2.0 ** -12  # not a bf16 number: sequence 0's first item, KV head 0
    nb = dataclasses.replace(batch, q=q)
    a1 = _run(nb, sm=0.125, bf16=True)[0]
    a0 = _run(nb, sm=0.125, bf16=True, flags=_NO_BFV)[0]
    rows0 = batch.rows(0)
    # that item (100 tokens in 4 even chunks of at most 32: tokens 0..24): fp32, bit for bit
    assert torch.equal(a1[rows0][:25, :4], a0[rows0][:25, :4])
    assert not torch.equal(a1[rows0][25:, :4], a0[rows0][25:, :4])
    assert not torch.equal(a1, a0)  # the other items kept the route


def test_a_value_that_is_not_a_bf16_number_sends_its_items_to_the_fp32_pass():
    """A non-bf16 value in new token 0 of sequence 0 at KV head 1: every item of that
    (sequence, KV head) reads its tile, so those rows give the fp32 pass's bits; KV head 0's
    rows keep the route."""
    _route()
    batch = _batch(d=64)
    v = batch.v_new.float().clone()
    v[batch.q_start[0], 1, 9] = 1.0 + 2.0 ** -12
    nb = dataclasses.replace(batch, v_new=v)
    a1 = _run(nb, sm=0.125, bf16=True)[0]
    a0 = _run(nb, sm=0.125, bf16=True, flags=_NO_BFV)[0]
    r0 = batch.rows(0)
    assert torch.equal(a1[r0][:, 4:], a0[r0][:, 4:])
    assert not torch.equal(a1[r0][:, :4], a0[r0][:, :4])
