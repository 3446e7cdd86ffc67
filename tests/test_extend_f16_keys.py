"""The CUDA extend's fp16 keys, each carrying its scale (witcert/kernels/f16keys.py, the specification
of witcert/kernels/cuda/extend.cu's ``tile_unit_exponent``, ``key_hi``, ``rest_norm``,
``row_exponent_h``, ``q_row_h`` and the tile loop's logit; docs/PROOFS.md 5.4, "the CUDA extend's fp16
keys"), on the CPU: the tile's unit, the fp16 key of every code and dither at extreme scales and its
rest's norm ``L_g``, and one admissible run of the kernel's logit (fp32 accumulation in the kernel's
order, one final rounding) within the slack ``sum_g (W_g s_g + sm n_g r_K L_g)`` the radius carries,
against the exact logit, on Gaussian, massive, tiny, huge and same-sign rows, spread, subnormal and
largest scales, tiles whose largest scale is far above the token's, extreme codes and dither. The
tensor cores' own accumulation is the signed model's (checked on the GPU by
tests/test_tc_signed_dot.py); the GPU tests of the extend check the kernel's logits against the
exact ones within its radii."""

from __future__ import annotations

import math

import numpy as np
import pytest

from witcert.kernels import f16keys as fk
from witcert.ref.arith import U32, tc_beta


def _all_numerators(bits: int) -> np.ndarray:
    """[256, R] numerators: every int8 code against every dither value (b 8) or 3,008 of them (b 16)."""
    n = np.arange(-128, 128)
    if bits == 8:
        r = np.arange(0, 256)
    else:
        rng = np.random.default_rng(5)
        r = np.unique(np.concatenate([np.array([0, 1, 2, 3, 2**15 - 1, 2**15, 2**16 - 2, 2**16 - 1]),
                                      rng.integers(0, 2**16, 3000)]))
    return fk.numerator(n[:, None], r[None, :], bits)


@pytest.mark.parametrize("s_max", [0.0, 2.0**-149, 1e-30, 2.0**-24, 0.0123, 1.0, 65504.0, 1e30, 3.4028234663852886e38])
def test_the_tiles_unit_holds_the_largest_key_in_fp16s_top_binade(s_max):
    e = fk.tile_unit_exponent(s_max)
    assert fk.E_MIN <= e <= fk.E_MAX
    if s_max == 0:
        assert e == 0
        return
    top = fk.K_MAX * s_max
    assert top <= 2.0 ** (e + fk.KEY_TOP)  # no staged key above 2^15
    if fk.E_MIN < e < fk.E_MAX:
        assert top > 2.0 ** (e + fk.KEY_TOP - 1)  # the least such unit: the keys keep their precision


@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("s,s_max", [(0.0123, 0.0123), (1.0, 2.0**20), (2.0**-24, 1.0), (65504.0, 65504.0),
                                     (1e-38, 1e-38), (3.4e38, 3.4e38), (2.0**-130, 1.0)])
def test_the_fp16_key_of_every_code_and_dither(bits, s, s_max):
    num = _all_numerators(bits)
    e = fk.tile_unit_exponent(s_max)
    sc = np.full(num.shape[:-1] + (num.shape[-1],), np.float32(s))  # group 1: a scale per channel
    x = fk.key_scaled(num, sc, e, bits, 1)
    hi = fk.key_hi(num, sc, e, bits, 1).astype(np.float64)
    assert np.isfinite(hi).all() and np.abs(hi).max() <= 2.0**fk.KEY_TOP
    assert (np.abs(x - hi) <= np.abs(x) * 2.0**-11 + 2.0**-25).all()  # fp16's rounding from float64
    want = np.float32(s).astype(np.float64) * num.astype(np.float64) * 2.0 ** (-(bits + 1) - e)
    assert (x == want).all()


