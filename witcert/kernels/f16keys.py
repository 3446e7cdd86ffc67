"""The CUDA extend's fp16 keys in code units: a specification of what
``witcert/kernels/cuda/extend.cu`` computes for one (query row, prefix token) (its staging pass's
``key_hi`` and ``lo_norm``, ``row_exponent_h``, ``q_row_h`` and the tile loop's combination;
docs/PROOFS.md 5.4, "the CUDA extend's fp16 keys"), for the tests that check the route's slack and
for the launcher, which passes the route's coefficient ``chain_coef()`` to the kernel. D = 128
channels in four accumulator chains of 32 (each inside one scale group).

A key channel is ``k^ = s_g v``, ``v = N 2^-(b+1)`` with the reference's exact odd numerator
``N = n 2^(b+1) - 2 r + 2^b - 1``; the kernel holds ``v`` as one fp16 value ``hi`` (``v`` rounded to
fp16) and the row as ``2^e q_h`` (``q_h`` fp16), forms each chain's dot ``C_j = q_h . hi`` on tensor
cores (32 exact products into fp32) and the logit ``z = fl(fl(sum_j s_j C_j) 2^e sm)``. Against ``sm
q . k^`` the error is at most ``sum_g (W_g s_g + sm ||q_g||_2 s_g L_g)`` plus a tail: ``L_g = ||v_g -
hi_g||_2``, the token's rest in its group (Cauchy-Schwarz: a row entry times a token entry, carried
by the radius's tensor-core sums), and the row's slack weight ``W_g = sm (c_acc ||2^e q_h,g||_1 +
128.5 R_g + 2^(e-126) 130 G / 32)``, ``R_g = ||q_g - 2^e q_h,g||_1`` the query's rounding.
"""

from __future__ import annotations

import numpy as np

from witcert.ref.arith import U32, gamma, tc_beta

D = 128
CHAIN = 32  # channels (exact products) per accumulator chain
CHAINS = D // CHAIN
K_MAX = 128.5  # |hi| (|v| <= 128.5 for any int8 code, and 128.5 is an fp16 value)
FP16_MAX = 65504.0


def chain_coef() -> float:
    """``c_acc``: what the chain's accumulation (the signed model ``tc_beta(CHAIN)`` on ``|hi| <=
    K_MAX``) and the combination's ``CHAINS`` roundings plus the row factor's one (``gamma(CHAINS +
    1)`` on ``|C_j| <= (1 + beta) K_MAX ||q_h||_1``) can move a logit, per unit of ``sm ||2^e
    q_h,g||_1 s_g``; rounded up. (The key's rounding to fp16 is the token's ``L_g``, not here.)"""
    beta = tc_beta(CHAIN)
    c = beta * K_MAX + gamma(CHAINS + 1, U32) * (1 + beta) * K_MAX
    return float(np.nextafter(np.float32(c * (1 + 2.0**-20)), np.float32(np.inf)))


def key_hi(num: np.ndarray, bits: int) -> np.ndarray:
    """The staging pass's ``key_hi``: int numerators ``N`` -> fp16 ``hi`` (``N 2^-(b+1)`` rounded to
    fp32, exact where ``|N| <= 2^24``, then to fp16)."""
    unit = np.float32(2.0 ** -(bits + 1))
    return (np.asarray(num, dtype=np.int64).astype(np.float32) * unit).astype(np.float16)


def lo_norm(num: np.ndarray, bits: int, group: int) -> np.ndarray:
    """``L_g = ||v_g - hi_g||_2`` per group of ``group`` channels (float64 [..., D // group]) as the
    staging pass forms it: the rests ``N - hi 2^(b+1)`` are exact integers, their squares' sum exact
    in float64 (below 2^53), one correctly rounded root, times ``2^-(b+1)`` (exact)."""
    num = np.asarray(num, dtype=np.int64)
    rest = num - (key_hi(num, bits).astype(np.float64) * 2.0 ** (bits + 1)).astype(np.int64)
    ss = (rest.astype(np.float64) ** 2).reshape(*rest.shape[:-1], -1, group).sum(-1)
    return np.sqrt(ss) * 2.0 ** -(bits + 1)


def numerator(n: np.ndarray, r: np.ndarray, bits: int) -> np.ndarray:
    """``N = n 2^(b+1) - 2 r + 2^b - 1`` for int8 codes ``n`` and dither integers ``r`` (int64)."""
    return np.asarray(n, np.int64) * 2 ** (bits + 1) - 2 * np.asarray(r, np.int64) + 2**bits - 1


