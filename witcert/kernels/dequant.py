"""Exact integer operands for the tensor-core q.k of the dithered INT8 pool (``@triton.jit``
helpers shared by the decode and extend kernels; docs/PROOFS.md section 5.4).

A stored key channel is ``k^ = s (n - xi)`` with an int8 code ``n`` and a b-bit dither
``xi = (2r + 1 - 2^b) / 2^(b+1)``. Writing ``r = sum_p 256^p (rho_p + 128)`` with int8
byte planes ``rho_p`` (``p < b / 8``):

    2^(b+1) (n - xi) = 2^(b+1) n - 2 sum_p 256^p rho_p - C_b,   C_b = 1 + 256 (256^(b/8-1) - 1) / 255,

so ``q . (n - xi)`` over a channel group is a combination of integer dots ``I = d . n`` and
``J_p = d . rho_p`` (int8 x int8 -> int32, exact on the tensor cores) once the query is
split into int8 digits ``q ~= 2^E sum_j d_j 128^-j`` (``|d_j| <= 64``, a power-of-two
exponent ``E`` per row). What the digits miss (the residual) and the few fp32 roundings
of the combination are bounded exactly and added to the radius by the kernels.
"""

from __future__ import annotations

import triton
import triton.language as tl

from witcert.kernels.philox import _join4, dither_r_join, dither_words, dither_xi


@triton.jit
def rint_f32(x):
    """Round half to even for |x| < 2^22 (1.5 * 2^23 makes the fp32 add round at 1)."""
    return (x + 12582912.0) - 12582912.0


@triton.jit
def finite_or_zero(x):
    """x with its NaN and infinite entries read as 0 (the dtype kept)."""
    return tl.where((x == x) & (tl.abs(x) < float("inf")), x, tl.zeros_like(x))


@triton.jit
def sqrt_up(x):
    """An fp32 square root that is never below the true one by more than the radii's 2^-16
    inflation covers: ``tl.sqrt`` is ``sqrt.approx.ftz.f32`` on NVIDIA GPUs (within 3 ulp on
    normal arguments, which the inflation covers; a subnormal argument reads as 0), so 2^-61 is
    added, above the square root of any argument below 2^-124 (a flushed argument, or the few
    flushed terms of a sum of squares)."""
    return tl.sqrt(x) + 4.336808689942018e-19


