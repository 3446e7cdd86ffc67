"""The CUDA extend's logits from aligned keys (docs/PROOFS.md 5.4, "the CUDA extend's aligned keys";
witcert/kernels/cuda/extend.cu: the staging pass's planes, ``row_exponent``, ``aligned_value``,
``row_slack``), checked on the CPU through ``witcert.kernels.aligned``, an exact emulation of the
kernel's integer and fp32 steps.

One query row (D = 128 channels, groups of 32 or 128) against one stored key: the staging pass's
integer K = round(k^ 2^16 / U_t) of the reference's exact dequantized key k^ = s_g (n - xi), its three
signed byte planes, the row's int8 digits at one exponent, the six kept integer dots, their pieces,
the kernel's fp32 roundings (each emulated exactly, round to nearest even), the row factor and U_t.
Checks: the planes and the pieces stay inside the ranges the kernel relies on (b_0 a signed byte,
the five pieces below 2^22: exact through the fp32 bits of 1.5 * 2^23) at every extreme of codes
(-128 included, which the writer never stores), dither, digits and scales; and the kernel's logit is within the group residual slack sum_g W_g s_g plus
T_r U_t of sm q . k^ (q the fp32 query, k^ exact) for random, massive, spanning, tiny and huge
queries and scales, fp16 subnormal scales and zero groups, sm from 2^-8 to 2^40, and on 1,000 random rows
(scales spread up to 2^30 within a token, queries at any magnitude).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from witcert.kernels.aligned import D, kernel_logit, key_int, row_slack, split_row, stage_key, unit_exponent

def check_row(q, n, r, scales, bits, sm):
    K, planes, U, kx = stage_key(n, r, scales, bits)
    d, e, res = split_row(q, sm, group=D // len(scales))
    z, pieces, f = kernel_logit(d, e, planes, U, sm)
    for pc in pieces:
        assert abs(pc) < 1 << 22, pieces
    if abs(z) >= 2 ** 128:
        return None  # an overflowing logit: flagged by the kernel (u = +inf)
    exact = Fraction(sm) * sum(Fraction(float(q[c])) * kx[c] for c in range(D))
    w = sum(Fraction(255, 2) * res[g] * Fraction(sm) * Fraction(scales[g]) for g in range(len(scales))
            if math.isfinite(scales[g]))
    bound = w + row_slack(d, f) * U + Fraction(2) ** -100
    err = abs(z - exact)
    assert err <= bound, (float(err), float(bound))
    return float(err / bound) if bound > 0 else 0.0


def fp16(x: float) -> float:
    return float(np.float16(x))


SCALE_SETS = [
    [fp16(0.0123)] * 4,
    [fp16(0.0123), fp16(3.1e-3), fp16(40.0), fp16(0.5)],        # one group 3,000x the others
    [fp16(6.0e-8), fp16(3.0e-5), 0.0, fp16(1.0e-4)],             # fp16 subnormal and zero groups
    [fp16(65504.0), fp16(60000.0), fp16(1.0), fp16(2.0 ** -14)],  # the largest fp16 scales
    [0.0, 0.0, 0.0, 0.0],
    [fp16(0.0213)],                                                # one group of 128 channels
]


def queries(rng):
    yield "gaussian", rng.standard_normal(D).astype(np.float32)
    m = rng.standard_normal(D).astype(np.float32)
    m[3] = 3.0e4
    yield "massive", m
    yield "span", (rng.standard_normal(D) * 2.0 ** rng.integers(-30, 1, size=D)).astype(np.float32)
    yield "tiny", (rng.standard_normal(D) * 2.0 ** -120).astype(np.float32)
    h = (rng.standard_normal(D) * 2.0 ** 100).astype(np.float32)
    h[5] = np.float32(2.0 ** 126)
    yield "beyond 2^124", h


@pytest.mark.parametrize("bits", [8, 16])
def test_aligned_keys_logit_within_the_residual_and_row_slack(bits):
    rng = np.random.default_rng(bits)
    worst = 0.0
    for sm in (0.08838834764831845, 2.0 ** -8, 4.0, 2.0 ** 40):  # 2^40: the row factor's upper clamp
        for scales in SCALE_SETS:
            for name, q in queries(rng):
                for i in range(3):
                    n = rng.integers(-127, 128, size=D)
                    r = rng.integers(0, 1 << bits, size=D)
                    if i == 2:  # codes and dither at their ends, signs against the query's
                        n = np.where(q >= 0, 127, -127)
                        r = np.where(q >= 0, 0, (1 << bits) - 1)
                    got = check_row(q, n, r, scales, bits, sm)
                    if got is not None:
                        worst = max(worst, got)
    assert worst <= 1.0


def random_row(rng):
    """One random (query, codes, dither, scales, bits, sm): group scales anywhere in fp16's range
    (a spread up to 2^30 within a token, zero groups, subnormals), Gaussian, Cauchy, spanning,
    massive-channel and near-tie queries at any magnitude, sm from 2^-10 to 2^40, random codes and
    dither or their ends against the query's signs."""
    bits, G = int(rng.choice([8, 16])), int(rng.choice([1, 4]))
    base, spread = rng.uniform(-26, 16), rng.uniform(0, 30)
    scales = [fp16(min(65504.0, 2.0 ** (base - rng.uniform(0, spread)) * rng.uniform(1, 2))) for _ in range(G)]
    if rng.random() < 0.2:
        scales[int(rng.integers(G))] = 0.0
    kind = int(rng.integers(5))
    if kind == 0:
        q = rng.standard_normal(D)
    elif kind == 1:
        q = rng.standard_cauchy(D)
    elif kind == 2:
        q = rng.standard_normal(D) * 2.0 ** rng.integers(-40, 40, size=D)
    elif kind == 3:
        q = rng.standard_normal(D)
        q[rng.integers(D, size=3)] *= 2.0 ** rng.uniform(5, 20)
    else:
        q = np.where(rng.random(D) < 0.5, -1.0, 1.0) * 2.0 ** int(rng.integers(-8, 8)) * (1 - 2.0 ** -24 * rng.integers(0, 3, size=D))
    q = (q * 2.0 ** rng.uniform(-60, 60)).astype(np.float32)
    q = np.where(np.isfinite(q), q, np.float32(1.0))
    n, r = rng.integers(-127, 128, size=D), rng.integers(0, 1 << bits, size=D)
    if rng.random() < 0.3:
        n, r = np.where(q >= 0, 127, -127), np.where(q >= 0, 0, (1 << bits) - 1)
    return q, n, r, scales, bits, float(2.0 ** rng.uniform(-10, 40))


