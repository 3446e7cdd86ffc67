"""Dithered INT8 (token and block granularity): the error bound, the flags, the witness
and the b-bit dither grid property that the probabilistic radius rests on."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from witcert.config import QuantConfig
from witcert.ref.fp import FP16_MIN_NORMAL, fp16_round_up
from witcert.ref.philox import dither
from witcert.ref.quant import (DitherInt8, DitherInt8Block, dequantize_dither8, dither8_scales,
                               dither8_y, quantize_dither8)
from witcert.ref.types import EncodeCtx

SLACK = 0.5 + 2.0**-15  # DESIGN: |xhat - x| <= s (1/2 + 2^-15)
KINDS = ("normal", "tiny", "huge", "mixed", "zeros", "sparse")
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def make_x(seed: int, kind: str, dtype: torch.dtype, shape=(6, 3, 64)) -> torch.Tensor:
    """Test inputs: every kind is finite and inside the dtype's range."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    top = 6.0e4 if dtype != torch.float32 else 8.0e6  # fp32: below the scale overflow
    if kind == "tiny":
        x = x * 1e-6
    elif kind == "huge":
        x = (x / x.abs().amax()) * top
    elif kind == "mixed":  # magnitudes from 1e-7 to 1e4 inside every group
        x = x * torch.exp(torch.empty(shape, dtype=torch.float64).uniform_(-16, 9, generator=g))
        x = x.clamp(-top, top)
    elif kind == "zeros":
        x = torch.zeros(shape, dtype=torch.float64)
    elif kind == "sparse":
        x = x * (torch.rand(shape, generator=g, dtype=torch.float64) < 0.1)
    return x.to(dtype)


def run(x, *, bits=16, G=32, seed=0, outlier_idx=None):
    T, H, D = x.shape
    xi = dither(seed=seed, layer=2, kv_heads=torch.arange(H), side=0, slots=torch.arange(T),
                epochs=torch.zeros(T, dtype=torch.int64), head_dim=D, bits=bits)
    packed = quantize_dither8(x, xi, group_size=G, outlier_idx=outlier_idx)
    xhat = dequantize_dither8(packed, xi, group_size=G, outlier_idx=outlier_idx)
    return xi, packed, xhat


def per_channel(scales, G):
    return scales.double().repeat_interleave(G, dim=-1)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), kind=st.sampled_from(KINDS), dtype=st.sampled_from(DTYPES),
       bits=st.sampled_from([8, 16, 24]), G=st.sampled_from([8, 32, 64]))
def test_error_never_exceeds_half_scale_plus_2_pow_minus_15(seed, kind, dtype, bits, G):
    x = make_x(seed, kind, dtype)
    _, packed, xhat = run(x, bits=bits, G=G, seed=seed)
    assert torch.isfinite(packed["scales"]).all()
    err = (xhat.double() - x.double()).abs()
    assert bool((err <= per_channel(packed["scales"], G) * SLACK).all())


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), kind=st.sampled_from(KINDS), dtype=st.sampled_from(DTYPES),
       bits=st.sampled_from([8, 16, 24]))
def test_error_above_half_scale_only_at_near_ties(seed, kind, dtype, bits):
    """In exact arithmetic |e| <= s/2. fp32 rounding of x/s, of the sum and of the
    dequantization (each <= 2^-17 s) can push |e| just past s/2, but only where the
    exact y = x/s + xi lies within 2^-16 of a half-integer (a rounding tie up to fp32)."""
    x = make_x(seed, kind, dtype)
    xi, packed, xhat = run(x, bits=bits, seed=seed)
    s = per_channel(packed["scales"], 32)
    over = (xhat.double() - x.double()).abs() > s / 2
    y_exact = x.double() / s + xi.double()
    tie_dist = (y_exact - y_exact.floor() - 0.5).abs()
    assert bool((tie_dist[over] <= 2.0**-16 + 2.0**-40).all())