@triton.jit
def pow2_f32(e):
    """Exact fp32 2^e for int32 e in [-126, 127]."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def pow2_f64(e):
    """Exact fp64 2^e for int e in [-1022, 1023]."""
    return ((e.to(tl.int64) + 1023) << 52).to(tl.float64, bitcast=True)


@triton.jit
def round_up_f32(x64):
    """fp64 >= 0 -> an fp32 >= it (nearest conversion, then one relative ulp up; tiny
    values get an absolute 2^-148 so subnormal conversions never round down)."""
    return x64.to(tl.float32) * 1.0000002384185791015625 + 2.8e-45 * 2.0


@triton.jit
def q_digits(q, QDIG: tl.constexpr):
    """Split query rows into int8 digits.

    q: f32 [R, K] finite (masked channels 0). Returns (d1, d2, d3 int8 [R, K] (d3 = 0 when
    QDIG == 2), e int32 [R], res f32 [R], dabs f32 [R]) with
    ``q = 2^e (d1/128 + d2/128^2 + d3/128^3) + delta`` exactly, ``res >= sum |delta|`` and
    ``dabs >= 2^e sum (|d1|/128 + |d2|/128^2 + |d3|/128^3)`` (both rounded up), and
    ``max |q| 2^-e`` in [1/4, 1/2) (e clamped to [-125, 125]; digits clamped to int8).
    """
    amax = tl.max(tl.abs(q), axis=1)
    eb = (amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
    e = tl.minimum(tl.maximum(eb - 125, -125), 125)
    e1 = e >> 1
    e2 = e - e1
    y = (q * pow2_f32(-e1)[:, None]) * pow2_f32(-e2)[:, None] * 128.0
    d1 = tl.minimum(tl.maximum(rint_f32(y), -127.0), 127.0)
    y = (y - d1) * 128.0
    d2 = tl.minimum(tl.maximum(rint_f32(y), -127.0), 127.0)
    if QDIG == 3:
        y = (y - d2) * 128.0
        d3 = tl.minimum(tl.maximum(rint_f32(y), -127.0), 127.0)
    else:
        d3 = d2 * 0.0
    # residual and digit magnitudes in float64, from the original q (exact: small integers
    # times powers of two), so underflow in the fp32 scaling above cannot hide anything
    sc = pow2_f64(e)
    rec = (d1.to(tl.float64) + (d2.to(tl.float64) + d3.to(tl.float64) * 0.0078125) * 0.0078125) \
        * 0.0078125 * sc[:, None]
    res = tl.sum(tl.abs(q.to(tl.float64) - rec), axis=1)
    dab = (tl.abs(d1.to(tl.float64)) + (tl.abs(d2.to(tl.float64)) + tl.abs(d3.to(tl.float64))
                                         * 0.0078125) * 0.0078125) * 0.0078125
    dabs = tl.sum(dab, axis=1) * sc
    return d1.to(tl.int8), d2.to(tl.int8), d3.to(tl.int8), e, round_up_f32(res), round_up_f32(dabs)


@triton.jit
def _rho(x, shift):
    """Byte ``(x >> shift) & 255`` of uint32 words as int8 ``byte - 128`` (xor of the top bit)."""
    return (((x >> shift) & 0xFF) ^ 0x80).to(tl.uint8).to(tl.int8, bitcast=True)


@triton.jit
def dither_plane(w0, w1, w2, w3, PLANE: tl.constexpr, BLOCK_N: tl.constexpr, K: tl.constexpr,
                 BITS: tl.constexpr):
    """Byte plane ``rho_PLANE = byte_PLANE(r) - 128`` (int8 [BLOCK_N, K]) of the b-bit dither
    integers r of ``K`` consecutive channels, channel order of ``dither_r_join``: b = 8:
    channel j of a call is byte j % 4 of word j // 4; b = 16: half j % 2 of word j // 2;
    b = 24: the top 24 bits of word j. Built from int8 joins (a quarter of the registers
    an int32 tile of r would take)."""
    if BITS == 8:
        b0 = _join4(_rho(w0, 0), _rho(w1, 0), _rho(w2, 0), _rho(w3, 0))
        b1 = _join4(_rho(w0, 8), _rho(w1, 8), _rho(w2, 8), _rho(w3, 8))
        b2 = _join4(_rho(w0, 16), _rho(w1, 16), _rho(w2, 16), _rho(w3, 16))
        b3 = _join4(_rho(w0, 24), _rho(w1, 24), _rho(w2, 24), _rho(w3, 24))
        r = tl.join(tl.join(b0, b2), tl.join(b1, b3))  # [BN, NCH, 4, 2, 2]: word * 4 + byte
    elif BITS == 16:
        lo = _join4(_rho(w0, 8 * PLANE), _rho(w1, 8 * PLANE), _rho(w2, 8 * PLANE), _rho(w3, 8 * PLANE))
        hi = _join4(_rho(w0, 16 + 8 * PLANE), _rho(w1, 16 + 8 * PLANE), _rho(w2, 16 + 8 * PLANE),
                    _rho(w3, 16 + 8 * PLANE))
        r = tl.join(lo, hi)  # [BN, NCH, 4 words, 2 halves]: channel = word * 2 + half
    else:
        r = _join4(_rho(w0, 8 + 8 * PLANE), _rho(w1, 8 + 8 * PLANE), _rho(w2, 8 + 8 * PLANE),
                   _rho(w3, 8 + 8 * PLANE))
    return tl.reshape(r, (BLOCK_N, K))


@triton.jit
def i8_to_f16(x):
    """int8 -> fp16 exactly without the conversion unit (a tensor-core operand of codes or a
    byte plane): the half with bits ``0x6400 | (x + 128)`` is ``1024 + x + 128``."""
    u = (x.to(tl.uint8, bitcast=True) ^ 0x80).to(tl.uint16) | 0x6400
    return u.to(tl.float16, bitcast=True) - 1152.0


@triton.jit
def plane_const(BITS: tl.constexpr):
    """C_b of the module docstring: 1, 257 or 65793 for b = 8, 16, 24."""
    if BITS == 8:
        c = 1.0
    elif BITS == 16:
        c = 257.0
    else:
        c = 65793.0
    return c


@triton.jit
def digit_dots(d, nT, p0T, p1T, p2T, sq, BITS: tl.constexpr):
    """One query digit's share of ``2^(b+1) q . (n - xi)``: int8 dots of ``d`` [R, K] with the
    codes ``nT`` and byte planes ``p*T`` [K, N] (int32, exact), then
    ``2^(b+1) I - 2 (J0 + 256 J1 + 65536 J2) - C_b Sq`` in fp32 [R, N] (Sq int32 [R])."""
    i = tl.dot(d, nT).to(tl.float32)
    jj = tl.dot(d, p0T).to(tl.float32)
    if BITS >= 16:
        jj = jj + tl.dot(d, p1T).to(tl.float32) * 256.0
    if BITS == 24:
        jj = jj + tl.dot(d, p2T).to(tl.float32) * 65536.0
    return i * (2.0 ** (BITS + 1)) - 2.0 * jj - plane_const(BITS) * sq.to(tl.float32)[:, None]


@triton.jit
def key_dots(d1, d2, d3, sq1, sq2, sq3, n_k, word0, epoch, chunk0, lh, k0, k1,
             ROUNDS: tl.constexpr, BLOCK_N: tl.constexpr, K: tl.constexpr, NCHK: tl.constexpr,
             BITS: tl.constexpr, QDIG: tl.constexpr):
    """``2^(b+1) sum_j 128^(1-j) d_j . (n - xi)`` in fp32 [R, BLOCK_N]: the query digits'
    dots with a tile of stored keys (the decode and extend kernels' one q.k route).

    d1, d2, d3: int8 digits [R, K] (d3 unused when QDIG == 2), sq*: their int32 row sums [R];
    n_k: int8 codes [BLOCK_N, K] of K consecutive channels, the NCHK Philox chunks from
    ``chunk0``; word0, epoch: int64 [BLOCK_N] (the counter's first word and the slot's
    epoch); lh: ``(layer << 16) | kv_head``. The K-side dither's byte planes are regenerated
    here; every integer dot is exact, the combination rounds (``combine_roundings``)."""
    w0, w1, w2, w3 = dither_words(word0[:, None], epoch[:, None], chunk0 + tl.arange(0, NCHK)[None, :],
                                  lh, 0, k0, k1, ROUNDS)
    nT = tl.trans(n_k)
    p0T = tl.trans(dither_plane(w0, w1, w2, w3, 0, BLOCK_N, K, BITS))
    p1T = p0T
    p2T = p0T
    if BITS >= 16:
        p1T = tl.trans(dither_plane(w0, w1, w2, w3, 1, BLOCK_N, K, BITS))
    if BITS == 24:
        p2T = tl.trans(dither_plane(w0, w1, w2, w3, 2, BLOCK_N, K, BITS))
    t = digit_dots(d1, nT, p0T, p1T, p2T, sq1, BITS)
    t2 = digit_dots(d2, nT, p0T, p1T, p2T, sq2, BITS)
    if QDIG == 3:
        t2 = t2 + digit_dots(d3, nT, p0T, p1T, p2T, sq3, BITS) * 0.0078125
    return t + t2 * 0.0078125


def combine_roundings(*, qdig: int, bits: int, groups: int) -> int:
    """fp32 roundings a logit term goes through in ``digit_dots`` and the combination of the
    decode kernel (PROOFS 5.4): per digit b/8 + 2, the digit sum, the scale and factor
    products, the group sum, the bypassed channels, and 2 to spare."""
    nb = bits // 8
    return qdig * (nb + 2) + (qdig - 1) + 2 + (groups - 1) + 1 + 2


def digits_for(dtype) -> int:
    """Query digits: 3 (21 bits below each row's largest component). Two digits would leave
    bf16 components below 2^-7 of their group's largest to the residual, which measured
    ~1% of the radius on Gaussian queries (tests/test_kernels_decode.py); three keep it
    below 0.01%."""
    return 3


@triton.jit
def repeat_groups(s, BLOCK_N: tl.constexpr, NG: tl.constexpr, LOG2G: tl.constexpr):
    """[BLOCK_N, NG] -> [BLOCK_N, NG << LOG2G], each entry repeated G times (register joins)."""
    for i in tl.static_range(LOG2G):
        s = tl.reshape(tl.join(s, s), (BLOCK_N, NG << (i + 1)))
    return s


@triton.jit
def dequant_tile_f32(Codes, Scales, Outl, byp_pos, slot, word0, mask_n, epoch, kv_head, side,
                  layer, k0, k1,
                  HKV: tl.constexpr, D: tl.constexpr, G: tl.constexpr, LOG2G: tl.constexpr,
                  M2: tl.constexpr, BITS: tl.constexpr, CPC: tl.constexpr, BLOCK_N: tl.constexpr,
                  ROUNDS: tl.constexpr):
    """Dequantized tile f32 [BLOCK_N, D], scales f32 [BLOCK_N, NG] and the flag [BLOCK_N].
    ``slot`` addresses the storage, ``word0`` is the first Philox counter word (the slot, or
    the token's position under the position-keyed dither).

    Bitwise the reference ``(float(n) - xi) * float(s)``; flagged rows (a scale +inf) are 0.
    """
    NG: tl.constexpr = D // G
    NCH: tl.constexpr = D // CPC
    row = slot * HKV + kv_head  # int64 [BLOCK_N]
    offs_d = tl.arange(0, D)
    n = tl.load(Codes + row[:, None] * D + offs_d[None, :], mask=mask_n[:, None], other=0).to(tl.int32)
    s = tl.load(Scales + row[:, None] * NG + tl.arange(0, NG)[None, :], mask=mask_n[:, None],
                other=1.0).to(tl.float32)
    bad = tl.max(s, axis=1) == float("inf")
    w0, w1, w2, w3 = dither_words(word0[:, None], epoch[:, None], tl.arange(0, NCH)[None, :],
                                  (layer << 16) | kv_head, side, k0, k1, ROUNDS)
    r = dither_r_join(w0, w1, w2, w3, BLOCK_N, D, BITS)
    if BITS <= 16:
        # n - xi = (n 2^(b+1) - 2r + 2^b - 1) / 2^(b+1) exactly (|numerator| < 2^24), and
        # scaling s by the power of two is exact, so this equals (n - xi) * s bitwise.
        num = n * (1 << (BITS + 1)) - 2 * r + ((1 << BITS) - 1)
        x = num.to(tl.float32) * repeat_groups(s * (1.0 / (1 << (BITS + 1))), BLOCK_N, NG, LOG2G)
    else:
        x = (n.to(tl.float32) - dither_xi(r, BITS)) * repeat_groups(s, BLOCK_N, NG, LOG2G)
    if M2 > 0:
        xo = tl.load(Outl + row[:, None] * M2 + byp_pos[None, :],
                     mask=mask_n[:, None] & (byp_pos[None, :] >= 0), other=0.0)
        x = tl.where(byp_pos[None, :] >= 0, xo.to(tl.float32), x)
    x = tl.where(bad[:, None], 0.0, x)
    return x, s, bad


_ = triton  # the module is only @triton.jit helpers