def test_aligned_keys_logit_within_the_bound_on_random_rows():
    """1,000 random rows of every kind random_row draws: each logit within its bound (check_row)."""
    rng = np.random.default_rng(20261205)
    checked = [check_row(*random_row(rng)) for _ in range(1000)]
    assert sum(c is not None for c in checked) >= 900  # most rows are finite (the rest flagged)


@pytest.mark.parametrize("bits", [8, 16])
def test_aligned_keys_planes_and_pieces_stay_in_range_at_the_extremes(bits):
    """Digits at +-64 with every sign pattern per digit, codes at +-127 and dither integers at their
    ends, the largest fp16 significand at every exponent where it sets U_t (and subnormal scales):
    b_0 a signed byte and the five pieces below 2^22, also for a code of -128 (never written)."""
    big = [float(np.float16(2047 * 2.0 ** (e - 10))) for e in (-14, -3, 0, 7, 15)]
    for sd in range(8):
        d = np.stack([np.full(D, 64 if (sd >> j) & 1 else -64) for j in range(3)]).astype(np.int64)
        for sn in (127, -127, -128):
            for rr in (0, (1 << bits) - 1):
                n, r = np.full(D, sn), np.full(D, rr)
                for scales in [[b, b, b, b] for b in big] + [[fp16(2.0 ** -24)] * 4, [65504.0, 1.0, 1.0, 1.0]]:
                    _, planes, U, _ = stage_key(n, r, scales, bits)
                    _, pieces, _ = kernel_logit(d, 0, planes, U, 0.125)
                    assert all(abs(pc) < 1 << 22 for pc in pieces), pieces


@pytest.mark.parametrize("bits", [8, 16])
def test_the_row_slack_is_reached_within_a_small_factor_by_aligned_key_roundings(bits):
    """A query its digits hold exactly (no residual: the bound is T_r U_t alone) against keys whose
    dither makes every channel's rounding to K push the logit the same way: the kernel's error stays
    below T_r U_t and reaches more than half of the bound's key-rounding term, f U_t A' / 2 (the
    dots left out and the roundings, the rest of T_r, cannot be aligned by the keys alone)."""
    q = np.where(np.arange(D) % 3 == 0, -63.0, 63.0).astype(np.float32)
    scales = [fp16(0.0123), fp16(0.0117), fp16(0.0101), fp16(0.0089)]
    rng = np.random.default_rng(7)
    n = rng.integers(-127, 128, size=D)
    et = unit_exponent(scales, bits)
    r = np.zeros(D, dtype=np.int64)
    for c in range(D):  # the dither value whose rounding error, times the query's sign, is largest
        def gap(rr):
            k, x = key_int(int(n[c]), rr, scales[c // 32], et, bits)
            return (Fraction(k) * Fraction(2) ** et / 65536 - x) * (1 if q[c] > 0 else -1)
        r[c] = max(range(0, 1 << bits, max(1, (1 << bits) // 256)), key=gap)
    K, planes, U, kx = stage_key(n, r, scales, bits)
    d, e, res = split_row(q, 0.125)
    assert sum(res) == 0
    z, _, f = kernel_logit(d, e, planes, U, 0.125)
    exact = Fraction(1, 8) * sum(Fraction(float(q[c])) * kx[c] for c in range(D))
    err = abs(z - exact)
    assert err <= row_slack(d, f) * U
    ap = sum(Fraction(int(np.abs(d[j]).sum()), 128 ** j) for j in range(3))
    assert err >= f * U * ap / 2 / 2, float(err / (f * U * ap / 2))