def test_codes_never_clip_even_at_the_worst_case():
    """|y| < 127.5 with x at +-amax (|x/s| close to 126.5) and xi at the grid ends."""
    amax = torch.tensor([1.0, 3.1, 1e-7, 6.0e4, 126.5 * 2**-14, 0.8 * 126.5 * 2**-14])
    x = torch.zeros(len(amax), 2, 32)
    x[:, 0, 0], x[:, 1, 5] = amax, -amax
    for bits in (8, 16, 24):
        edge = 0.5 - 2.0 ** -(bits + 1)
        xi = torch.zeros_like(x)
        xi[:, 0, 0], xi[:, 1, 5] = edge, -edge
        scales, bad = dither8_scales(x, group_size=32)
        assert not bad.any()
        y = dither8_y(x, xi, scales, group_size=32)
        assert float(y.abs().max()) < 127.5
        codes = quantize_dither8(x, xi, group_size=32)["codes"]
        assert int(codes.abs().max()) == 127  # the edge is reached, never passed
    for kind in KINDS:
        for dtype in DTYPES:
            x = make_x(7, kind, dtype)
            xi = torch.rand(x.shape, generator=torch.Generator().manual_seed(1)) - 0.5
            scales, _ = dither8_scales(x, group_size=32)
            assert float(dither8_y(x, xi, scales, group_size=32).abs().max()) < 127.5


def test_fp32_scale_with_fp16_store_breaks_the_half_scale_bound():
    """Why DESIGN quantizes with the stored fp16 scale: quantizing with the fp32 scale and
    decoding with its fp16 rounding makes |e| reach ~s/2 + 126.5 |s16 - s32|."""
    x = make_x(3, "normal", torch.float32, shape=(64, 4, 64))
    xi = dither(seed=1, layer=0, kv_heads=torch.arange(4), side=0, slots=torch.arange(64),
                epochs=torch.zeros(64, dtype=torch.int64), head_dim=64, bits=16)
    amax = x.abs().view(64, 4, 2, 32).amax(-1)
    s32 = (amax / 126.5).repeat_interleave(32, -1)
    s16 = s32.to(torch.float16).to(torch.float32)
    n = torch.round(x / s32 + xi)
    bad_err = ((n - xi) * s16).double() - x.double()
    assert float((bad_err.abs() / s16.double()).max()) > 0.5 + 2.0**-10
    _, packed, xhat = run(x, bits=16, seed=1)
    good = (xhat.double() - x.double()).abs() / per_channel(packed["scales"], 32)
    assert float(good.max()) <= SLACK


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", KINDS)
def test_scale_is_fp16_round_up_of_fp32_amax_over_126_5_floored(dtype, kind):
    x = make_x(11, kind, dtype)
    scales, bad = dither8_scales(x, group_size=32)
    assert not bad.any() and scales.dtype == torch.float16
    amax = x.float().abs().view(6, 3, 2, 32).amax(-1)
    s32 = (amax.double() / 126.5).float()  # correctly rounded fp32 quotient
    want = torch.maximum(fp16_round_up(s32), torch.tensor(FP16_MIN_NORMAL, dtype=torch.float16))
    assert torch.equal(scales, want)
    assert bool((scales.double() >= FP16_MIN_NORMAL).all())
    # s >= amax / 126.5 up to the one fp32 rounding of the quotient
    assert bool((scales.double() * 126.5 >= amax.double() * (1 - 2.0**-24)).all())


def test_outlier_channels_are_exact_and_excluded_from_the_group_amax():
    x = make_x(5, "normal", torch.float16, shape=(8, 2, 64))
    x[:, :, 6], x[:, :, 7] = 3.0e4, -2.5e4  # one huge RoPE pair, in group 0
    idx = torch.tensor([[6, 7], [6, 7]])
    _, plain, _ = run(x)
    xi, packed, xhat = run(x, outlier_idx=idx)
    assert bool((packed["scales"][..., 0] < plain["scales"][..., 0] / 100).all())
    assert torch.equal(packed["outl"], x[:, :, [6, 7]])
    assert torch.equal(xhat[:, :, 6:8], x[:, :, 6:8].float())
    assert bool((packed["codes"][:, :, 6:8] == 0).all())
    err = (xhat.double() - x.double()).abs()
    assert bool((err <= per_channel(packed["scales"], 32) * SLACK).all())


def test_bypassed_value_that_fp16_cannot_hold_flags_the_token_head():
    x = make_x(5, "normal", torch.bfloat16, shape=(4, 2, 64))
    x[1, 0, 6] = 1.0e6  # representable in bf16, overflows fp16
    _, packed, xhat = run(x, outlier_idx=torch.tensor([[6, 7], [6, 7]]))
    assert bool(torch.isinf(packed["wit"][1, 0]).all()) and bool(torch.isinf(packed["scales"][1, 0]).all())
    assert bool((xhat[1, 0] == 0).all())
    assert bool(torch.isfinite(packed["wit"][[0, 2, 3]]).all())


