"""Baseline compressors (witcert.ref.baselines): every claim checked against float64 truth.

One case matrix drives the shared claims (round trip, witness soundness, storage to the
byte, bad input); the method-specific claims (bits vs error, SR8 negative control,
fp8 saturation, KIVI exact window) follow.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from witcert.ref.baselines import (FP8, FP16, KIVI, RTN, StochasticRounding8, pack_bits,
                                   packed_bytes, unpack_bits)
from witcert.ref.types import K_SIDE, V_SIDE, EncodeCtx

TOKEN_METHODS = [RTN(bits=8), RTN(bits=4), StochasticRounding8(), FP8(scaled=False),
                 FP8(scaled=True), FP16()]
BLOCK_METHODS = [KIVI(bits=2, residual=8, block=16), KIVI(bits=4, residual=8, block=16)]
ALL_METHODS = TOKEN_METHODS + BLOCK_METHODS

# (T, H, D, G): length 1, an odd length, head dims 64 and 128, several band widths
SHAPES = [(1, 1, 64, 32), (97, 3, 128, 32), (40, 2, 64, 16), (33, 1, 128, 128)]

# documented bytes per token-head at D=128, G=32 (token methods: exact; KIVI: amortised)
BYTES_D128_G32 = {"rtn8": 144, "rtn4": 80, "sr8": 144, "fp8": 136, "fp8_scaled": 144, "fp16": 264}


def kv_like(T: int, H: int, D: int, *, seed: int = 0, dtype=torch.float16) -> torch.Tensor:
    """[T, H, D] keys with a few large channels (RoPE-pair-like outliers), as real K/V have."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, D, generator=g)
    big = torch.randperm(D, generator=g)[: max(2, D // 32)]
    x[..., big] *= 12.0
    return x.to(dtype)


def with_group(comp, G: int):
    return dataclasses.replace(comp, group_size=G)


def true_group_err(x: torch.Tensor, xhat: torch.Tensor, G: int) -> torch.Tensor:
    T, H, D = x.shape
    return (xhat.double() - x.double()).view(T, H, D // G, G).norm(dim=-1)


def roundtrip(comp, x: torch.Tensor, side: int = K_SIDE, **ctx_kw):
    ctx = EncodeCtx.simple(num_tokens=x.shape[0], num_heads=x.shape[1], side=side, **ctx_kw)
    packed = comp.encode(x, ctx=ctx)
    return packed, comp.decode(packed, ctx=ctx)


ids = lambda c: c.name  # noqa: E731


# ----------------------------------------------------------------------------- shared claims

@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("comp", ALL_METHODS, ids=ids)
@pytest.mark.parametrize("side", [K_SIDE, V_SIDE])
def test_decode_of_encode_has_input_shape_and_f32(comp, shape, side):
    T, H, D, G = shape
    comp = with_group(comp, G)
    packed, xhat = roundtrip(comp, kv_like(T, H, D), side)
    assert xhat.shape == (T, H, D) and xhat.dtype == torch.float32
    assert packed["wit"].shape == (T, H, D // G) and packed["wit"].dtype == torch.float16
    spec = comp.storage_spec(H, D)
    for name, t in packed.items():
        tail, dtype = spec[name]
        assert t.dtype == dtype and tuple(t.shape[1:]) == (H, *tail), name
    if comp.granularity == "token":
        assert set(packed) == set(spec)
        assert all(t.shape[0] == T for t in packed.values())
    assert comp.has_prob_radius is False


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("comp", ALL_METHODS, ids=ids)
@pytest.mark.parametrize("side", [K_SIDE, V_SIDE])
def test_witness_bounds_true_group_error_in_float64(comp, shape, dtype, side):
    T, H, D, G = shape
    comp = with_group(comp, G)
    x = kv_like(T, H, D, seed=T + D, dtype=dtype)
    packed, xhat = roundtrip(comp, x, side)
    w = packed["wit"].double()
    assert torch.isfinite(w).all()
    assert (w >= true_group_err(x, xhat, G)).all()


@pytest.mark.parametrize("comp", TOKEN_METHODS, ids=ids)
def test_storage_bytes_equal_spec_sum_packed_size_and_documented_cost(comp):
    T, H, D = 5, 2, 128
    spec = comp.storage_spec(H, D)
    spec_sum = sum(math.prod(shape) * torch.empty((), dtype=dt).element_size()
                   for shape, dt in spec.values())
    packed, _ = roundtrip(comp, kv_like(T, H, D))
    assert comp.bytes_per_token_head(D) == spec_sum == packed_bytes(packed) // (T * H)
    assert comp.bytes_per_token_head(D) == BYTES_D128_G32[comp.name]


@pytest.mark.parametrize("comp", TOKEN_METHODS, ids=ids)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=str)
def test_nonfinite_token_head_gets_inf_witness_and_decodes_to_zero(comp, bad):
    T, H, D = 6, 3, 64
    x = kv_like(T, H, D, seed=3)
    y = x.clone()
    y[2, 1, 5] = bad
    packed, xhat = roundtrip(comp, y)
    assert torch.isinf(packed["wit"][2, 1]).all()
    assert (xhat[2, 1] == 0).all()
    clean = torch.ones(T, H, dtype=torch.bool)
    clean[2, 1] = False
    _, xhat_clean = roundtrip(comp, x)
    assert torch.isfinite(packed["wit"][clean]).all()
    assert torch.equal(xhat[clean], xhat_clean[clean])  # other token-heads untouched


@pytest.mark.parametrize("comp", [c for c in TOKEN_METHODS if c.name != "fp8"], ids=ids)
def test_fp32_value_beyond_fp16_range_flags_the_token_head(comp):
    x = kv_like(2, 1, 64).float()
    x[1, 0, 7] = 1e9  # finite, but no fp16 scale (or fp16 value) can represent it
    packed, xhat = roundtrip(comp, x)
    assert torch.isinf(packed["wit"][1, 0]).all() and (xhat[1, 0] == 0).all()
    assert torch.isfinite(packed["wit"][0, 0]).all()


@pytest.mark.parametrize("comp", ALL_METHODS, ids=ids)
def test_non_contiguous_input_encodes_like_its_contiguous_copy(comp):
    x = kv_like(4, 40, 64).transpose(0, 1)  # [40, 4, 64], non-contiguous
    assert not x.is_contiguous()
    (p1, x1), (p2, x2) = roundtrip(comp, x), roundtrip(comp, x.contiguous())
    assert torch.equal(x1, x2) and all(torch.equal(p1[k], p2[k]) for k in p1)


# ----------------------------------------------------------------------------- RTN

def test_error_shrinks_with_bits_rtn8_far_below_rtn4():
    x = kv_like(64, 2, 128)
    rms = {c.name: (roundtrip(c, x)[1].double() - x.double()).pow(2).mean().sqrt().item()
           for c in (RTN(bits=8), RTN(bits=4))}
    # qmax 127 vs 7: the step is ~18x smaller; demand at least 10x
    assert rms["rtn4"] > 10 * rms["rtn8"] > 0


@pytest.mark.parametrize("bits", [8, 4])
def test_rtn_error_is_within_half_the_stored_scale(bits):
    x = kv_like(50, 2, 128, seed=7)
    packed, xhat = roundtrip(RTN(bits=bits), x)
    s = packed["scales"].double().repeat_interleave(32, dim=-1)
    assert ((xhat.double() - x.double()).abs() <= s * (0.5 + 2.0**-15)).all()


def test_rtn4_packs_channel_pairs_low_nibble_first_offset_8():
    x = torch.zeros(1, 1, 32)
    x[0, 0, :4] = torch.tensor([7.0, -7.0, 1.0, 0.0])  # amax 7 -> scale exactly 1
    packed, xhat = roundtrip(RTN(bits=4), x)
    assert packed["scales"][0, 0, 0].item() == 1.0
    assert packed["codes"][0, 0, :2].tolist() == [(8 - 7) << 4 | (8 + 7), 8 << 4 | (8 + 1)]
    assert torch.equal(xhat, x)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_pack_unpack_bits_round_trip(bits):
    u = torch.randint(0, 1 << bits, (3, 2, 64), generator=torch.Generator().manual_seed(bits))
    p = pack_bits(u, bits)
    assert p.dtype == torch.uint8 and p.shape == (3, 2, 64 * bits // 8)
    assert torch.equal(unpack_bits(p, bits), u.to(torch.int32))


# ----------------------------------------------------------------------------- SR8: the negative control

def _streams(x_row: torch.Tensor, n: int, comp, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    """Encode one token-head [D] n times with n independent dither streams (epochs 0..n-1).

    Returns (error / scale f64 [n, D], scale f64 [D])."""
    D = x_row.shape[-1]
    x = x_row.expand(n, 1, D)
    ctx = EncodeCtx(seed=kw.get("seed", 1234), layer=0, kv_heads=torch.zeros(1, dtype=torch.int64),
                    side=K_SIDE, slots=torch.zeros(n, dtype=torch.int64),
                    epochs=torch.arange(n, dtype=torch.int64))
    packed = comp.encode(x, ctx=ctx)
    s = packed["scales"][0, 0].double().repeat_interleave(comp.group_size)
    err = comp.decode(packed, ctx=ctx)[:, 0].double() - x[:, 0].double()
    return err / s, s


@pytest.mark.parametrize("dither_bits", [8, 16, 24])
def test_sr8_is_unbiased_over_dither_streams(dither_bits):
    n, D = 4096, 128
    x = kv_like(1, 1, D, seed=11)[0, 0]
    e, _ = _streams(x, n, StochasticRounding8(dither_bits=dither_bits))
    # |e/s| < 1 so each channel's mean has sd <= 1/(2 sqrt n); 6 sd covers 128 channels,
    # plus the b-bit grid bias 2^-(b+1)
    margin = 6 / (2 * math.sqrt(n)) + 2.0 ** -(dither_bits + 1)
    assert e.mean(dim=0).abs().max() <= margin
    # the same test rejects RTN, whose error at fixed x is a deterministic offset
    e_rtn, _ = _streams(x, 8, RTN(bits=8))
    assert e_rtn.mean(dim=0).abs().max() > margin


def test_sr8_is_reproducible_from_the_counter_and_changes_with_the_seed():
    x = kv_like(20, 2, 64, seed=5)
    comp = StochasticRounding8()
    a, b = roundtrip(comp, x, seed=9)[0]["codes"], roundtrip(comp, x, seed=9)[0]["codes"]
    c = roundtrip(comp, x, seed=10)[0]["codes"]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_sr8_error_is_not_uniform_the_negative_control():
    """Dither8's error is uniform on [-s/2, s/2] whatever x is; SR8's is not.

    Constructed x: scale exactly 1/16 and every other channel at a half step, so x/s has
    fractional part 1/2: SR8's error is +-s/2 with probability 1/2 each (variance s^2/4,
    three times the uniform's s^2/12), two atoms instead of a continuum. For generic x the
    pooled law of e/s is triangular on (-1, 1), so |e| > s/2 happens, which a uniform on
    [-s/2, s/2] never does, and the Kolmogorov distance to U[-1/2, 1/2] is >= 1/8.
    """
    n, D = 4096, 32
    half = torch.full((D,), 0.5 / 16) + torch.arange(D) / 16 - 1.0
    half[0] = 127 / 16  # amax / 127 = 1/16 exactly
    e, s = _streams(half.half(), n, StochasticRounding8(group_size=32))
    assert (s == 1 / 16).all()
    e = e[:, 1:]
    assert set(e.unique().tolist()) == {-0.5, 0.5}
    assert (e.var(dim=0) > 0.2).all()  # uniform would give 1/12 ~ 0.083

    x = kv_like(1, 1, 128, seed=2)[0, 0]
    e, _ = _streams(x, n, StochasticRounding8())
    assert (e.abs() > 0.5).float().mean() > 0.05  # triangular law: P(|e/s| > 1/2) = 1/4
    pooled = e.flatten().sort().values
    ecdf = torch.arange(1, pooled.numel() + 1, dtype=torch.float64) / pooled.numel()
    ks = (ecdf - (pooled + 0.5).clamp(0, 1)).abs().max()
    assert ks > 0.1  # KS 1% critical value here is ~0.002
    # the subtractive dither of the same stream passes the same KS check
    comp = StochasticRounding8()
    ctx = EncodeCtx(seed=1234, layer=0, kv_heads=torch.zeros(1, dtype=torch.int64), side=K_SIDE,
                    slots=torch.zeros(n, dtype=torch.int64), epochs=torch.arange(n, dtype=torch.int64))
    from witcert.ref.philox import dither
    xi = dither(seed=1234, layer=0, kv_heads=ctx.kv_heads, side=K_SIDE, slots=ctx.slots,
                epochs=ctx.epochs, head_dim=128, bits=comp.dither_bits).double()[:, 0]
    s = comp.encode(x.expand(1, 1, 128), ctx=EncodeCtx.simple(num_tokens=1, num_heads=1))["scales"]
    s = s[0, 0].double().repeat_interleave(32)
    y = x.double() / s + xi
    e_dither = torch.round(y) - xi - x.double() / s
    pooled = e_dither.flatten().sort().values
    assert (ecdf - (pooled + 0.5).clamp(0, 1)).abs().max() < 0.01


# ----------------------------------------------------------------------------- FP8

def test_fp8_raw_saturates_at_448_and_the_witness_records_it():
    x = torch.zeros(1, 1, 32, dtype=torch.float16)
    x[0, 0, :4] = torch.tensor([1000.0, -600.0, 448.0, 449.0])
    packed, xhat = roundtrip(FP8(scaled=False), x)
    assert xhat[0, 0, :4].tolist() == [448.0, -448.0, 448.0, 448.0]  # clamped, not NaN
    w = packed["wit"][0, 0, 0].double()
    assert w >= math.hypot(1000 - 448, 600 - 448, 0, 1) and torch.isfinite(w)
    # the scaled variant represents the same values to fp8 relative precision
    _, xs = roundtrip(FP8(scaled=True), x)
    assert ((xs - x.float()).abs() <= x.float().abs() * 2.0**-4).all()


def test_fp8_codes_are_e4m3fn_bit_patterns():
    x = torch.zeros(1, 1, 32)
    x[0, 0, :3] = torch.tensor([1.0, -2.0, 0.5])
    codes = roundtrip(FP8(scaled=False), x)[0]["codes"][0, 0, :3].tolist()
    assert codes == [0x38, 0xC0, 0x30]  # e4m3fn, bias 7: 1.0 = 0 0111 000


# ----------------------------------------------------------------------------- FP16

def test_fp16_passthrough_is_exact_for_fp16_input_with_zero_witness():
    x = kv_like(9, 2, 64)
    packed, xhat = roundtrip(FP16(), x)
    assert torch.equal(xhat, x.float()) and (packed["wit"] == 0).all()
    x32 = x.float() + 1e-4  # fp32 input: witness of the fp16 rounding, > 0
    packed, xhat = roundtrip(FP16(), x32)
    assert (packed["wit"] > 0).all() and (packed["wit"].double() >= true_group_err(x32, xhat, 32)).all()


# ----------------------------------------------------------------------------- KIVI

@pytest.mark.parametrize("side", [K_SIDE, V_SIDE])
@pytest.mark.parametrize("T", [5, 8, 9, 8 + 16 * 2 + 5, 100])
def test_kivi_recent_residual_window_is_exact_with_zero_witness(side, T):
    comp = KIVI(bits=2, residual=8, block=16)
    x = kv_like(T, 2, 64, seed=T)
    packed, xhat = roundtrip(comp, x, side)
    nq = comp.num_quantized(T, side)
    assert T - nq >= min(T, 8)  # at least the residual stays exact
    assert side == V_SIDE or nq % 16 == 0  # keys quantize whole blocks only
    assert torch.equal(xhat[nq:], x[nq:].float()) and (packed["wit"][nq:] == 0).all()
    if nq:
        assert (packed["wit"][:nq] > 0).any()


def test_kivi_error_shrinks_with_bits():
    x = kv_like(8 + 64, 2, 128)
    for side in (K_SIDE, V_SIDE):
        rms = {b: (roundtrip(KIVI(bits=b, residual=8, block=16), x, side)[1].double()
                   - x.double())[:64].pow(2).mean().sqrt().item() for b in (2, 4)}
        assert rms[2] > 3 * rms[4] > 0  # 3 vs 15 levels: ~5x


@pytest.mark.parametrize("T", [0 + 1, 8, 24, 40, 300])
@pytest.mark.parametrize("side", [K_SIDE, V_SIDE])
def test_kivi_stored_bytes_equal_the_documented_formula(side, T):
    comp = KIVI(bits=4, residual=8, block=16)
    packed, _ = roundtrip(comp, kv_like(T, 3, 128), side)
    assert packed_bytes(packed) == 3 * comp.storage_bytes(T, 128, side=side)


def test_kivi_documented_costs_at_d128_g32_block256():
    k4, k2 = KIVI(bits=4, block=256), KIVI(bits=2, block=256)
    assert (k4.bytes_per_token(128, K_SIDE), k4.bytes_per_token(128, V_SIDE)) == (74, 88)
    assert (k2.bytes_per_token(128, K_SIDE), k2.bytes_per_token(128, V_SIDE)) == (42, 56)
    assert (k4.bytes_per_token_head(128), k2.bytes_per_token_head(128)) == (81, 49)
    # amortised cost is the large-T limit of the exact sequence cost (tail excluded)
    T = 32 + 256 * 40
    assert k4.storage_bytes(T, 128, side=K_SIDE) == (T - 32) * 74 + 32 * (256 + 8)


@pytest.mark.parametrize("side", [K_SIDE, V_SIDE])
def test_kivi_nonfinite_token_head_is_flagged_alone(side):
    comp = KIVI(bits=4, residual=8, block=16)
    x = kv_like(40, 2, 64, seed=1)
    x[3, 1, 0] = float("nan")
    x[35, 0, 2] = float("inf")  # in the exact tail
    packed, xhat = roundtrip(comp, x, side)
    inf_rows = torch.isinf(packed["wit"]).any(dim=-1)
    expect = torch.zeros(40, 2, dtype=torch.bool)
    expect[3, 1] = expect[35, 0] = True
    assert torch.equal(inf_rows, expect)
    assert (xhat[3, 1] == 0).all() and (xhat[35, 0] == 0).all()
    ok = ~expect
    assert (packed["wit"][ok].double() >= true_group_err(x, xhat, 32)[ok]).all()


# ----------------------------------------------------------------------------- validation

@pytest.mark.parametrize("make", [lambda: RTN(bits=3), lambda: KIVI(bits=8), lambda: FP8(group_size=0),
                                  lambda: StochasticRounding8(dither_bits=12)])
def test_invalid_parameters_raise_at_construction(make):
    with pytest.raises(ValueError):
        make()


@pytest.mark.parametrize("comp", ALL_METHODS, ids=ids)
def test_bad_group_size_and_outlier_bypass_raise_naming_the_method(comp):
    with pytest.raises(ValueError, match=comp.name):
        roundtrip(with_group(comp, 128), kv_like(2, 1, 64))
    idx = torch.tensor([[0, 1]])
    with pytest.raises(ValueError, match=comp.name):
        roundtrip(comp, kv_like(2, 1, 64), outlier_idx=idx)
