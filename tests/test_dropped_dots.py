"""The CUDA extend's dropped dots and its combination by integer pieces (docs/PROOFS.md 5.4
"dropped dots" and "the CUDA extend's combination"; witcert/kernels/cuda/common.cuh ``DROP_SMALL``,
``q_row<DROP>``; extend.cu ``piece_consts``, ``piece_value``), checked on the CPU by emulation.

One (query row, scale group, key) term: the query split into three int8 digits as ``q_row`` splits
it, the key's code and dither byte planes, then (a) the exact logit term in rational arithmetic,
(b) the bound the kernel adds for the dots it leaves out, (c) the kept dots combined in fp32: by
the per-digit route (``route``: the decode's combination with the dropped terms left out, any drop
set, ``drop_set`` also builds digit 2's planes alone, a variant the decode was measured with) and by
the extend's integer pieces (``piece_route``, the shipped route). Checks, on random and adversarial
inputs (dither bytes aligned against the digits, a massive channel, components spanning 2^-30, a
query beyond 2^124): the left-out part never exceeds the bound and reaches >= 90% of it when
aligned (so the constant is neither too small nor loose by a factor); the pieces are exact integers
below 2^22 at every sign pattern of the extremes and give exactly the per-digit route's value; both
fp32 routes stay within the slack weight ``sm s (gamma_K 128 A + 127.5 ||delta||_1 + dropped)``.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from witcert.kernels.dequant import combine_roundings
from witcert.ref.arith import U32, gamma

G = 32
f32 = np.float32


def drop_set(kind: str, bits: int) -> set:
    """common.cuh: DROP_SMALL, the (digit j, byte plane p) dots weighing 2^(8p - 7j - b) <= 2^-22 of
    d_0 . n; "digit2": only those of digit 2 (a variant measured on the decode, not shipped)."""
    small = {(j, p) for j in range(3) for p in range(bits // 8) if 8 * p - 7 * j - bits <= -22}
    return small if kind == "small" else {(j, p) for (j, p) in small if j == 2}


def fma(a, b, c):
    """fp32 fused multiply-add (the product is exact in float64; one rounding of the sum, up to
    a double rounding far inside the slack's K roundings)."""
    return f32(float(a) * float(b) + float(c))


def split(q: np.ndarray, dmax: int = 127):
    """q_row's split: (digits [3, G] int, e, residual ||q - rec||_1, A = 2^e sum_j 128^-(j+1) ||d_j||_1);
    dmax: the digits' clamp (q_row's DMAX; the CUDA extend's 64)."""
    amax = float(np.abs(q).max())
    # q_row: e = (biased exponent of max |q|) - 125, clamped, so max |q| 2^-e is in [1/4, 1/2)
    e = min(max(int(np.frexp(f32(amax))[1]) + 1, -125), 125) if amax > 0 else -125
    y = (q.astype(f32) * f32(2.0 ** -(e >> 1))) * f32(2.0 ** -(e - (e >> 1))) * f32(128.0)
    d = np.zeros((3, q.size), dtype=np.int64)
    for j in range(3):
        dj = np.clip(np.rint(y), -dmax, dmax).astype(f32)
        y = (y - dj) * f32(128.0)
        d[j] = dj.astype(np.int64)
    sc = Fraction(2) ** e
    rec = [sum(Fraction(int(d[j, c])) / 128 ** (j + 1) for j in range(3)) * sc for c in range(q.size)]
    res = sum(abs(Fraction(float(q[c])) - rec[c]) for c in range(q.size))
    A = sc * sum(Fraction(int(abs(d[j]).sum())) / 128 ** (j + 1) for j in range(3))
    return d, e, res, A


def dropped_bound(d, e, bits, drop):
    """sum over the dropped (j, p) of 2^(e - b + 7) 256^p 128^-(j+1) ||d_j||_1 (q_row<DROP>'s drof)."""
    tot = Fraction(0)
    for j in range(3):
        for p in range(bits // 8):
            if (j, p) in drop:
                tot += Fraction(256) ** p / 128 ** (j + 1) * int(abs(d[j]).sum())
    return tot * Fraction(2) ** (e - bits + 7)


def key_case(rng, bits, drop, d=None, align=False):
    n = rng.integers(-127, 128, size=G)
    r = rng.integers(0, 1 << bits, size=G)
    if align:  # every dropped plane's byte against its digit's sign: |d_j . rho_p| = 128 ||d_j||_1 where possible
        planes = [(r >> (8 * p)) & 255 for p in range(bits // 8)]
        for j in (2, 1, 0):  # a plane dropped for two digits ends aligned with the heavier (lower j)
            for p in range(bits // 8):
                if (j, p) in drop:
                    planes[p] = np.where(d[j] > 0, 0, np.where(d[j] < 0, 255, planes[p]))  # rho_p = -128 / +127
        r = sum(planes[p].astype(np.int64) << (8 * p) for p in range(bits // 8))
    return n, r


def route(d, e, n, r, bits, drop, *, scale, sm):
    """(the kernel's fp32 group logit over the kept dots, the exact value of what it drops, the
    exact group logit of the digits' reconstruction) for one key."""
    nb = bits // 8
    rho = [((r >> (8 * p)) & 255) - 128 for p in range(nb)]  # signed byte planes
    cb = 1 + 256 * (256 ** (nb - 1) - 1) // 255
    rowf = f32(2.0 ** (bits + 1))
    terms, dropped = [], Fraction(0)
    for j in range(3):
        i_j = int((d[j] * n).sum())
        jj = [int((d[j] * rho[p]).sum()) for p in range(nb)]
        csq = f32(cb * int(d[j].sum()))
        acc = -csq
        k0, k1 = (j, 0) not in drop, nb == 2 and (j, 1) not in drop
        if k0 and k1:
            acc = fma(fma(jj[1], 256.0, jj[0]), -2.0, acc)
        elif k1:
            acc = fma(jj[1], -512.0, acc)
        elif k0:
            acc = fma(jj[0], -2.0, acc)
        terms.append(fma(i_j, rowf, acc))
        for p in range(nb):
            if (j, p) in drop:
                dropped += Fraction(-2 * 256 ** p * jj[p]) / 128 ** j
    tt = fma(fma(terms[2], 0.0078125, terms[1]), 0.0078125, terms[0])
    f = f32(f32(2.0 ** (e - bits - 8)) * f32(sm))
    z = f32(f32(tt * f32(scale)) * f)
    # exact: sm s 2^e sum_j 128^-(j+1) d_j . (n - xi), xi = (2 r + 1 - 2^b) / 2^(b+1)
    exact = Fraction(0)
    for c in range(G):
        xi = Fraction(2 * int(r[c]) + 1 - (1 << bits), 1 << (bits + 1))
        dig = sum(Fraction(int(d[j, c])) / 128 ** (j + 1) for j in range(3))
        exact += dig * (int(n[c]) - xi)
    exact *= Fraction(float(scale)) * Fraction(float(sm)) * Fraction(2) ** e
    dropped_logit = dropped * Fraction(float(scale)) * Fraction(float(sm)) * Fraction(2) ** (e - bits - 8)
    return z, dropped_logit, exact


# ---- the CUDA extend's combination by integer pieces (extend.cu piece_consts / piece_value) ----
MAGIC_RANGE = 1 << 22  # |piece| below this: exact as the fp32 bits of 1.5 * 2^23 + piece


def piece_ints(d, n, r, bits, G_):
    """The kernel's integers for one (row, group, key): I_j, the complemented planes' dots N_jp =
    d_j . (127 - byte_p), sq_j, K (exact), K_int (toward zero), K_frac, and the pieces
    (I_0, P, S or (S1, R)) with K_int where the kernel carries it."""
    nb = bits // 8
    nrho = [127 - ((r >> (8 * p)) & 255) for p in range(nb)]  # ~rho_p = -rho_p - 1
    I = [int((d[j] * n).sum()) for j in range(3)]
    N = {(j, p): int((d[j] * nrho[p]).sum()) for j in range(3) for p in range(nb)}
    sq = [int(d[j].sum()) for j in range(3)]
    if bits == 16:
        K = Fraction(257, 2) * sq[0] + Fraction(255, 256) * sq[1] - Fraction(257, 32768) * sq[2]
    else:
        K = 64 * sq[0] + Fraction(1, 2) * sq[1] - Fraction(1, 256) * sq[2]
    k_int = int(K)  # toward zero
    pieces = {"I0": I[0]}
    if bits == 16:
        pieces["P"] = 2 * I[1] + N[0, 1]
        if G_ == 128:
            pieces["S1"] = 2 * I[2] + N[1, 1]
            pieces["R"] = N[0, 0] + k_int
        else:
            pieces["S"] = 4 * I[2] + 2 * N[1, 1] + N[0, 0] + k_int
    else:
        pieces["P"] = 2 * I[1] + N[0, 0]
        pieces["S"] = 2 * I[2] + N[1, 0] + k_int
    return pieces, K - k_int


def piece_route(d, e, n, r, bits, *, scale, sm):
    """(the kernel's fp32 group logit by pieces, the exact value of the pieces' integer identity
    (tt, in the digit route's units))."""
    G_ = d.shape[1]
    pc, k_frac = piece_ints(d, n, r, bits, G_)
    for name, v in pc.items():
        assert abs(v) < MAGIC_RANGE, (name, v)
    fi0, fp = f32(pc["I0"]), f32(pc["P"])
    if bits == 16:
        fs = fma(f32(pc["S1"]), 2.0, f32(pc["R"])) if G_ == 128 else f32(pc["S"])
        val = f32(fma(fi0, 65536.0, fma(fp, 256.0, fs)) + f32(k_frac))
        exact_tt = 2 * (Fraction(65536) * pc["I0"] + 256 * pc["P"]
                        + (2 * pc["S1"] + pc["R"] if G_ == 128 else pc["S"]) + k_frac)
        fshift = 1
    else:
        fs = f32(f32(pc["S"]) * f32(0.015625))
        val = f32(fma(fi0, 512.0, fma(fp, 2.0, fs)) + f32(k_frac / 64))
        exact_tt = 512 * pc["I0"] + 2 * pc["P"] + Fraction(pc["S"], 64) + k_frac / 64
        fshift = 0
    f = f32(f32(2.0 ** (e - bits - 8 + fshift)) * f32(sm))
    with np.errstate(over="ignore"):  # an overflowing logit reads +-inf (the kernel: u = +inf)
        return f32(f32(val * f32(scale)) * f), exact_tt


def digit_tt(d, n, r, bits, drop):
    """tt = sum_j 128^-j (2^(b+1) I_j - 2 sum_(kept p) 256^p J_jp - C_b sum(d_j)), exactly."""
    nb = bits // 8
    rho = [((r >> (8 * p)) & 255) - 128 for p in range(nb)]
    cb = 1 + 256 * (256 ** (nb - 1) - 1) // 255
    tt = Fraction(0)
    for j in range(3):
        t = (1 << (bits + 1)) * int((d[j] * n).sum()) - cb * int(d[j].sum())
        t -= sum(2 * 256 ** p * int((d[j] * rho[p]).sum()) for p in range(nb) if (j, p) not in drop)
        tt += Fraction(t, 128 ** j)
    return tt


def queries(rng):
    yield "gaussian", rng.standard_normal(G).astype(f32)
    m = rng.standard_normal(G).astype(f32)
    m[3] = 3.0e4
    yield "massive", m
    yield "span", (rng.standard_normal(G) * 2.0 ** rng.integers(-30, 1, size=G)).astype(f32)
    yield "equal", np.full(G, f32(0.7071))


@pytest.mark.parametrize("kind", ["small", "digit2"])
@pytest.mark.parametrize("bits", [8, 16])
def test_dropped_dots_stay_within_their_bound_and_the_slack(bits, kind):
    drop = drop_set(kind, bits)
    rng = np.random.default_rng(bits)
    sm, scale = 0.08838834764831845, f32(0.0123)
    k = combine_roundings(qdig=3, bits=bits, groups=4)
    attained = 0.0
    for name, q in queries(rng):
        d, e, res, A = split(q)
        bound = dropped_bound(d, e, bits, drop) * Fraction(float(scale)) * Fraction(float(sm))
        for i in range(24):
            n, r = key_case(rng, bits, drop, d=d, align=i % 2 == 1)
            z, lost, exact_rec = route(d, e, n, r, bits, drop, scale=scale, sm=sm)
            assert abs(lost) <= bound, (name, float(lost), float(bound))
            if i % 2 == 1 and bound > 0:
                attained = max(attained, float(abs(lost) / bound))
            # the kept route within the rounding slack plus the dropped bound of the digits' exact
            # logit (the residual's 127.5 ||delta||_1 s sm covers the rest, up to the query)
            slack = Fraction(float(scale)) * Fraction(float(sm)) * Fraction(gamma(k, U32)) * 128 * A + bound
            assert abs(Fraction(float(z)) - exact_rec) <= slack * (1 + Fraction(1, 1 << 20)) + Fraction(2) ** -100, name
            assert res >= 0
    assert attained >= 0.9, f"the aligned dither reaches only {attained:.3f} of the dropped bound"


def extreme_cases(G_, bits):
    """Digits at +-64 and codes / dither bytes at their ends, every sign pattern per term (the
    pieces' largest magnitudes), plus random ones."""
    rng = np.random.default_rng(G_ + bits)
    for sd in range(8):
        d = np.stack([np.full(G_, 64 if (sd >> j) & 1 else -64) for j in range(3)]).astype(np.int64)
        for sn in (127, -127):
            for byte in (0, 255):
                r = sum(byte << (8 * p) for p in range(bits // 8))
                yield d, np.full(G_, sn), np.full(G_, r, dtype=np.int64)
    for _ in range(20):
        d = rng.integers(-64, 65, size=(3, G_))
        yield d, rng.integers(-127, 128, size=G_), rng.integers(0, 1 << bits, size=G_)


@pytest.mark.parametrize("bits", [8, 16])
@pytest.mark.parametrize("G_", [32, 64, 128])
def test_the_extend_pieces_are_exact_integers_and_combine_to_the_kept_route(bits, G_):
    """extend.cu's pieces: each below 2^22 (exact through the fp32 bits of 1.5 * 2^23) for any digits
    within +-64, codes and dither bytes, and their identity gives exactly the digit route's tt over
    the kept dots (so the kernel drops nothing more than DROP_SMALL)."""
    drop = drop_set("small", bits)
    for d, n, r in extreme_cases(G_, bits):
        _, exact_tt = piece_route(d, 0, n, r, bits, scale=f32(1.0), sm=1.0)
        assert exact_tt == digit_tt(d, n, r, bits, drop)


@pytest.mark.parametrize("bits", [8, 16])
def test_the_extend_pieces_stay_within_the_slack(bits):
    """The pieces route in fp32 (three roundings, then the scale and the factor) within the same
    slack weight as the digit route: sm s (gamma_K 128 A + dropped) of the digits' exact logit."""
    drop = drop_set("small", bits)
    rng = np.random.default_rng(100 + bits)
    sm = 0.08838834764831845
    k = combine_roundings(qdig=3, bits=bits, groups=4)
    huge = rng.standard_normal(G).astype(f32) * f32(2.0 ** 100)
    huge[5] = f32(2.0 ** 126)  # the exponent clamps at 125: digits would reach 127 without DMAX 64
    for scale in (f32(0.0123), f32(6.1e-5), f32(60000.0)):
        for name, q in [*queries(rng), ("beyond 2^124", huge)]:
            d, e, res, A = split(q, dmax=64)
            assert np.abs(d).max() <= 64
            bound = dropped_bound(d, e, bits, drop) * Fraction(float(scale)) * Fraction(float(sm))
            for i in range(16):
                n, r = key_case(rng, bits, drop, d=d, align=i % 2 == 1)
                z, _ = piece_route(d, e, n, r, bits, scale=scale, sm=sm)
                if not np.isfinite(z):  # an overflowing logit: the kernel clamps it and gives u = +inf
                    continue
                _, _, exact_rec = route(d, e, n, r, bits, drop, scale=scale, sm=sm)
                slack = Fraction(float(scale)) * Fraction(float(sm)) * Fraction(gamma(k, U32)) * 128 * A + bound
                assert abs(Fraction(float(z)) - exact_rec) <= slack * (1 + Fraction(1, 1 << 20)) + Fraction(2) ** -100, name
