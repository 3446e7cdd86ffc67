"""The aligned keys, in exact arithmetic: the specification of the q.k route the CUDA extend's
prefix kernel had until 2026-12-07 (int8 digit dots against keys as integers on one unit per
token in three byte planes; BENCHMARKS.md 13o-13ai), kept for ``aligned_slack_study.py``, which
prices it against the fp16 routes. The kernel now takes fp16 keys in code units
(``witcert/kernels/f16keys.py``). Every integer step is the old kernel's, every fp32 rounding is
emulated exactly (``rn32``). D = 128 channels; slow (rational arithmetic), meant for single rows.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

D = 128
KEPT = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (2, 0), (2, 1)]  # the (digit j, plane p) dots the kernel forms


def rn32(x: Fraction) -> Fraction:
    """x rounded to the nearest fp32 value (ties to even); +-inf past the largest."""
    if x == 0:
        return Fraction(0)
    s, a = (1, x) if x > 0 else (-1, -x)
    e = math.floor(math.log2(a))  # may be off by one for huge numerators: fix below
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    q = max(e, -126) - 23  # the ulp's exponent (subnormals: 2^-149)
    m = a / Fraction(2) ** q
    r = math.floor(m)
    rest = m - r
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and r % 2 == 1):
        r += 1
    if r * Fraction(2) ** q >= Fraction(2) ** 128:
        return Fraction(s) * Fraction(10) ** 60  # stands for +-inf: the kernel flags it (u = +inf)
    return s * r * Fraction(2) ** q


def f32bits_exp(x: float) -> int:
    """The biased exponent field of fp32 x."""
    return int(np.array([x], dtype=np.float32).view(np.int32)[0] >> 23) & 0xFF


def unit_exponent(scales: list[float], bits: int) -> int:
    """E_t of a token from its group scales (the staging pass)."""
    smax = max((s for s in scales if math.isfinite(s)), default=0.0)
    return max(f32bits_exp(smax) - 126, -8 - bits) if smax > 0 else 0


def key_int(n: int, r: int, sg: float, et: int, bits: int) -> tuple[int, Fraction]:
    """(K, the exact k^) of one channel: code n, dither integer r, group scale sg, token E_t."""
    es = max(f32bits_exp(sg) - 137, -24)
    m = int(Fraction(sg) / Fraction(2) ** es) if sg > 0 else 0
    assert m < 2048 and Fraction(m) * Fraction(2) ** es == Fraction(sg)
    sh = min(et + bits - 15 - es, 62)
    assert sh >= 1
    num = n * (1 << (bits + 1)) - 2 * r + (1 << bits) - 1
    return (m * num + (1 << (sh - 1))) >> sh, Fraction(sg) * Fraction(num, 1 << (bits + 1))


def stage_key(n: np.ndarray, r: np.ndarray, scales: list[float], bits: int):
    """The staging pass for one token: codes n [D], dither integers r [D], its group scales (fp16
    values, D / len(scales) channels each) -> (K [D] ints, planes [3, D], U_t, the exact k^ [D])."""
    et = unit_exponent(scales, bits)
    group = D // len(scales)
    K, planes, kx = np.zeros(D, dtype=np.int64), np.zeros((3, D), dtype=np.int64), []
    for c in range(D):
        k, x = key_int(int(n[c]), int(r[c]), scales[c // group], et, bits)
        b2 = ((k + 128) & 255) - 128
        k1 = (k - b2) >> 8
        b1 = ((k1 + 128) & 255) - 128
        b0 = (k1 - b1) >> 8
        assert k == 65536 * b0 + 256 * b1 + b2 and -128 <= b0 <= 127  # a signed byte, every int8 code
        K[c], planes[:, c] = k, (b0, b1, b2)
        kx.append(x)
    return K, planes, Fraction(2) ** et, kx


def split_row(q: np.ndarray, sm: float, group: int = 32, *, residuals: bool = True):
    """row_exponent, then q_row at that e: (digits [3, D], e, each group's residual ||q_g - q_d,g||_1
    (exact; [] unless ``residuals``))."""
    f = np.float32
    amax = float(np.abs(q).max())
    sm_e = f32bits_exp(sm) - 127
    e = min(max(f32bits_exp(amax) - 125, max(-125, -103 - sm_e)), min(125, 149 - sm_e))
    y = (q.astype(f) * f(2.0 ** -(e >> 1))) * f(2.0 ** -(e - (e >> 1))) * f(128.0)
    d = np.zeros((3, D), dtype=np.int64)
    for j in range(3):
        dj = np.clip(np.rint(y), -64, 64).astype(f)
        y = (y - dj) * f(128.0)
        d[j] = dj.astype(np.int64)
    res = []
    for g in range(D // group if residuals else 0):
        tot = Fraction(0)
        for c in range(g * group, (g + 1) * group):
            rec = sum(Fraction(int(d[j, c]), 128 ** (j + 1)) for j in range(3)) * Fraction(2) ** e
            tot += abs(Fraction(float(q[c])) - rec)
        res.append(tot)
    return d, e, res


def row_factor(e: int, sm: float) -> Fraction:
    """q_row's factor at FSHIFT = b - 15: ((2^-23 sm) 2^(e>>1)) 2^(e - (e>>1)), each product in fp32."""
    x = rn32(Fraction(2) ** -23 * Fraction(sm))
    x = rn32(x * Fraction(2) ** (e >> 1))
    return rn32(x * Fraction(2) ** (e - (e >> 1)))


def row_slack(d: np.ndarray, f: Fraction) -> Fraction:
    """extend.cu row_slack, exactly (without its final rounding up: a stricter check)."""
    l0, l1, l2 = (int(np.abs(d[j]).sum()) for j in range(3))
    ap = Fraction(l0) + Fraction(l1, 128) + Fraction(l2, 1 << 14)
    t = (Fraction(1, 2) + Fraction(50001, 10000) / 256 * Fraction(128502, 1000)) * ap + l1 + Fraction(1, 128) * l2
    return f * t


def kernel_logit(d, e, planes, U, sm):
    """(the kernel's fp32 logit, its five pieces (A, B, S, R, D21), the row factor f) of one (row, token)
    from the row's digits and exponent and the token's planes and U_t."""
    dots = {(j, p): int((d[j] * planes[p]).sum()) for (j, p) in KEPT}
    A = dots[0, 0]
    B = 2 * dots[1, 0] + dots[0, 1]
    S = 2 * dots[2, 0] + dots[1, 1]
    R = dots[0, 2]
    pieces = (A, B, S, R, dots[2, 1])
    y = rn32(Fraction(dots[2, 1], 64) + 2 * S + R)  # 2 S + R exact (< 2^23)
    x = rn32(Fraction(256 * B) + y)
    v = rn32(Fraction(65536 * A) + x)
    f = row_factor(e, sm)
    return rn32(rn32(v * f) * U), pieces, f