@pytest.mark.parametrize("poison", ["nan", "inf", "-inf", "overflow", "outlier_nan"])
def test_bad_token_head_is_flagged_and_other_heads_are_unaffected(poison):
    x = make_x(9, "normal", torch.float32, shape=(4, 3, 64))
    idx = torch.tensor([[0, 1]] * 3)
    clean_xi, clean, clean_hat = run(x, outlier_idx=idx)
    value = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"),
             "overflow": 1.0e7, "outlier_nan": float("nan")}[poison]
    x = x.clone()
    x[2, 1, 0 if poison == "outlier_nan" else 40] = value
    if poison == "overflow":
        x[2, 1, :] = 0.0
        x[2, 1, 40] = 9.0e6  # 9e6 / 126.5 > 65504: the fp16 scale overflows
    _, packed, xhat = run(x, outlier_idx=idx)
    assert bool(torch.isinf(packed["scales"][2, 1]).all()) and bool(torch.isinf(packed["wit"][2, 1]).all())
    assert bool((packed["wit"][2, 1] > 0).all())
    assert bool((packed["codes"][2, 1] == 0).all()) and bool((packed["outl"][2, 1] == 0).all())
    assert bool((xhat[2, 1] == 0).all()) and bool(torch.isfinite(xhat).all())
    keep = torch.ones(4, 3, dtype=torch.bool)
    keep[2, 1] = False
    for k in ("codes", "scales", "wit", "outl"):
        assert torch.equal(packed[k][keep], clean[k][keep]), k
    assert torch.equal(xhat[keep], clean_hat[keep])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), kind=st.sampled_from(KINDS), dtype=st.sampled_from(DTYPES),
       bits=st.sampled_from([8, 16, 24]), G=st.sampled_from([8, 16, 32, 64]),
       m=st.integers(0, 3))