def row_exponent_h(amax: float, sm: float) -> int:
    """extend.cu's ``row_exponent_h``: fp32 exponent of ``amax`` minus 14, within the range that
    keeps ``2^e sm`` a finite normal fp32 number."""
    sm_e = int(np.frexp(np.float32(sm))[1]) - 1
    e_lo, e_hi = max(-125, -126 - sm_e), min(125, 126 - sm_e)
    a_e = int(np.frexp(np.float32(amax))[1]) - 1 if amax > 0 else -127
    return min(max(a_e - 14, e_lo), e_hi)


def row_h(q: np.ndarray, sm: float, group: int, c_acc: float | None = None) -> dict:
    """One query row (fp32 [D], finite) as ``q_row_h`` splits it: ``e``, ``qh`` (fp16 [D]),
    per group ``W`` (the slack weight, float64, before the kernel's fp32 rounding up), ``dab``
    (``||2^e q_h,g||_1``) and ``res`` (``R_g``), and the row factor ``f = 2^e sm``."""
    q = np.asarray(q, dtype=np.float32)
    c_acc = chain_coef() if c_acc is None else c_acc
    e = row_exponent_h(float(np.abs(q).max()), sm)
    e1, e2 = e >> 1, e - (e >> 1)
    y = (q * np.float32(2.0**-e1)) * np.float32(2.0**-e2)
    qh = np.clip(y, -FP16_MAX, FP16_MAX).astype(np.float16)
    rec = qh.astype(np.float64) * 2.0**e
    ng = D // group
    dab = np.abs(rec).reshape(ng, group).sum(-1)
    res = np.abs(q.astype(np.float64) - rec).reshape(ng, group).sum(-1)
    w = (c_acc * dab + 128.5 * res + 2.0 ** (e - 126) * 130.0 * (group // CHAIN)) * sm
    f = float(np.float32(sm) * np.float32(2.0 ** e1) * np.float32(2.0 ** e2))
    return dict(e=e, qh=qh, W=w, dab=dab, res=res, f=f)


def kernel_logit(qh: np.ndarray, hi: np.ndarray, scales: np.ndarray, f: float, group: int) -> float:
    """One admissible run of the kernel's logit: each chain's 32 products summed in fp32 in the
    kernel's order, then ``fl(fl(sum_j s_j C_j) f)`` as the tile loop combines it (``scales``: the
    token's group scales). The tensor cores may round otherwise, within the signed model the bound
    takes; this is one run inside it."""
    c = []
    for j in range(CHAINS):
        acc = np.float32(0.0)
        for i in range(CHAIN * j, CHAIN * j + CHAIN):
            acc = np.float32(acc + np.float32(qh[i]) * np.float32(hi[i]))
        c.append(acc)
    s = [np.float32(scales[(CHAIN * j) // group]) for j in range(CHAINS)]
    zz = np.float32(c[0] * s[0])
    for j in range(1, CHAINS):
        # an fma: the product exact in float64, the sum rounded to float64 then fp32 (within the
        # bound's unit roundoff either way)
        zz = np.float32(np.float64(c[j]) * np.float64(s[j]) + np.float64(zz))
    return float(np.float32(zz * np.float32(f)))


def logit_slack(w: np.ndarray, scales: np.ndarray, q: np.ndarray | None = None, lo: np.ndarray | None = None,
                sm: float = 0.0) -> float:
    """The slack the radius's sums carry for a token with group scales ``scales``: ``sum_g W_g s_g``,
    plus ``sum_g sm ||q_g||_2 s_g L_g`` given the fp32 query ``q`` [D] and the token's ``lo`` (``L_g``)."""
    out = float(np.sum(np.asarray(w, np.float64) * np.asarray(scales, np.float64)))
    if q is not None:
        qn = np.linalg.norm(np.asarray(q, np.float64).reshape(len(lo), -1), axis=1)
        out += float(np.sum(sm * qn * np.asarray(scales, np.float64) * np.asarray(lo, np.float64)))
    return out


def exact_logit(q: np.ndarray, num: np.ndarray, scales: np.ndarray, sm: float, bits: int, group: int) -> float:
    """``sm q . k^`` in exact rational arithmetic rounded once to float64 (fp32 query, ``k^ = s_g N
    2^-(b+1)``)."""
    from fractions import Fraction

    s = Fraction(0)
    for i in range(D):
        s += Fraction(float(q[i])) * Fraction(int(num[i])) * Fraction(float(scales[i // group]))
    return float(s * Fraction(float(sm)) / 2 ** (bits + 1))


__all__ = ["CHAIN", "CHAINS", "D", "K_MAX", "chain_coef", "exact_logit", "kernel_logit", "key_hi", "lo_norm",
           "logit_slack", "numerator", "row_exponent_h", "row_h"]
