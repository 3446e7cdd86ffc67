"""The CUDA extend's fp16 keys, each carrying its scale: a specification of what
``witcert/kernels/cuda/extend.cu`` computes for one (query row, prefix token) (its staging pass's
``tile_unit_exponent``, ``key_hi`` and ``rest_norm``, ``row_exponent_h``, ``q_row_h`` and the tile
loop's logit; docs/PROOFS.md 5.4, "the CUDA extend's fp16 keys"), for the tests that check the
route's slack and for the launcher, which passes the route's coefficient ``dot_coef()`` to the
kernel. D = 128 channels in two accumulators of 64.

A key channel is ``k^ = s_g v``, ``v = N 2^-(b+1)`` with the reference's exact odd numerator
``N = n 2^(b+1) - 2 r + 2^b - 1``. The staging pass picks per tile a power of two ``r_K = 2^E`` with
``128.5 S_T <= 2^(E+15)`` (``S_T`` the tile's largest scale) and holds ``k^ / r_K`` (exact in
float64) as one fp16 value ``hi`` (rounded to nearest, so ``|hi| <= 2^15``); the row is ``2^e q_h``
(``q_h`` fp16). The tensor cores form ``C_0`` and ``C_1``, the dots of channels 0-63 and 64-127 (64
exact products each into an fp32 accumulator from 0), ``C = fl(C_0 + C_1)``, and the logit is ``z =
fl(C 2^e sm r_K)``, one rounding. Against ``sm q . k^`` the
error is at most ``sum_g (W_g s_g + sm n_g r_K L_g)`` plus ``2^-150`` (the final rounding below
fp32's normal range): ``L_g = ||k^_g / r_K - hi_g||_2`` the token's rest in its group (rounded up),
``n_g = max(||q_g||_2, (1 + c) ||2^e q_h,g||_2)`` and ``W_g = sm (c 128.5 ||2^e q_h,g||_1 + 128.5
R_g)``, ``R_g = ||q_g - 2^e q_h,g||_1`` the query's rounding, ``c`` the accumulation's and the final
rounding's coefficient (``dot_coef() / 128.5``). Two halves of 64 in place of one chain of 128 halve the
signed model's part of ``c`` (``beta_64``, for one addition a value).
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np

from witcert.ref.arith import U32, tc_beta

D = 128
K_MAX = 128.5  # |v| <= 128.5 for any int8 code and dither
KEY_TOP = 15  # |k^ / r_K| <= 2^15: the staged keys' top binade
E_MIN, E_MAX = -120, 121  # the tile unit's exponent range (r_K a normal fp32 number)
FP16_MAX = 65504.0


HALF = D // 2  # channels per accumulator (two halves, each from 0)


@functools.cache
def dot_rel() -> float:
    """``c``: what the halves' accumulation (the signed model ``tc_beta(HALF)`` each), their sum
    (``U32`` of ``|C_0 + C_1| <= (1 + beta) sum |q_h,i hi_i|``) and the logit's one rounding (``U32``
    of ``|C| <= (1 + U32) (1 + beta) sum |q_h,i hi_i|``) can move a logit, per unit of ``sm 2^e r_K
    sum |q_h,i hi_i|``: ``beta + U32 (1 + beta) (2 + U32)``, rounded up."""
    beta = tc_beta(HALF)
    c = beta + U32 * (1 + beta) * (2 + U32)
    return float(np.nextafter(np.float32(c * (1 + 2.0**-20)), np.float32(np.inf)))


@functools.cache
def dot_coef() -> float:
    """The launcher's ``arith_gamma`` for the kernel's slack weight: ``c 128.5`` (``|hi_i| r_K`` is
    at most ``|k^_i| + r_K |rest_i|``; the rest's part rides on ``n_g``), rounded up."""
    return float(np.nextafter(np.float32(dot_rel() * K_MAX * (1 + 2.0**-20)), np.float32(np.inf)))


def tile_unit_exponent(s_max: float) -> int:
    """``E`` of the tile's key unit ``r_K = 2^E``: the least ``E`` with ``128.5 s_max < 2^(E + 16)``
    and ``128.5 s_max <= 2^(E + 15)`` (frexp of ``128.5 s_max`` in float64: ``m 2^k``, ``m`` in
    ``[1/2, 1)``, ``E = k - 15``), clamped to ``[E_MIN, E_MAX]``; 0 for a tile without a scale."""
    if not s_max > 0:
        return 0
    _, k = math.frexp(K_MAX * float(s_max))
    return min(max(k - KEY_TOP, E_MIN), E_MAX)


def numerator(n: np.ndarray, r: np.ndarray, bits: int) -> np.ndarray:
    """``N = n 2^(b+1) - 2 r + 2^b - 1`` for int8 codes ``n`` and dither integers ``r`` (int64)."""
    return np.asarray(n, np.int64) * 2 ** (bits + 1) - 2 * np.asarray(r, np.int64) + 2**bits - 1


def key_scaled(num: np.ndarray, scales: np.ndarray, e_unit: int, bits: int, group: int) -> np.ndarray:
    """``k^ / r_K`` in float64 (exact: a 24-bit scale times a numerator below 2^25, times a power of
    two): [..., D] from numerators [..., D] and group scales [..., D // group] (a flagged key, a
    non-finite scale or a dead token: scale 0)."""
    num = np.asarray(num, dtype=np.int64)
    s = np.repeat(np.asarray(scales, dtype=np.float32).astype(np.float64), group, axis=-1)
    return s * num.astype(np.float64) * 2.0 ** (-(bits + 1) - e_unit)


def key_hi(num: np.ndarray, scales: np.ndarray, e_unit: int, bits: int, group: int) -> np.ndarray:
    """The staging pass's fp16 keys: ``k^ / r_K`` rounded to the nearest fp16 value (from float64 at
    once, as ``__double2half``)."""
    return key_scaled(num, scales, e_unit, bits, group).astype(np.float16)


def rest_norm(num: np.ndarray, scales: np.ndarray, e_unit: int, bits: int, group: int) -> np.ndarray:
    """``L_g >= ||k^_g / r_K - hi_g||_2`` per group (float64 [..., D // group]): the rests are exact in
    float64 (``x - hi`` with ``hi`` within an fp16 ulp of ``x``); the kernel sums their squares and
    takes the root rounding upward. Here: the exact sum in rationals, its root rounded up."""
    x = key_scaled(num, scales, e_unit, bits, group)
    rest = x - key_hi(num, scales, e_unit, bits, group).astype(np.float64)
    shape = rest.shape[:-1]
    flat = rest.reshape(-1, D // group, group)
    out = np.empty(flat.shape[:2])
    for i in range(flat.shape[0]):
        for g in range(flat.shape[1]):
            ss = sum((Fraction(float(v)) ** 2 for v in flat[i, g]), Fraction(0))
            out[i, g] = _sqrt_up(ss)
    return out.reshape(*shape, D // group)


def _sqrt_up(x: Fraction) -> float:
    """The least float64 >= sqrt(x) (x >= 0 rational)."""
    if x == 0:
        return 0.0
    r = math.sqrt(float(x))
    while Fraction(r) ** 2 < x:
        r = math.nextafter(r, math.inf)
    return r


def row_exponent_h(amax: float, sm: float) -> int:
    """extend.cu's ``row_exponent_h``: fp32 exponent of ``amax`` minus 14, within the range that
    keeps ``2^e sm`` a finite normal fp32 number."""
    sm_e = int(np.frexp(np.float32(sm))[1]) - 1
    e_lo, e_hi = max(-125, -126 - sm_e), min(125, 126 - sm_e)
    a_e = int(np.frexp(np.float32(amax))[1]) - 1 if amax > 0 else -127
    return min(max(a_e - 14, e_lo), e_hi)


def row_h(q: np.ndarray, sm: float, group: int, c_coef: float | None = None) -> dict:
    """One query row (fp32 [D], finite) as ``q_row_h`` splits it: ``e``, ``qh`` (fp16 [D]), per group
    ``W`` (the slack weight, float64, before the kernel's fp32 rounding up), ``n2`` (``n_g``), ``dab``
    (``||2^e q_h,g||_1``) and ``res`` (``R_g``), and the row factor ``f = 2^e sm``."""
    q = np.asarray(q, dtype=np.float32)
    c_coef = dot_coef() if c_coef is None else c_coef
    e = row_exponent_h(float(np.abs(q).max()), sm)
    e1, e2 = e >> 1, e - (e >> 1)
    y = (q * np.float32(2.0**-e1)) * np.float32(2.0**-e2)
    qh = np.clip(y, -FP16_MAX, FP16_MAX).astype(np.float16)
    rec = qh.astype(np.float64) * 2.0**e
    ng = D // group
    dab = np.abs(rec).reshape(ng, group).sum(-1)
    res = np.abs(q.astype(np.float64) - rec).reshape(ng, group).sum(-1)
    w = (c_coef * dab + K_MAX * res) * sm
    n2 = np.maximum(np.linalg.norm(q.astype(np.float64).reshape(ng, group), axis=1),
                    (1 + dot_rel()) * np.linalg.norm(rec.reshape(ng, group), axis=1))
    f = float(np.float32(sm) * np.float32(2.0 ** e1) * np.float32(2.0 ** e2))
    return dict(e=e, qh=qh, W=w, n2=n2, dab=dab, res=res, f=f)


def kernel_logit(qh: np.ndarray, hi: np.ndarray, f: float, e_unit: int) -> float:
    """One admissible run of the kernel's logit: each half's 64 products summed in fp32 in the
    kernel's order (channel by channel, from 0), the halves added in fp32, then ``C 2^e sm r_K``
    rounded once to fp32 (exact in float64 first: ``f`` and ``C`` have 24 significant bits each,
    ``r_K`` is a power of two). The tensor cores may round otherwise, within the signed model the
    bound takes; this is one run inside it."""
    half = []
    for h in range(2):
        acc = np.float32(0.0)
        for i in range(HALF * h, HALF * (h + 1)):
            acc = np.float32(acc + np.float32(qh[i]) * np.float32(hi[i]))
        half.append(acc)
    return float(np.float32(float(np.float32(half[0] + half[1])) * f * 2.0**e_unit))


def logit_slack(w: np.ndarray, scales: np.ndarray, n2: np.ndarray | None = None, lo: np.ndarray | None = None,
                sm: float = 0.0, e_unit: int = 0) -> float:
    """The slack the radius's sums carry for a token with group scales ``scales``: ``sum_g W_g s_g``,
    plus ``sum_g sm n_g r_K L_g`` given the row's ``n2`` (``n_g``) and the token's ``lo`` (``L_g``)."""
    out = float(np.sum(np.asarray(w, np.float64) * np.asarray(scales, np.float64)))
    if n2 is not None:
        out += float(np.sum(sm * np.asarray(n2, np.float64) * 2.0**e_unit * np.asarray(lo, np.float64)))
    return out


def exact_logit(q: np.ndarray, num: np.ndarray, scales: np.ndarray, sm: float, bits: int, group: int) -> float:
    """``sm q . k^`` in exact rational arithmetic rounded once to float64 (fp32 query, ``k^ = s_g N
    2^-(b+1)``)."""
    s = Fraction(0)
    for i in range(D):
        s += Fraction(float(q[i])) * Fraction(int(num[i])) * Fraction(float(scales[i // group]))
    return float(s * Fraction(float(sm)) / 2 ** (bits + 1))


__all__ = ["D", "E_MAX", "HALF", "E_MIN", "KEY_TOP", "K_MAX", "dot_coef", "dot_rel", "exact_logit", "kernel_logit",
           "key_hi", "key_scaled", "logit_slack", "numerator", "rest_norm", "row_exponent_h", "row_h",
           "tile_unit_exponent"]