def test_witness_bounds_the_true_group_error_norm(seed, kind, dtype, bits, G, m):
    x = make_x(seed, kind, dtype)
    if m:
        x = x.clamp(-6.0e4, 6.0e4).to(torch.float16).to(dtype)  # bypassed values must fit fp16
    idx = torch.arange(2 * m).expand(3, 2 * m) if m else None
    _, packed, xhat = run(x, bits=bits, G=G, seed=seed, outlier_idx=idx)
    err = xhat.double() - x.double()
    norm = err.square().view(6, 3, 64 // G, G).sum(-1).sqrt()
    # a norm fp16 cannot hold is stored as +inf (still a valid bound, "no guarantee")
    fits = norm * (1 + 2.0**-9) + 2.0**-24 <= 65504.0
    assert bool(torch.isfinite(packed["wit"][fits]).all())
    assert bool(torch.isinf(packed["wit"][norm > 65504.0]).all())
    assert bool((packed["wit"].double() >= norm).all())
    wit = packed["wit"].double()[fits]
    assert bool((wit <= norm[fits] * (1 + 2.0**-9) + 2.0**-24).all())  # and tight


def test_encode_is_deterministic_and_independent_of_batching():
    comp = DitherInt8(group_size=32, bits=16)
    x = make_x(1, "mixed", torch.float16, shape=(10, 2, 64))
    ctx = EncodeCtx.simple(num_tokens=10, num_heads=2, seed=77)
    a, b = comp.encode(x, ctx=ctx), comp.encode(x, ctx=ctx)
    assert all(torch.equal(a[k], b[k]) for k in a)
    part = EncodeCtx(seed=77, layer=0, kv_heads=ctx.kv_heads, side=0, slots=torch.tensor([7, 8, 9]),
                     epochs=torch.zeros(3, dtype=torch.int64))
    c = comp.encode(x[7:], ctx=part)
    assert all(torch.equal(a[k][7:], c[k]) for k in a)
    assert torch.equal(comp.decode(c, ctx=part), comp.decode(a, ctx=ctx)[7:])


@pytest.mark.parametrize("bits", [8, 16])
def test_b_bit_dither_error_grid_mean_and_strict_subgaussian_mgf(bits):
    """For a fixed x, enumerate every b-bit dither value. The rounding core
    n - (fl(x/s) + xi) takes 2^b equally spaced values 2^-b apart (a window of the grid),
    its mean is <= 2^-(b+1) + 2^-18, its exact MGF satisfies E exp(l (X - mu)) <=
    exp(l^2/24); the real error e/s stays within 2^-16 of it (fp32 rounding)."""
    N = 2**bits
    xi_all = (2 * torch.arange(N, dtype=torch.float64) + 1 - N) / 2 ** (bits + 1)
    g = torch.Generator().manual_seed(bits)
    base = torch.randn(1, 1, 32, generator=g) * torch.tensor([10.0] + [1.0] * 31)
    base[0, 0, 1:4] = torch.tensor([0.0, 1e-6, base[0, 0, 0] * 0.999])
    x = base.expand(N, 1, 32).contiguous()
    xi = xi_all.float()[:, None, None].expand(N, 1, 32).contiguous()
    packed = quantize_dither8(x, xi, group_size=32)
    xhat = dequantize_dither8(packed, xi, group_size=32)
    s = packed["scales"].double()[0, 0, 0]
    assert bool((packed["scales"] == packed["scales"][0]).all())
    a = (x / s.float()).double()  # fl(x / s), the same fp32 division as the quantizer
    core = packed["codes"].double() - (a + xi.double())  # exact in float64
    err = (xhat.double() - x.double()) / s
    assert bool(((err - core).abs() <= 2.0**-16).all())
    lams = torch.linspace(-60, 60, 49, dtype=torch.float64)
    for c in range(32):
        v = core[:, 0, c].sort().values
        gaps = v.diff()
        assert torch.allclose(gaps, torch.full_like(gaps, 2.0**-bits), rtol=0, atol=2.0**-40)
        mu = v.mean()
        assert abs(float(mu)) <= 2.0 ** -(bits + 1) + 2.0**-18
        mgf = torch.exp(lams[:, None] * (v[None, :] - mu)).mean(dim=1)
        assert bool((mgf <= torch.exp(lams**2 / 24) * (1 + 1e-12)).all())
        assert abs(float(err[:, 0, c].mean())) <= 2.0 ** -(bits + 1) + 2.0**-15


def test_dither8_compressor_storage_spec_and_bytes_to_the_byte():
    comp = DitherInt8.from_config(QuantConfig(group_size=32, dither_bits=8, outliers=2))
    assert (comp.name, comp.granularity, comp.has_prob_radius) == ("dither8", "token", True)
    assert (comp.group_size, comp.bits, comp.outliers) == (32, 8, 2)
    spec = comp.storage_spec(4, 128)
    assert spec == {"codes": ((128,), torch.int8), "scales": ((4,), torch.float16),
                    "wit": ((4,), torch.float16), "outl": ((4,), torch.float16)}
    assert comp.bytes_per_token_head(128) == 128 + 8 + 8 + 8
    assert "outl" not in DitherInt8().storage_spec(4, 128)
    assert DitherInt8().bytes_per_token_head(128) == 144
    idx = torch.tensor([[0, 1, 8, 9]] * 4)
    x = make_x(2, "normal", torch.float16, shape=(5, 4, 128))
    ctx = EncodeCtx.simple(num_tokens=5, num_heads=4, outlier_idx=idx)
    packed = comp.encode(x, ctx=ctx)
    assert set(packed) == set(spec)
    for k, (tail, dtype) in spec.items():
        assert packed[k].shape == (5, 4, *tail) and packed[k].dtype == dtype
    with pytest.raises(ValueError, match="outlier_idx"):
        comp.encode(x, ctx=EncodeCtx.simple(num_tokens=5, num_heads=4))
    with pytest.raises(TypeError):
        comp.encode(x.double(), ctx=ctx)


@pytest.mark.parametrize("T", [1, 15, 16, 17, 50])
def test_block_variant_per_channel_scale_exact_tail_and_error_bound(T):
    comp = DitherInt8Block.from_config(QuantConfig(method="dither8_block", block_size=16))
    assert (comp.name, comp.granularity, comp.block_size) == ("dither8_block", "block", 16)
    with pytest.raises(ValueError, match="outliers"):
        DitherInt8Block.from_config(QuantConfig(method="dither8_block", outliers=1))
    x = make_x(T, "mixed", torch.bfloat16, shape=(T, 2, 64))
    packed = comp.encode(x)
    xhat = comp.decode(packed)
    tf = T - T % 16
    assert packed["codes"].shape == (tf, 2, 64) and packed["scales"].shape == (tf // 16, 2, 64)
    assert torch.equal(xhat[tf:], x[tf:].float()) and bool((packed["wit"][tf:] == 0).all())
    if tf:
        amax = x[:tf].float().abs().view(tf // 16, 16, 2, 64).amax(1)
        want = fp16_round_up((amax.double() / 126.5).float()).clamp_min(FP16_MIN_NORMAL)
        assert torch.equal(packed["scales"], want)
        s = packed["scales"].double().repeat_interleave(16, 0)
        assert bool(((xhat[:tf].double() - x[:tf].double()).abs() <= s * SLACK).all())
        xi = dither(seed=0, layer=0, kv_heads=torch.arange(2), side=0, slots=torch.arange(tf),
                    epochs=torch.zeros(tf, dtype=torch.int64), head_dim=64, bits=comp.bits)
        assert torch.equal(packed["codes"], torch.round(x[:tf].float() / s.float() + xi).to(torch.int8))
    norm = (xhat.double() - x.double()).square().view(T, 2, 2, 32).sum(-1).sqrt()
    assert bool((packed["wit"].double() >= norm).all())
    assert comp.storage_bytes(T, 64) == tf * 64 + (tf // 16) * 128 + T * 4 + (T - tf) * 128


def test_block_variant_nonfinite_column_decodes_to_zero_with_infinite_witness():
    comp = DitherInt8Block(block_size=16)
    x = make_x(4, "normal", torch.float16, shape=(32, 2, 64))
    x[3, 1, 10] = float("nan")
    packed = comp.encode(x)
    xhat = comp.decode(packed)
    assert torch.isinf(packed["scales"][0, 1, 10]) and bool(torch.isfinite(xhat).all())
    assert bool((xhat[:16, 1, 10] == 0).all()) and bool(torch.isinf(packed["wit"][3, 1]).all())
    norm = (xhat.double() - x.double()).square().view(32, 2, 2, 32).sum(-1).sqrt()
    ok = torch.isfinite(norm)
    assert bool((packed["wit"].double()[ok] >= norm[ok]).all())
    assert math.isinf(float(packed["wit"][3, 1, 0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_fp16_round_up_is_the_smallest_fp16_not_below_x(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20000, generator=g, dtype=torch.float64) * torch.exp(
        torch.empty(20000, dtype=torch.float64).uniform_(-22, 12, generator=g))
    special = [0.0, -0.0, 2.0**-24, 2.0**-25, -(2.0**-25), 2.0**-14, 65504.0, 65504.5, 65520.0,
               -65504.5, -1e9, 1.0 + 2.0**-11, 1.0 + 2.0**-12]
    x = torch.cat([x, torch.tensor(special, dtype=torch.float64)]).to(dtype)
    up = fp16_round_up(x)
    assert up.dtype == torch.float16
    xd, ud = x.double(), up.double()
    assert bool((ud >= xd).all())
    bits = up.view(torch.int16).to(torch.int32) & 0xFFFF
    finite = torch.isfinite(up) & (ud != 0)
    below = torch.where(bits < 0x8000, bits - 1, bits + 1)  # the fp16 just below (nonzero up)
    below = torch.where(below >= 0x8000, below - 0x10000, below).to(torch.int16).view(torch.float16)
    assert bool((below.double()[finite] < xd[finite]).all())
    assert bool(torch.isinf(up[xd > 65504]).all())
    nan_inf = fp16_round_up(torch.tensor([float("nan"), float("inf"), float("-inf")]))
    assert nan_inf.tolist() == [float("inf"), float("inf"), float("-inf")]


def test_group_witness_ignores_bypassed_channels_and_flags_nonfinite_rows():
    from witcert.ref.witness import group_witness
    x = torch.zeros(2, 2, 8)
    xhat = torch.zeros(2, 2, 8)
    xhat[:, :, 0], xhat[:, :, 1] = 3.0, 4.0  # norm 5 in group 0
    bypass = torch.zeros(2, 8, dtype=torch.bool)
    bypass[1, 0] = True
    x[1, 0, 6] = float("nan")
    w = group_witness(x, xhat, group_size=4, bypass=bypass)
    assert w.dtype == torch.float16 and w.shape == (2, 2, 2)
    # an exact norm gains one fp16 ulp from the (1 + 2^-40) slack: 5 -> 5 + 2^-8
    assert w[0, 0].tolist() == [5.0 + 2**-8, 0.0] and w[0, 1].tolist() == [4.0 + 2**-8, 0.0]
    assert bool(torch.isinf(w[1, 0]).all()) and w[1, 1].tolist() == [4.0 + 2**-8, 0.0]
