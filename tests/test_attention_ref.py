"""Reference decode/extend attention over the paged pool: the oracle the kernels are tested against."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from witcert.config import CertConfig, QuantConfig
from witcert.ref.attention import decode_attention, exact_attention, extend_attention
from witcert.ref.cert import tv_distance
from witcert.ref.pool import LayerKV, bytes_allocated, gather, write_
from witcert.ref.types import K_SIDE, V_SIDE, EncodeCtx

F64 = torch.float64
LENS = (1, 15, 16, 17, 97)
MATRIX = list(itertools.product((1, 3, 4, 7), (64, 128), (1, 16)))  # GQA ratio, D, page size


def _setup(*, ratio, D, P, lens=LENS, method="dither8", Hkv=2, seed=0):
    """A pool holding len(lens) sequences on shuffled pages; exact K/V kept for checks."""
    gen = torch.Generator().manual_seed(seed)
    pages = [-(-n // P) for n in lens]
    num_pages = sum(pages) + 3
    perm = torch.randperm(num_pages, generator=gen)
    table = torch.zeros(len(lens), max(pages), dtype=torch.int32)
    epochs = torch.randint(0, 5, (num_pages * P,), generator=gen, dtype=torch.int64)
    layer = LayerKV.allocate(num_slots=num_pages * P, num_kv_heads=Hkv, head_dim=D,
                             quant=QuantConfig(method=method), layer=3, seed=1234 + seed, epochs=epochs)
    seqs, used = [], 0
    for b, n in enumerate(lens):
        table[b, :pages[b]] = perm[used:used + pages[b]].to(torch.int32)
        used += pages[b]
        t = torch.arange(n)
        slots = table[b].long()[t // P] * P + t % P  # DESIGN slot formula, written independently
        k = (torch.randn(n, Hkv, D, generator=gen) * 2).half()
        v = torch.randn(n, Hkv, D, generator=gen).half()
        write_(layer, k, v, slots=slots)
        seqs.append((slots, k, v))
    q = torch.randn(len(lens), ratio * Hkv, D, generator=gen)
    return layer, table, torch.tensor(lens, dtype=torch.int32), q, seqs


def _decode(layer, table, lens, q, *, P, splits=1, cert=CertConfig(radius="det"), **kw):
    return decode_attention(q, layer, table, lens, page_size=P, sm_scale=q.shape[-1] ** -0.5,
                            cert=cert, delta_loc=1e-4, num_splits=splits, **kw)


@pytest.mark.parametrize("ratio,D,P", MATRIX)
def test_output_lse_and_cert_do_not_depend_on_the_split_count(ratio, D, P):
    layer, table, lens, q, _ = _setup(ratio=ratio, D=D, P=P)
    ref = _decode(layer, table, lens, q, P=P, cert=CertConfig())
    for s in (2, 3, 7):
        got = _decode(layer, table, lens, q, P=P, splits=s, cert=CertConfig())
        for name in ("out", "lse", "cert", "vbound"):
            assert torch.allclose(getattr(got, name), getattr(ref, name), rtol=2e-5, atol=2e-6), (name, s)


@pytest.mark.parametrize("ratio,D,P", MATRIX)
def test_output_error_is_within_twice_plain_torch_fp32_error(ratio, D, P):
    layer, table, lens, q, seqs = _setup(ratio=ratio, D=D, P=P, seed=1)
    got = _decode(layer, table, lens, q, P=P, splits=3)
    sm = D ** -0.5
    for b, (slots, _, _) in enumerate(seqs):
        kh, vh = gather(layer, K_SIDE, slots)[0], gather(layer, V_SIDE, slots)[0]
        out64, p64 = exact_attention(q[b], kh, vh, sm_scale=sm, return_probs=True)
        kvh = torch.arange(q.shape[1]) // ratio
        plain = torch.softmax(sm * torch.einsum("hd,nhd->hn", q[b], kh[:, kvh]), -1)
        plain = torch.einsum("hn,nhd->hd", plain, vh[:, kvh])
        plain_err = (plain.double() - out64).abs().max()
        assert (got.out[b].double() - out64).abs().max() <= 2 * plain_err + 1e-6
        lse64 = torch.logsumexp(sm * torch.einsum("hd,nhd->hn", q[b].double(), kh.double()[:, kvh]), -1)
        assert torch.allclose(got.lse[b].double(), lse64, atol=1e-5)


def _true_tv_and_err(layer, q, seqs, ratio, b):
    """Float64 TV between exact-key and stored-key attention, and ||o - o^|| (exact vs stored K/V)."""
    slots, k, v = seqs[b]
    sm = q.shape[-1] ** -0.5
    kh, vh = gather(layer, K_SIDE, slots)[0], gather(layer, V_SIDE, slots)[0]
    o, p = exact_attention(q[b], k, v, sm_scale=sm, return_probs=True)
    oh, ph = exact_attention(q[b], kh, vh, sm_scale=sm, return_probs=True)
    return tv_distance(p, ph), torch.linalg.vector_norm(o - oh, dim=-1)


@pytest.mark.parametrize("ratio,D,P", MATRIX)
@pytest.mark.parametrize("radius", ["det", "min"])
def test_cert_and_value_bound_dominate_the_true_errors(ratio, D, P, radius):
    layer, table, lens, q, seqs = _setup(ratio=ratio, D=D, P=P, seed=2)
    got = _decode(layer, table, lens, q, P=P, splits=2, cert=CertConfig(radius=radius))
    assert got.radius_kind == radius and bool(torch.isfinite(got.cert).all())
    for b in range(len(LENS)):
        tv, err = _true_tv_and_err(layer, q, seqs, ratio, b)
        assert bool((got.cert[b].double() >= tv).all()), (b, got.cert[b], tv)
        assert bool((got.vbound[b].double() >= err).all()), (b, got.vbound[b], err)


@pytest.mark.parametrize("method", ["rtn8", "rtn4", "fp8", "sr8"])
def test_cert_dominates_true_tv_for_baseline_compressors(method):
    layer, table, lens, q, seqs = _setup(ratio=4, D=64, P=16, method=method, seed=3)
    got = _decode(layer, table, lens, q, P=16, splits=3)
    for b in range(len(LENS)):
        tv, err = _true_tv_and_err(layer, q, seqs, 4, b)
        assert bool((got.cert[b].double() >= tv).all()) and bool((got.vbound[b].double() >= err).all())
    with pytest.raises(ValueError, match="dither"):
        _decode(layer, table, lens, q, P=16, cert=CertConfig(radius="prob"))


def _rewrite(layer, seqs, b, *, side, value):
    """Overwrite token 5 of sequence b, KV head 1, with one non-finite entry."""
    slots, k, v = seqs[b]
    k2, v2 = k.clone(), v.clone()
    (k2 if side == K_SIDE else v2)[5, 1, 3] = value
    write_(layer, k2, v2, slots=slots)


@pytest.mark.parametrize("side,value", [(K_SIDE, math.nan), (V_SIDE, math.nan), (K_SIDE, math.inf)])
def test_non_finite_kv_makes_cert_inf_for_exactly_that_group(side, value):
    ratio = 3
    layer, table, lens, q, seqs = _setup(ratio=ratio, D=64, P=16, seed=4)
    clean = _decode(layer, table, lens, q, P=16, splits=2, cert=CertConfig(radius="min"))
    _rewrite(layer, seqs, 4, side=side, value=value)
    bad = _decode(layer, table, lens, q, P=16, splits=2, cert=CertConfig(radius="min"))
    hit = torch.zeros_like(clean.cert, dtype=torch.bool)
    hit[4, ratio:2 * ratio] = True  # query heads of KV head 1, sequence 4
    assert bool((bad.cert[hit] == math.inf).all())
    # a flagged V token leaves ||o - o^|| unbounded; a flagged K token only costs TV <= 1
    if side == V_SIDE:
        assert bool((bad.vbound[hit] == math.inf).all())
    else:
        assert bool(torch.isfinite(bad.vbound[hit]).all()) and bool((bad.vbound[hit] > clean.vbound[hit]).all())
    assert torch.equal(bad.cert[~hit], clean.cert[~hit]) and torch.equal(bad.out[:4], clean.out[:4])
    assert torch.equal(bad.out[4, :ratio], clean.out[4, :ratio])
    assert bool(torch.isfinite(bad.out).all()) and bool(torch.isfinite(bad.lse).all())


def test_key_with_overflowed_witness_but_finite_scale_gets_inf_cert():
    """A group of +-8e6 has a finite fp16 scale but a witness above 65504 (+inf): the key
    is flagged and read as 0, so only u = +inf is sound; the scale-only u_prob would
    survive radius "min" and certify a TV that is really ~0.04 (regression: the reference
    once kept it, found by the native CPU path's tests)."""
    layer = LayerKV.allocate(num_slots=16, num_kv_heads=1, head_dim=64, quant=QuantConfig(),
                             layer=0, seed=3, epochs=torch.zeros(16, dtype=torch.int64))
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(16, 1, 64, generator=gen), torch.randn(16, 1, 64, generator=gen)
    k[5, 0, :32] = torch.linspace(-8e6, 8e6, 32)
    write_(layer, k, v, slots=torch.arange(16))
    assert torch.isfinite(layer.k["scales"][5].float()).all() and torch.isinf(layer.k["wit"][5, 0, 0])
    q = torch.zeros(1, 1, 64)
    q[0, 0, 0] = 1e-6  # exact logit of token 5: 0.125 * 1e-6 * -8e6 = -1; read as 0
    bt, sl = torch.tensor([[0]], dtype=torch.int32), torch.tensor([16], dtype=torch.int32)
    for radius in ("det", "prob", "min"):
        res = decode_attention(q, layer, bt, sl, page_size=16, sm_scale=0.125,
                               cert=CertConfig(radius=radius), delta_loc=1e-3)
        assert bool(torch.isinf(res.cert).all()) and bool(torch.isfinite(res.out).all()), radius
    kh = gather(layer, K_SIDE, torch.arange(16))[0]
    kh[5] = 0.0
    _, p_hat = exact_attention(q[0], kh, v, sm_scale=0.125, return_probs=True)
    _, p_true = exact_attention(q[0], k, v, sm_scale=0.125, return_probs=True)
    assert tv_distance(p_true, p_hat).item() > 0.03


def test_non_finite_query_head_gets_inf_cert_and_leaves_others_unchanged():
    layer, table, lens, q, _ = _setup(ratio=4, D=128, P=1, seed=5)
    clean = _decode(layer, table, lens, q, P=1, splits=3)
    q2 = q.clone()
    q2[2, 5, 17] = math.nan
    bad = _decode(layer, table, lens, q2, P=1, splits=3)
    assert bad.cert[2, 5] == math.inf and bool(torch.isfinite(bad.out[2, 5]).all())
    mask = torch.ones_like(clean.cert, dtype=torch.bool)
    mask[2, 5] = False
    assert torch.equal(bad.cert[mask], clean.cert[mask]) and torch.equal(bad.out[mask], clean.out[mask])


def test_non_contiguous_query_and_radius_output():
    layer, table, lens, q, _ = _setup(ratio=3, D=64, P=16, seed=6)
    qt = q.transpose(0, 1).contiguous().transpose(0, 1)
    assert not qt.is_contiguous()
    a = _decode(layer, table, lens, q, P=16, return_radius=True)
    b = _decode(layer, table, lens, qt, P=16, return_radius=True)
    assert torch.equal(a.out, b.out) and a.radius.shape == (5, 6, 97)
    assert bool((a.radius[0, :, 1:] == 0).all()) and bool((a.radius[4] > 0).all())


def test_disabled_certificate_is_none_not_a_number():
    layer, table, lens, q, _ = _setup(ratio=1, D=64, P=16, seed=7)
    got = _decode(layer, table, lens, q, P=16, splits=2, cert=CertConfig(enabled=False), return_radius=True)
    ref = _decode(layer, table, lens, q, P=16, splits=2)
    assert got.cert is None and got.vbound is None and got.radius is None and got.radius_kind == "none"
    assert torch.equal(got.out, ref.out)


@pytest.mark.parametrize("arg,kwargs,pat", [
    ("q", dict(q=torch.zeros(4, 64)), "q must be"),
    ("q", dict(q=torch.zeros(5, 5, 64)), r"q \["),
    ("block_table", dict(block_table=torch.zeros(5, 7, dtype=torch.int64)), "block_table"),
    ("seq_lens", dict(seq_lens=torch.ones(5, dtype=torch.int64)), "seq_lens"),
    ("seq_lens", dict(seq_lens=torch.full((5,), 1000, dtype=torch.int32)), "seq_lens"),
    ("delta_loc", dict(delta_loc=torch.ones(3) * 0.1), "delta_loc"),
    ("num_splits", dict(num_splits=0), "num_splits"),
])
def test_bad_arguments_raise_errors_naming_them(arg, kwargs, pat):
    layer, table, lens, q, _ = _setup(ratio=3, D=64, P=16, seed=8)
    call = dict(q=q, layer_kv=layer, block_table=table, seq_lens=lens, page_size=16, sm_scale=0.125,
                cert=CertConfig(), delta_loc=1e-3, num_splits=1)
    call.update(kwargs)
    with pytest.raises(ValueError, match=pat):
        decode_attention(**call)


@pytest.mark.parametrize("ratio,causal", [(1, True), (4, True), (7, False)])
def test_extend_matches_float64_over_stored_prefix_and_exact_new_tokens(ratio, causal):
    layer, _, _, _, seqs = _setup(ratio=ratio, D=64, P=16, seed=9)
    slots, _, _ = seqs[4]
    gen = torch.Generator().manual_seed(10)
    T, Hkv = 9, 2
    q = torch.randn(T, ratio * Hkv, 64, generator=gen)
    kn = torch.randn(T, Hkv, 64, generator=gen).half()
    vn = torch.randn(T, Hkv, 64, generator=gen).half()
    got = extend_attention(q, kn, vn, layer, slots, sm_scale=0.125, causal=causal)
    kh, vh = gather(layer, K_SIDE, slots)[0], gather(layer, V_SIDE, slots)[0]
    for i in range(T):
        n_new = i + 1 if causal else T
        k = torch.cat([kh, kn[:n_new].float()])
        v = torch.cat([vh, vn[:n_new].float()])
        ref = exact_attention(q[i], k, v, sm_scale=0.125)
        assert torch.allclose(got[i].double(), ref, atol=2e-6), i


def test_pool_round_trip_is_bitwise_the_compressor_and_bytes_are_exact():
    layer, _, _, _, seqs = _setup(ratio=1, D=128, P=16, seed=11)
    slots, k, _ = seqs[2]
    ctx = EncodeCtx(seed=layer.seed, layer=3, kv_heads=torch.arange(2), side=K_SIDE, slots=slots,
                    epochs=layer.epochs[slots])
    packed = layer.compressor.encode(k, ctx=ctx)
    xhat, stored = gather(layer, K_SIDE, slots)
    assert all(torch.equal(stored[n], packed[n]) for n in packed)
    assert torch.equal(xhat, layer.compressor.decode(packed, ctx=ctx))
    per_token = layer.compressor.bytes_per_token_head(128)
    assert bytes_allocated(layer) == 2 * layer.num_slots * 2 * per_token


def test_reused_slot_with_new_epoch_gets_a_fresh_dither():
    layer, _, _, _, seqs = _setup(ratio=1, D=64, P=16, seed=12)
    slots, k, v = seqs[4]
    before = gather(layer, K_SIDE, slots)[1]["codes"].clone()
    layer.epochs[slots] += 1
    write_(layer, k, v, slots=slots)
    after = gather(layer, K_SIDE, slots)[1]["codes"]
    assert (before != after).float().mean() > 0.2


def test_pool_rejects_block_methods_and_missing_outlier_indices():
    ep = torch.zeros(16, dtype=torch.int64)
    with pytest.raises(ValueError, match="block"):
        LayerKV.allocate(num_slots=16, num_kv_heads=1, head_dim=64, quant=QuantConfig(method="kivi2"),
                         layer=0, seed=0, epochs=ep)
    with pytest.raises(ValueError, match="outlier_idx"):
        LayerKV.allocate(num_slots=16, num_kv_heads=1, head_dim=64, quant=QuantConfig(outliers=2),
                         layer=0, seed=0, epochs=ep)


def test_prob_radius_uses_each_sequences_length_and_delta():
    from witcert.ref.cert import radius_prob
    layer, table, lens, q, seqs = _setup(ratio=3, D=64, P=16, seed=13)
    dl = torch.tensor([1e-3, 1e-4, 1e-5, 1e-6, 1e-7], dtype=torch.float64)
    got = decode_attention(q, layer, table, lens, page_size=16, sm_scale=0.125,
                           cert=CertConfig(radius="prob"), delta_loc=dl, return_radius=True)
    kvh = torch.arange(6) // 3
    for b, (slots, _, _) in enumerate(seqs):
        scales = gather(layer, K_SIDE, slots)[1]["scales"][:, kvh].transpose(0, 1)
        want = radius_prob(q[b], scales, sm_scale=0.125, group_size=32, bits=layer.quant.dither_bits,
                           n_tokens=int(lens[b]), delta_loc=float(dl[b]))
        r = got.radius[b, :, :int(lens[b])]
        # the whole radius = u_prob + the arithmetic slack of the fp32 logits (PROOFS 5):
        # never below u_prob, and above it only by a few fp32 ulps of the logits
        assert (r >= want).all()
        assert torch.allclose(r, want, rtol=1e-5, atol=1e-6)