@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_rest_norm_is_at_least_the_rests_norm_and_close_to_it(bits, group):
    rng = np.random.default_rng(bits + group)
    num = fk.numerator(rng.integers(-128, 128, (12, fk.D)), rng.integers(0, 2**bits, (12, fk.D)), bits)
    num[0] = fk.numerator(np.full(fk.D, 127), np.zeros(fk.D, np.int64), bits)  # the largest codes
    scales = (rng.uniform(0.01, 0.1, (12, fk.D // group))).astype(np.float32)
    scales[1] = 2.0**-30  # keys deep in fp16's subnormal range after the tile's unit
    e = fk.tile_unit_exponent(float(scales.max()))
    x = fk.key_scaled(num, scales, e, bits, group)
    rest = x - fk.key_hi(num, scales, e, bits, group).astype(np.float64)
    want = np.linalg.norm(rest.reshape(12, -1, group), axis=-1)
    got = fk.rest_norm(num, scales, e, bits, group)
    assert got.shape == (12, fk.D // group)
    assert (got >= want * (1 - 2.0**-50)).all()
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=0)
    assert (got <= 2.0**(fk.KEY_TOP - 11) * np.sqrt(group)).all()  # half an fp16 ulp at 2^15 a channel


def test_the_dot_coefficient_covers_its_parts_and_stays_small():
    c = fk.dot_rel()
    beta = tc_beta(fk.HALF)
    assert c >= beta + U32 * (1 + beta) * (2 + U32)  # two halves of 64, their sum, the logit's rounding
    assert fk.dot_coef() >= c * fk.K_MAX
    assert fk.dot_coef() < 3.1e-3  # the signed model of 64 products: about 2 x the chains' of 32


def _scales(rng, kind: str, ng: int) -> np.ndarray:
    if kind == "plain":
        s = rng.uniform(0.01, 0.1, ng)
    elif kind == "spread":  # one group at 1, the others down to 2^-12
        s = 2.0 ** -rng.integers(0, 13, ng).astype(np.float64)
        s[rng.integers(0, ng)] = 1.0
    elif kind == "subnormal":
        s = np.full(ng, 2.0**-24)
        s[0] = 3 * 2.0**-24
    elif kind == "largest":
        s = np.full(ng, 65504.0)
    elif kind == "zero":
        s = rng.uniform(0.01, 0.1, ng)
        s[rng.integers(0, ng)] = 0.0
    else:
        raise ValueError(kind)
    return s.astype(np.float16).astype(np.float64)


def _query(rng, kind: str) -> np.ndarray:
    d = fk.D
    if kind == "gauss":
        q = rng.standard_normal(d) * 3
    elif kind == "massive":  # one massive activation among ordinary ones
        q = rng.standard_normal(d)
        q[rng.integers(0, d)] = 3e4
    elif kind == "tiny":
        q = rng.standard_normal(d) * 1e-30
    elif kind == "huge":
        q = rng.standard_normal(d) * 1e30
    elif kind == "spanning":  # entries from 1 down to 2^-40: fp16's subnormal range after the row's scaling
        q = rng.choice([-1.0, 1.0], d) * 2.0 ** -rng.uniform(0, 40, d)
    elif kind == "same_sign":  # every product positive: the roundings cannot cancel
        q = np.abs(rng.standard_normal(d)) * 5 + 1
    elif kind == "fp32_bits":  # full fp32 significands: the row's rounding to fp16 is not exact
        q = rng.standard_normal(d) + rng.standard_normal(d) * 2.0**-14
    else:
        raise ValueError(kind)
    return q.astype(np.float32)


@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("qkind,skind,sm,above", [
    ("gauss", "plain", 128**-0.5, 1.0), ("gauss", "spread", 128**-0.5, 1.0), ("gauss", "zero", 128**-0.5, 1.0),
    ("gauss", "plain", 128**-0.5, 2.0**20), ("massive", "plain", 128**-0.5, 1.0), ("tiny", "plain", 2.0**40, 1.0),
    ("huge", "subnormal", 2.0**-8, 1.0), ("spanning", "spread", 1.0, 2.0**10), ("same_sign", "plain", 128**-0.5, 1.0),
    ("same_sign", "largest", 2.0**-20, 1.0), ("fp32_bits", "plain", 128**-0.5, 1.0), ("gauss", "subnormal", 2.0**8, 2.0**30),
])
def test_the_kernels_logit_stays_within_its_slack(bits, group, qkind, skind, sm, above):
    """``above``: the tile's largest scale over the token's own (another token sets the tile's unit,
    so this token's keys sit low in fp16's range, down into its subnormals)."""
    rng = np.random.default_rng(bits * 1000 + group + len(qkind) * 7 + len(skind) + int(math.log2(above)))
    ng = fk.D // group
    for trial in range(3):
        q = _query(rng, qkind)
        scales = _scales(rng, skind, ng).astype(np.float32)
        if qkind == "same_sign":  # codes of one sign, the largest: every rounding pushes the same way
            n = np.full(fk.D, 127 if trial % 2 else -128)
        else:
            n = rng.integers(-128, 128, fk.D)
        n[:2] = [-128, 127]
        r = rng.integers(0, 2**bits, fk.D)
        r[:2] = [0, 2**bits - 1]
        num = fk.numerator(n, r, bits)
        e_unit = fk.tile_unit_exponent(float(np.float32(scales.max() * above)))
        hi = fk.key_hi(num, scales, e_unit, bits, group)
        lo = fk.rest_norm(num, scales, e_unit, bits, group)
        row = fk.row_h(q, sm, group)
        z = fk.kernel_logit(row["qh"], hi, row["f"], e_unit)
        if not np.isfinite(z):
            continue  # the kernel clamps an overflow and makes its radius +inf
        exact = fk.exact_logit(q, num, scales, sm, bits, group)
        slack = fk.logit_slack(row["W"], scales, n2=row["n2"], lo=lo, sm=sm, e_unit=e_unit) * (1 + 2.0**-20)
        tail = 2.0**-100 + 2.0**-150
        assert abs(z - exact) <= slack + tail + abs(exact) * 2.0**-52, (qkind, skind, trial, z, exact, slack)


def test_an_fp16_query_is_held_exactly():
    rng = np.random.default_rng(11)
    q = (rng.standard_normal(fk.D) * 3).astype(np.float16).astype(np.float32)
    row = fk.row_h(q, 128**-0.5, 32)
    assert (row["res"] == 0).all()
    assert np.isfinite(row["f"]) and row["f"] > 0
    assert 2.0**14 <= np.abs(row["qh"].astype(np.float64)).max() < 2.0**15


@pytest.mark.parametrize("dtype,lo,hi", [(np.float16, 0.045, 0.065), (np.float32, 0.13, 0.17)])
def test_the_slack_is_a_small_part_of_the_radius_on_gaussian_rows(dtype, lo, hi):
    """What the route costs in tightness: the slack over the probabilistic radius's main term
    (lf sm sqrt(sum_g ||q_g||^2 s_g^2 / 12), lf at delta 1e-6 and 4,096 tokens), on codes spread as
    a Gaussian key's (sigma 40 code units), the tile's unit from scales up to twice the token's:
    about 5.4% (largest 6.4%) for fp16 (and bf16) queries, which fp16 holds exactly (the accumulation of two
    halves of 64 products and the key's rounding to fp16 through Cauchy-Schwarz, sm n_g r_K L_g), and about
    15% (largest 18%) for fp32 queries, whose rounding to fp16 (2^-12 relative) joins the slack through
    128.5 R_g (the keys in code units with chains of 32 products, before: 4.9% and 14.4% on the same rows;
    one accumulator of 128 products: 6.6% and 16%)."""
    rng = np.random.default_rng(2)
    sm, lf = 128**-0.5, np.sqrt(2 * np.log(2 * 4096 / 1e-6))
    ratios = []
    for _ in range(20):
        q = _query(rng, "gauss").astype(dtype).astype(np.float32)
        s = _scales(rng, "plain", 4).astype(np.float32)
        n = np.clip(np.round(rng.standard_normal(fk.D) * 40), -128, 127).astype(np.int64)
        num = fk.numerator(n, rng.integers(0, 256, fk.D), 8)
        e_unit = fk.tile_unit_exponent(float(s.max()) * rng.uniform(1.0, 2.0))
        row = fk.row_h(q, sm, 32)
        spread = lf * sm * np.sqrt(np.sum((np.linalg.norm(q.reshape(4, 32), axis=1) * s) ** 2) / 12)
        lo_ = fk.rest_norm(num, s, e_unit, 8, 32)
        ratios.append(fk.logit_slack(row["W"], s, n2=row["n2"], lo=lo_, sm=sm, e_unit=e_unit) / spread)
    assert lo < np.median(ratios) < hi
