"""The CUDA extend's fp16 keys in code units (witcert/kernels/f16keys.py, the specification of
witcert/kernels/cuda/extend.cu's ``key_hi``, ``lo_norm``, ``row_exponent_h``, ``q_row_h`` and the tile
loop's combination; docs/PROOFS.md 5.4, "the CUDA extend's fp16 keys"), on the CPU: the fp16 key of
every code and dither and its rest's norm ``L_g``, and one admissible run of the kernel's logit (fp32
accumulation in the kernel's order) within the slack ``sum_g (W_g s_g + sm ||q_g||_2 s_g L_g)`` the
radius carries, against
the exact logit, on Gaussian, massive, tiny, huge and same-sign rows, spread, subnormal and largest
scales, extreme codes and dither. The tensor cores' own accumulation is the signed model's
(checked on the GPU by tests/test_tc_signed_dot.py); the GPU tests of the extend check the
kernel's logits against the exact ones within its radii."""

from __future__ import annotations

import numpy as np
import pytest

from witcert.kernels import f16keys as fk
from witcert.ref.arith import tc_beta


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


@pytest.mark.parametrize("bits", [8, 16])
def test_the_fp16_key_of_every_code_and_dither(bits):
    num = _all_numerators(bits)
    hi = fk.key_hi(num, bits)
    assert np.isfinite(hi).all()
    v = num.astype(np.float64) * 2.0 ** -(bits + 1)  # exact: |N| < 2^25
    h = hi.astype(np.float64)
    assert np.abs(h).max() <= fk.K_MAX
    assert (np.abs(v - h) <= np.abs(v) * 2.0**-11 + 2.0**-25).all()  # fp16's rounding (through fp32 at b 16)
    assert (h * 2.0 ** (bits + 1) == np.round(h * 2.0 ** (bits + 1))).all()  # the rest is an exact integer
    if bits == 8:
        assert (np.abs(v - h) > 0).any()  # 17-bit numerators: one fp16 value does not hold them all


@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_lo_norm_is_the_rests_norm(bits, group):
    rng = np.random.default_rng(bits + group)
    num = fk.numerator(rng.integers(-128, 128, (50, fk.D)), rng.integers(0, 2**bits, (50, fk.D)), bits)
    num[0] = fk.numerator(np.full(fk.D, 127), np.zeros(fk.D, np.int64), bits)  # the largest codes
    rest = num.astype(np.float64) * 2.0 ** -(bits + 1) - fk.key_hi(num, bits).astype(np.float64)
    want = np.linalg.norm(rest.reshape(50, -1, group), axis=-1)
    got = fk.lo_norm(num, bits, group)
    assert got.shape == (50, fk.D // group)
    np.testing.assert_allclose(got, want, rtol=1e-15, atol=0)
    assert (got <= 2.0**-4 * np.sqrt(group)).all()  # half an fp16 ulp at 128 a channel


def test_the_chain_coefficient_covers_its_parts_and_stays_small():
    c = fk.chain_coef()
    assert c >= tc_beta(fk.CHAIN) * fk.K_MAX
    assert c < 3.1e-3  # about 1.5 times the probabilistic radius's bias term at b = 8 (2^-9)


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
@pytest.mark.parametrize("qkind,skind,sm", [
    ("gauss", "plain", 128**-0.5), ("gauss", "spread", 128**-0.5), ("gauss", "zero", 128**-0.5),
    ("massive", "plain", 128**-0.5), ("tiny", "plain", 2.0**40), ("huge", "subnormal", 2.0**-8),
    ("spanning", "spread", 1.0), ("same_sign", "plain", 128**-0.5), ("same_sign", "largest", 2.0**-20),
    ("fp32_bits", "plain", 128**-0.5), ("gauss", "subnormal", 2.0**8),
])
def test_the_kernels_logit_stays_within_its_slack(bits, group, qkind, skind, sm):
    rng = np.random.default_rng(bits * 1000 + group + len(qkind) * 7 + len(skind))
    ng = fk.D // group
    for trial in range(3):
        q = _query(rng, qkind)
        scales = _scales(rng, skind, ng)
        if qkind == "same_sign":  # codes of one sign, the largest: every rounding pushes the same way
            n = np.full(fk.D, 127 if trial % 2 else -128)
        else:
            n = rng.integers(-128, 128, fk.D)
        n[:2] = [-128, 127]
        r = rng.integers(0, 2**bits, fk.D)
        r[:2] = [0, 2**bits - 1]
        num = fk.numerator(n, r, bits)
        hi, lo = fk.key_hi(num, bits), fk.lo_norm(num, bits, group)
        row = fk.row_h(q, sm, group)
        z = fk.kernel_logit(row["qh"], hi, scales, row["f"], group)
        if not np.isfinite(z):
            continue  # the kernel clamps an overflow and makes its radius +inf
        exact = fk.exact_logit(q, num, scales, sm, bits, group)
        slack = fk.logit_slack(row["W"], scales, q=q, lo=lo, sm=sm) * (1 + 2.0**-20)
        tail = 2.0**-100 + row["f"] * 2.0**-147
        assert abs(z - exact) <= slack + tail + abs(exact) * 2.0**-52, (qkind, skind, trial, z, exact, slack)


def test_an_fp16_query_is_held_exactly():
    rng = np.random.default_rng(11)
    q = (rng.standard_normal(fk.D) * 3).astype(np.float16).astype(np.float32)
    row = fk.row_h(q, 128**-0.5, 32)
    assert (row["res"] == 0).all()
    assert np.isfinite(row["f"]) and row["f"] > 0
    assert 2.0**14 <= np.abs(row["qh"].astype(np.float64)).max() < 2.0**15


@pytest.mark.parametrize("dtype,lo,hi", [(np.float16, 0.03, 0.07), (np.float32, 0.10, 0.20)])
def test_the_slack_is_a_small_part_of_the_radius_on_gaussian_rows(dtype, lo, hi):
    """What the route costs in tightness: the slack over the probabilistic radius's main term
    (lf sm sqrt(sum_g ||q_g||^2 s_g^2 / 12), lf at delta 1e-6 and 4,096 tokens), on codes spread as
    a Gaussian key's (sigma 40 code units): near 5% for fp16 (and bf16) queries, which fp16 holds
    exactly (0.65% the accumulation and combination, the rest the key's rounding to fp16 through
    Cauchy-Schwarz, sm ||q_g||_2 s_g L_g), and near 15% for fp32 queries, whose rounding to fp16
    (2^-12 relative) joins the slack through 128.5 R_g. (Codes spread evenly over the int8 range:
    near 8% and 18%, largest 9.4% and 21%.)"""
    rng = np.random.default_rng(2)
    sm, lf = 128**-0.5, np.sqrt(2 * np.log(2 * 4096 / 1e-6))
    ratios = []
    for _ in range(20):
        q = _query(rng, "gauss").astype(dtype).astype(np.float32)
        s = _scales(rng, "plain", 4)
        n = np.clip(np.round(rng.standard_normal(fk.D) * 40), -128, 127).astype(np.int64)
        num = fk.numerator(n, rng.integers(0, 256, fk.D), 8)
        row = fk.row_h(q, sm, 32)
        spread = lf * sm * np.sqrt(np.sum((np.linalg.norm(q.reshape(4, 32), axis=1) * s) ** 2) / 12)
        ratios.append(fk.logit_slack(row["W"], s, q=q, lo=fk.lo_norm(num, 8, 32), sm=sm) / spread)
    assert lo < np.median(ratios) < hi
