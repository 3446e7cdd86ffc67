"""Triton extend (prefill) attention over the compressed prefix + the exact new tokens, on
tensor cores, with a certificate per (new token, query head).

Spec: ``witcert.ref.extend.extend_attention_cert`` (and, without certificate,
``witcert.ref.attention.extend_attention``); docs/PROOFS.md 5.4 (the arithmetic) and 5.5.

Built like a prefill kernel. One program of ``_extend_kernel`` takes ``BLOCK_T`` new tokens
and the ``QG`` query heads of one KV head: its tensor-core M side is the ``M = BLOCK_T * QGP``
rows (new token, query head) (``QGP`` = QG rounded up to a power of two). Each prefix tile is
read and its dither regenerated once per KV head for all those rows:

- q.k on the prefix: the exact integer route of the decode kernel
  (``witcert.kernels.dequant``), one scale group at a time: each row's query restricted to
  group g is split into int8 digits once (``_digits_kernel``), the int8 x int8 dots with the
  codes and the dither's byte planes are exact, the per-token group scale applies after the
  dot; the logit differs from ``sm q.k^`` by at most the arithmetic slack the radius includes
  (the same rounding count as the decode: ``combine_roundings``).
- p.v on the prefix: the tile dequantized exactly (``dequant_tile_f32``, bitwise the
  reference), divided by a power of two that bounds the tile, rounded to fp16, times the
  weights in fp16 on tensor cores with fp32 accumulators: the output's float tier is that of
  fp16 SDPA (it does not enter the certificate).
- the exact new tokens (causal): q.k on tensor cores where q and the keys are both fp16 or both
  bf16 (exact products; slack the signed accumulation model's, ``tc_dot_slack``), else in fp32
  ``ieee`` dots (slack ``gamma_{D+2}``), either times ``||q||_2 ||k||_2 >= sum |q_i k_i|``
  (Cauchy-Schwarz: each norm once, in float64, rounded up; no second dot); p.v as on the prefix
  (the tile over a power of two, in fp16, on tensor cores).
- the certificate: per (row, prefix token) the compression radius from the group norms of q
  and the stored witnesses / scales, plus the slack; ``a = sum p expm1_up(u)`` accumulated
  directly; the exact new tokens of a row share one radius (their slack with the largest norm
  of the new keys its program reads), so their share is their weights' sum times one
  ``expm1_up`` (PROOFS 5.4); never negative, never NaN.
"""

from __future__ import annotations

import ctypes

import torch
import triton
import triton.language as tl

from witcert.kernels import cuda as wc_cuda
from witcert.kernels import launch as wlaunch  # (its _sm_count and _cuda_config looked up per call: tests fake them)
from witcert.kernels.decode import exp_acc, expm1_up
from witcert.kernels.dequant import (combine_roundings, dequant_tile_f32, digits_for, finite_or_zero, key_dots,
                                     pow2_f32, q_digits, round_up_f32, sqrt_up)
from witcert.kernels.f16keys import dot_coef
from witcert.kernels.launch import _Q_DTYPES, ARITH_ABS, _delta_arg, _f32_up
from witcert.kernels.philox import CHANNELS_PER_CALL, seed_key
from witcert.kernels.plan import ExtendPlan, cdiv, interpreting, next_pow2
from witcert.kernels.write import check_pool, side_args
from witcert.ref.arith import U32, gamma, tc_dot_slack
from witcert.ref.cert import FP_BIAS_SLACK
from witcert.ref.extend import ExtendOut
from witcert.ref.philox import seed_to_key
from witcert.ref.validate import check_attention_dtypes, check_delta_loc, check_sm_scale
from witcert.settings import extend_workspace_mib


def supports(layer_kv) -> bool:
    """Whether the tensor-core extend serves this pool: int8 dots need K >= 32 channels, so
    the scale groups must hold at least 32 channels (the default 32 does)."""
    G, d = layer_kv.quant.group_size, layer_kv.head_dim
    return G >= 32 and d % G == 0


@triton.jit
def _digits_kernel(Q, stride_qt, stride_qh, stride_qd, KBypPos, Dig, RowF, n_rows, sm_scale, arith_gamma,
                   HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                   KM2: tl.constexpr, BITS: tl.constexpr, QDIG: tl.constexpr, BLOCK_R: tl.constexpr):
    """grid (cdiv(T * Hq * NG, BLOCK_R),). Row rho = (new token t, query head h, group g):
    its query restricted to group g (bypassed channels and non-finite entries 0), split into
    int8 digits. Dig int8 [T, Hq, NG, 3, G]; RowF f32 [T, Hq, NG, 4]: the logit factor
    ``2^(e - b - 8) sm``, the slack weight ``sm (gamma 128 A_g + 127.5 R_g)`` (PROOFS 5.4),
    ``||q_g||_2`` and ``||q_g||_1`` rounded up."""
    NG: tl.constexpr = D // G
    pid = tl.program_id(0)
    rho = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = rho < n_rows
    t = rho // (HQ * NG)
    h = (rho // NG) % HQ
    g = rho % NG
    c = tl.arange(0, G)
    ch = g[:, None] * G + c[None, :]
    q = tl.load(Q + t[:, None].to(tl.int64) * stride_qt + h[:, None] * stride_qh + ch * stride_qd,
                mask=ok[:, None], other=0.0).to(tl.float32)
    q = finite_or_zero(q)
    if KM2 > 0:
        kvh = h // (HQ // HKV)
        byp = tl.load(KBypPos + kvh[:, None] * D + ch, mask=ok[:, None], other=-1) >= 0
        q = tl.where(byp, 0.0, q)
    d1, d2, d3, e, res, dab = q_digits(q, QDIG)
    f = ((2.0 ** (-(BITS + 8))) * sm_scale * pow2_f32(e >> 1)) * pow2_f32(e - (e >> 1))
    w_ar = (arith_gamma * 128.0 * dab + 127.5 * res) * sm_scale * 1.0000019073486328125
    q64 = q.to(tl.float64)
    qn2 = round_up_f32(tl.sqrt(tl.sum(q64 * q64, axis=1)))
    qn1 = round_up_f32(tl.sum(tl.abs(q64), axis=1))
    base = rho.to(tl.int64)[:, None] * (3 * G) + c[None, :]
    tl.store(Dig + base, d1, mask=ok[:, None])
    tl.store(Dig + base + G, d2, mask=ok[:, None])
    tl.store(Dig + base + 2 * G, d3, mask=ok[:, None])
    fb = rho.to(tl.int64) * 4
    tl.store(RowF + fb, f, mask=ok)
    tl.store(RowF + fb + 1, w_ar, mask=ok)
    tl.store(RowF + fb + 2, qn2, mask=ok)
    tl.store(RowF + fb + 3, qn1, mask=ok)


@triton.jit
def pv_fp16(acc, p, v, alpha, r_v):
    """One tile's p.v, the prefix's and the new tokens' alike: acc [M, D] (in units of r_v, a power
    of two >= every |v| seen, 0 before any) rescaled by alpha [M] and by r_v / r, plus the weights
    p [M, BLOCK_N] in fp16 times v [BLOCK_N, D] / r in fp16 on tensor cores, fp32 accumulators;
    r = max(r_v, the power of two above max |v|), at most 2^126 (1 / r a normal fp32, |v / r| < 4;
    dequantized prefix values stay far below). Exact scalings; the float tier of fp16 SDPA,
    outside the certificate. Returns (acc, r)."""
    vmax = tl.max(tl.max(tl.abs(v), axis=1), axis=0)
    r_new = tl.maximum(r_v, pow2_f32(tl.minimum(((vmax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 126, 126)))
    vt = (v * (1.0 / r_new)).to(tl.float16)
    return acc * (alpha * (r_v / r_new))[:, None] + tl.dot(p.to(tl.float16), vt), r_new


@triton.jit
def _new_key_stats(KN, stride_kt, stride_kh, stride_kd, VN, stride_vt, stride_vh, stride_vd, Bad, Norm, KS, VS,
                   Q, stride_qt, stride_qh, stride_qd, QS, n_new, HQ: tl.constexpr, QG: tl.constexpr,
                   D: tl.constexpr, BLOCK: tl.constexpr, HAS_CERT: tl.constexpr):
    """grid (cdiv(T, BLOCK), Hkv): once per new token and KV head, what every program of
    ``_extend_kernel`` that reads the token needs. Bad i32 [Hkv, T]: 1 where the token's key or
    value has a non-finite entry; Norm f32 [Hkv, T] (HAS_CERT): its key's 2-norm, from float64
    squares (exact; a finite entry's square is below 2^256, a non-finite one makes the sum inf or
    NaN), rounded up to fp32 with one more ulp (0 for a bad token). KS, VS [Hkv, T, D] (the
    inputs' dtypes, contiguous): the key and value with a bad token's row 0, which the programs
    read straight into their dots (a bad token's logit is then exactly 0, its value 0); QS [T, HQ, D]
    (q's dtype) the query rows of the KV head's QG heads with a non-finite entry read as 0, as the
    dots read them (the rows' flags are the programs' own)."""
    kvh = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n_new
    offs_d = tl.arange(0, D)
    vr = tl.load(VN + offs[:, None] * stride_vt + kvh * stride_vh + offs_d[None, :] * stride_vd, mask=ok[:, None],
                 other=0.0)
    v = vr.to(tl.float32)
    bad = tl.max(((v != v) | (tl.abs(v) == float("inf"))).to(tl.int32), axis=1) > 0
    kr = tl.load(KN + offs[:, None] * stride_kt + kvh * stride_kh + offs_d[None, :] * stride_kd, mask=ok[:, None],
                 other=0.0)
    k = kr.to(tl.float64)
    k2 = tl.sum(k * k, axis=1)
    bad = bad | (k2 != k2) | (k2 == float("inf"))
    tl.store(Bad + kvh * n_new + offs, bad.to(tl.int32), mask=ok)
    if HAS_CERT:
        tl.store(Norm + kvh * n_new + offs, round_up_f32(tl.sqrt(tl.where(bad, 0.0, k2))), mask=ok)
    srow = (kvh * n_new + offs).to(tl.int64)[:, None] * D + offs_d[None, :]
    tl.store(KS + srow, tl.where(bad[:, None], tl.zeros_like(kr), kr), mask=ok[:, None])
    tl.store(VS + srow, tl.where(bad[:, None], tl.zeros_like(vr), vr), mask=ok[:, None])
    for h in range(QG):
        qh = kvh * QG + h
        qr = tl.load(Q + offs[:, None] * stride_qt + qh * stride_qh + offs_d[None, :] * stride_qd, mask=ok[:, None],
                     other=0.0)
        tl.store(QS + (offs.to(tl.int64) * HQ + qh)[:, None] * D + offs_d[None, :], finite_or_zero(qr),
                 mask=ok[:, None])


@triton.jit
def _extend_kernel(Q, stride_qt, stride_qh, stride_qd,
                   KCodes, KScales, KWit, KOutl, KBypPos, VCodes, VScales, VWit, VOutl, VBypPos,
                   Epochs, Positions, PrefixSlots, Dig, RowF, Out, Lse, Cert, Logits, Radius, Delta,
                   InitM, InitL, InitA, InitU, InitAcc, n_splits, split_stride, NewBad, NewNorm, KS, VS, QS,
                   n_prefix, n_new, prefix_tiles, sm_scale, layer, seed_lo, seed_hi, delta, bias_coef, dot_gamma,
                   byp_gamma, arith_abs, dot_abs,
                   HQ: tl.constexpr, HKV: tl.constexpr, QG: tl.constexpr, QGP: tl.constexpr,
                   BLOCK_T: tl.constexpr, D: tl.constexpr, G: tl.constexpr, LOG2G: tl.constexpr,
                   KM2: tl.constexpr, VM2: tl.constexpr, BITS: tl.constexpr, CPC: tl.constexpr,
                   ROUNDS: tl.constexpr, QDIG: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr,
                   HAS_CERT: tl.constexpr, RADIUS_DET: tl.constexpr, RADIUS_PROB: tl.constexpr,
                   HAS_POS: tl.constexpr, DELTA_PER_TOKEN: tl.constexpr, RETURN_LOGITS: tl.constexpr,
                   HAS_INIT: tl.constexpr, NEW_TC: tl.constexpr, V_DIRECT: tl.constexpr):
    """grid (cdiv(T, BLOCK_T), Hkv). Out f32 [T, Hq, D], Lse f32 [T, Hq], Cert f32 [T, Hq];
    Logits, Radius f32 [T, Hq, Np + T] (the logits used and their radii, when RETURN_LOGITS). Delta f32 [T] (rounded
    down) when DELTA_PER_TOKEN, else the scalar ``delta``. HAS_INIT: the prefix phase ran in
    the CUDA kernel (extend.cu), whose states InitM, InitL, InitA, InitU f32 [S, T, Hq] and InitAcc
    f32 [S, T, Hq, D] (S = n_splits prefix splits, split_stride = T Hq) this kernel merges and
    starts from (it then runs only the exact new tokens). NewBad i32
    [Hkv, T], NewNorm f32 [Hkv, T]: the new tokens' flags and key norms, KS, VS [Hkv, T, D] their
    keys and values with a flagged token's 0, QS [T, HQ, D] the query rows with a non-finite entry
    read as 0 (``_new_key_stats``). V_DIRECT (HAS_INIT, fp16 values):
    the new tokens' p.v in absolute units, the values as given (below).
    prefix_tiles: the tiles of the prefix a row's weights were rescaled through (the softmax
    and summation rounding counts)."""
    NG: tl.constexpr = D // G
    NCHG: tl.constexpr = G // CPC
    M: tl.constexpr = BLOCK_T * QGP
    pid_t = tl.program_id(0)
    kvh = tl.program_id(1)
    kvh64 = kvh.to(tl.int64)
    k0, k1 = seed_key(seed_lo, seed_hi)
    offs_r = tl.arange(0, M)
    t_r = pid_t * BLOCK_T + offs_r // QGP
    hh = offs_r % QGP
    row_ok = (t_r < n_new) & (hh < QG)
    head = kvh * QG + tl.where(hh < QG, hh, 0)
    t64 = t_r.to(tl.int64)
    offs_d = tl.arange(0, D)
    q = tl.load(Q + t64[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=row_ok[:, None], other=0.0).to(tl.float32)
    q_bad = tl.max(((q != q) | (tl.abs(q) == float("inf"))).to(tl.int32), axis=1) > 0
    q = finite_or_zero(q)
    if KM2 > 0:
        kbyp = tl.load(KBypPos + kvh64 * D + offs_d) >= 0
    else:
        kbyp = offs_d < 0
    qbyp = tl.where(kbyp[None, :], q, 0.0)
    if HAS_CERT:  # ||q||_2 per row, rounded up (the exact new tokens' dot bound, Cauchy-Schwarz)
        q64 = q.to(tl.float64)
        qn = round_up_f32(tl.sqrt(tl.sum(q64 * q64, axis=1)))
    if VM2 > 0:
        vbyp = tl.load(VBypPos + kvh64 * D + offs_d)
    else:
        vbyp = offs_d * 0 - 1
    drow = (t64 * HQ + head) * NG  # first (t, h, g) row of the digit scratch
    if HAS_CERT:
        if RADIUS_PROB:
            npf = tl.maximum(tl.zeros([], tl.float64) + n_prefix, 1.0)
            if DELTA_PER_TOKEN:
                dl = tl.load(Delta + t_r, mask=row_ok, other=0.5).to(tl.float64)
            else:
                dl = tl.zeros([M], tl.float64) + delta
            lf = round_up_f32(tl.sqrt(2.0 * tl.log(2.0 * npf / dl)) * 1.0000000000001)[:, None]
        tiles = prefix_tiles + tl.cdiv(n_new, BLOCK_N)
        e_soft = 1.0616e-05 + (tiles + 2).to(tl.float32) * 4.76837158203125e-07
    m_i = tl.full([M], float("-inf"), tl.float32)
    l_i = tl.zeros([M], tl.float32)
    a_i = tl.zeros([M], tl.float32)
    u_i = tl.zeros([M], tl.float32)
    acc = tl.zeros([M, D], tl.float32)  # sum_t w_t v^_t / r, r the power of two below
    r_v = tl.zeros([], tl.float32)  # a power of two >= every |v^| seen so far (0: none yet)
    lh = (layer << 16) | kvh
    offs_g = tl.arange(0, G)
    prefix_hi = n_prefix
    if HAS_INIT:  # the state after the prefix, from extend.cu (acc in absolute units)
        prefix_hi = 0
        irow = t64 * HQ + head
        m_i = tl.load(InitM + irow, mask=row_ok, other=float("-inf"))
        l_i = tl.load(InitL + irow, mask=row_ok, other=0.0)
        a_i = tl.load(InitA + irow, mask=row_ok, other=0.0)
        u_i = tl.load(InitU + irow, mask=row_ok, other=0.0)
        acc = tl.load(InitAcc + irow[:, None] * D + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        r_v = tl.full([], 1.0, tl.float32)
        prow = irow  # int64
        for _s in range(1, n_splits):  # the prefix splits' merge: one more rescale of every weight (PROOFS 5.4)
            prow += split_stride
            m_s = tl.load(InitM + prow, mask=row_ok, other=float("-inf"))
            m_new = tl.maximum(m_i, m_s)
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a dead row: no -inf - -inf
            alpha = exp_acc(m_i - m_ref)
            beta = exp_acc(m_s - m_ref)
            l_i = l_i * alpha + tl.load(InitL + prow, mask=row_ok, other=0.0) * beta
            a_s = tl.load(InitA + prow, mask=row_ok, other=0.0)
            a_i = tl.where(a_i == float("inf"), a_i, a_i * alpha) + tl.where(a_s == float("inf"), a_s, a_s * beta)
            u_i = tl.maximum(u_i, tl.load(InitU + prow, mask=row_ok, other=0.0))
            acc = acc * alpha[:, None] + tl.load(InitAcc + prow[:, None] * D + offs_d[None, :], mask=row_ok[:, None],
                                                 other=0.0) * beta[:, None]
            m_i = m_new

    for start in range(0, prefix_hi, BLOCK_N):  # compressed prefix: every new token sees all of it
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < n_prefix
        slot = tl.load(PrefixSlots + offs_n, mask=mask_n, other=0)
        epoch = tl.load(Epochs + slot, mask=mask_n, other=0).to(tl.int64)
        if HAS_POS:
            word0 = tl.load(Positions + slot, mask=mask_n, other=0).to(tl.int64)
        else:
            word0 = slot
        row = slot * HKV + kvh64
        # ---- logits: per scale group, int8 dots of the digits with codes and planes ----
        z = tl.zeros([M, BLOCK_N], tl.float32)
        kbad = offs_n < 0
        for g in tl.static_range(NG):
            n_k = tl.load(KCodes + row[:, None] * D + g * G + offs_g[None, :], mask=mask_n[:, None], other=0)
            dp = Dig + (drow + g)[:, None] * (3 * G) + offs_g[None, :]
            d1 = tl.load(dp, mask=row_ok[:, None], other=0)
            d2 = tl.load(dp + G, mask=row_ok[:, None], other=0)
            d3 = d2
            if QDIG == 3:
                d3 = tl.load(dp + 2 * G, mask=row_ok[:, None], other=0)
            tg = key_dots(d1, d2, d3, tl.sum(d1.to(tl.int32), axis=1), tl.sum(d2.to(tl.int32), axis=1),
                          tl.sum(d3.to(tl.int32), axis=1), n_k, word0, epoch, g * NCHG, lh, k0, k1,
                          ROUNDS, BLOCK_N, G, NCHG, BITS, QDIG)
            ks = tl.load(KScales + row * NG + g, mask=mask_n, other=1.0).to(tl.float32)
            fr = RowF + (drow + g) * 4
            f = tl.load(fr, mask=row_ok, other=0.0)
            z += (tg * ks[None, :]) * f[:, None]
            kw = tl.load(KWit + row * NG + g, mask=mask_n, other=0.0).to(tl.float32)
            kbad = kbad | (ks == float("inf")) | (kw == float("inf"))
        if KM2 > 0:
            xo = tl.load(KOutl + row[:, None] * KM2 + tl.load(KBypPos + kvh64 * D + offs_d)[None, :],
                         mask=mask_n[:, None] & kbyp[None, :], other=0.0).to(tl.float32)
            z += tl.dot(qbyp, tl.trans(xo), input_precision="ieee") * sm_scale
        ovf = (tl.abs(z) == float("inf")) | (z != z)  # finite inputs, overflowing logit: flagged
        z = tl.where(z != z, 0.0, tl.minimum(tl.maximum(z, -3.4028234e38), 3.4028234e38))
        z = tl.where(kbad[None, :], 0.0, z)  # a flagged key reads as 0, so its logit is 0
        z = tl.where(mask_n[None, :], z, float("-inf"))
        if RETURN_LOGITS:
            tl.store(Logits + (t64 * HQ + head)[:, None] * (n_prefix + n_new) + offs_n[None, :], z,
                     mask=row_ok[:, None] & mask_n[None, :])
        m_new = tl.maximum(m_i, tl.max(z, axis=1))
        p = exp_acc(z - m_new[:, None])
        alpha = exp_acc(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        # ---- values: the exact tile / r in fp16, weights in fp16, fp32 accumulators -------
        v, vs, vbad = dequant_tile_f32(VCodes, VScales, VOutl, vbyp, slot, word0, mask_n, epoch, kvh64, 1, layer, k0, k1,
                                       HKV, D, G, LOG2G, VM2, BITS, CPC, BLOCK_N, ROUNDS)
        acc, r_v = pv_fp16(acc, p, v, alpha, r_v)
        if HAS_CERT:
            vw = tl.load(VWit + row[:, None] * NG + tl.arange(0, NG)[None, :], mask=mask_n[:, None], other=0.0)
            vbad = vbad | (tl.max(vw.to(tl.float32), axis=1) == float("inf"))
            # radii, one sum over the groups at a time (few [M, BLOCK_N] arrays live at once);
            # every formula in fp32 with the relative inflation 2^-16 (PROOFS 5.1)
            u = tl.full([M, BLOCK_N], float("inf"), tl.float32)
            if RADIUS_DET:
                u = tl.zeros([M, BLOCK_N], tl.float32)
                for g in tl.static_range(NG):  # sum_g ||q_g||_2 wit_g
                    kw = tl.load(KWit + row * NG + g, mask=mask_n, other=0.0).to(tl.float32)
                    n2 = tl.load(RowF + (drow + g) * 4 + 2, mask=row_ok, other=0.0)
                    u += n2[:, None] * tl.where(kw == float("inf"), 0.0, kw)[None, :]
                u = u * sm_scale
            if RADIUS_PROB:
                s2 = tl.zeros([M, BLOCK_N], tl.float32)
                for g in tl.static_range(NG):  # sum_g (||q_g||_2 s_g)^2
                    ks = tl.load(KScales + row * NG + g, mask=mask_n, other=1.0).to(tl.float32)
                    n2 = tl.load(RowF + (drow + g) * 4 + 2, mask=row_ok, other=0.0)
                    t2v = n2[:, None] * tl.where(ks == float("inf"), 0.0, ks)[None, :]
                    s2 += t2v * t2v
                up = sm_scale * sqrt_up(s2 / 12.0) * lf
                for g in tl.static_range(NG):  # + bias sm sum_g ||q_g||_1 s_g
                    ks = tl.load(KScales + row * NG + g, mask=mask_n, other=1.0).to(tl.float32)
                    n1 = tl.load(RowF + (drow + g) * 4 + 3, mask=row_ok, other=0.0)
                    up += (bias_coef * sm_scale * n1)[:, None] * tl.where(ks == float("inf"), 0.0, ks)[None, :]
                u = tl.minimum(u, up)
            u = u * 1.0000152587890625 + (arith_abs + e_soft)
            for g in tl.static_range(NG):  # + the arithmetic slack sum_g w_g s_g (PROOFS 5.4)
                ks = tl.load(KScales + row * NG + g, mask=mask_n, other=1.0).to(tl.float32)
                war = tl.load(RowF + (drow + g) * 4 + 1, mask=row_ok, other=0.0) * 1.0000152587890625
                u += war[:, None] * tl.where(ks == float("inf"), 0.0, ks)[None, :]
            if KM2 > 0:
                u += tl.dot(tl.abs(qbyp), tl.trans(tl.abs(xo)), input_precision="ieee") \
                    * (sm_scale * byp_gamma * 1.0000152587890625)
            bad = (kbad | vbad)[None, :] | q_bad[:, None] | (u != u) | ovf
            u = tl.where(bad, float("inf"), u)
            live = mask_n[None, :] & row_ok[:, None]
            if RETURN_LOGITS:
                tl.store(Radius + (t64 * HQ + head)[:, None] * (n_prefix + n_new) + offs_n[None, :], u, mask=live)
            term = tl.where(live & (p > 0.0), p * expm1_up(u), 0.0)
            a_i = tl.where(a_i == float("inf"), a_i, a_i * alpha) + tl.sum(term, axis=1)
            u_i = tl.maximum(u_i, tl.max(tl.where(live, u, 0.0), axis=1))
        m_i = m_new

    hi = n_new
    if CAUSAL:
        hi = tl.minimum(n_new, (pid_t + 1) * BLOCK_T)
    DC: tl.constexpr = 32 if D >= 32 else D  # channels per chunk of the new tokens' dots
    offs_c = tl.arange(0, DC)
    if HAS_CERT:  # the exact new tokens share one radius per row (PROOFS 5.4): its inputs
        ln_i = tl.zeros([M], tl.float32)  # their weights' sum (rescaled as l)
        kx = tl.zeros([], tl.float32)  # the largest norm of the new keys read (every row's live ones)
        fb = n_new  # the first flagged new key (n_new: none)
    for start in range(0, hi, BLOCK_N):  # exact new tokens
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < n_new
        srow = (kvh64 * n_new + offs_n)[:, None] * D  # the tokens' rows of KS, VS
        v = tl.load(VS + srow + offs_d[None, :], mask=mask_n[:, None], other=0.0)
        # q.k by chunks of DC channels (q read per chunk: fewer live registers), times sum
        # |q_i k_i| <= ||q||_2 ||k||_2 (the keys' norms and flags from _new_key_stats): NEW_TC (q
        # and the keys both fp16 or both bf16), tensor-core dots of the inputs as given (exact
        # products), bounded by the signed accumulation model (dot_gamma, dot_abs); else fp32
        # ``ieee`` dots, every order of whose sum has the bound gamma_{D+2} (PROOFS 5.4)
        z = tl.zeros([M, BLOCK_N], tl.float32)
        for c0 in tl.static_range(0, D, DC):
            kc = tl.load(KS + srow + (c0 + offs_c)[None, :], mask=mask_n[:, None], other=0.0)
            qc = tl.load(QS + (t64 * HQ + head)[:, None] * D + (c0 + offs_c)[None, :],
                         mask=row_ok[:, None], other=0.0)
            if not NEW_TC:  # q and the keys as given in QS, KS (non-finite entries read as 0)
                kc = kc.to(tl.float32)
                qc = qc.to(tl.float32)
            if NEW_TC:
                z = tl.dot(qc, tl.trans(kc), z)
            else:
                z = tl.dot(qc, tl.trans(kc), z, input_precision="ieee")
        nbad = tl.load(NewBad + kvh * n_new + offs_n, mask=mask_n, other=0) > 0
        # a non-finite new row reads 0 (KS, VS: its logit is exactly 0) and is flagged
        z = z * sm_scale
        ovf = (tl.abs(z) == float("inf")) | (z != z)
        z = tl.where(z != z, 0.0, tl.minimum(tl.maximum(z, -3.4028234e38), 3.4028234e38))
        live = mask_n[None, :]
        if CAUSAL:
            live = live & (offs_n[None, :] <= t_r[:, None])
        z = tl.where(live, z, float("-inf"))
        if RETURN_LOGITS:
            tl.store(Logits + (t64 * HQ + head)[:, None] * (n_prefix + n_new) + n_prefix + offs_n[None, :], z,
                     mask=row_ok[:, None] & mask_n[None, :])
        if HAS_CERT:  # over the tile's keys, not per row: no reduction of an [M, BLOCK_N] tile
            kn = tl.load(NewNorm + kvh * n_new + offs_n, mask=mask_n, other=0.0)
            kx = tl.maximum(kx, tl.max(kn, axis=0))
            fb = tl.minimum(fb, tl.min(tl.where(nbad & mask_n, offs_n, n_new), axis=0))
        m_new = tl.maximum(m_i, tl.max(z, axis=1))
        p = exp_acc(z - m_new[:, None])
        alpha = exp_acc(m_i - m_new)
        psum = tl.sum(p, axis=1)
        l_i = l_i * alpha + psum
        if V_DIRECT:  # acc in absolute units (r_v 1 from the CUDA prefix phase): |p v| <= 65504, no rescale
            acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), v)
        else:
            acc, r_v = pv_fp16(acc, p, v.to(tl.float32), alpha, r_v)  # as on the prefix
        if HAS_CERT:
            ln_i = ln_i * alpha + psum
            a_i = tl.where(a_i == float("inf"), a_i, a_i * alpha)
        m_i = m_new
    if HAS_CERT:
        if hi > 0:  # the new tokens' radius, then their share sum_t p_t expm1_up(u) = ln expm1_up(u)
            qk = qn * kx  # >= ||q|| ||k_j|| for every key read; below 2^127 / max(sm, 1) no dot or
            # logit can have overflowed (PROOFS 5.4), so +inf covers every overflow there was
            u = dot_gamma * sm_scale * qk * 1.0000152587890625 + (arith_abs + dot_abs + e_soft)
            if CAUSAL:
                sees_bad = fb <= t_r
            else:
                sees_bad = (t_r * 0 + fb) < n_new
            big = qk * tl.maximum(sm_scale, 1.0) >= 1.7014118346046923e38
            u = tl.where(q_bad | sees_bad | big | (u != u), float("inf"), u)
            a_i = a_i + tl.where(ln_i > 0.0, ln_i * expm1_up(u), 0.0)
            u_i = tl.maximum(u_i, u)
            if RETURN_LOGITS:
                for start in range(0, hi, BLOCK_N):
                    offs_n = start + tl.arange(0, BLOCK_N)
                    live = row_ok[:, None] & (offs_n < n_new)[None, :]
                    if CAUSAL:
                        live = live & (offs_n[None, :] <= t_r[:, None])
                    tl.store(Radius + (t64 * HQ + head)[:, None] * (n_prefix + n_new) + n_prefix + offs_n[None, :],
                             u[:, None] + tl.zeros([M, BLOCK_N], tl.float32), mask=live)

    # acc is in units of r_v (a power of two: the product is exact); acc / l is a weighted mean of
    # values / r_v (below 4 in magnitude for the new tokens' tiles), so it cannot overflow
    out = (acc / l_i[:, None]) * r_v
    orow = t64 * HQ + head
    tl.store(Out + orow[:, None] * D + offs_d[None, :], out, mask=row_ok[:, None])
    tl.store(Lse + orow, m_i + tl.log(l_i), mask=row_ok)
    if HAS_CERT:
        tiles = prefix_tiles + tl.cdiv(n_new, BLOCK_N)
        depth = (BLOCK_N + 2 * tiles + 5).to(tl.float32)
        kappa = 2.0 * depth * 5.9604644775390625e-08 / (1.0 - depth * 5.9604644775390625e-08)
        n_tok = (n_prefix + t_r + 1).to(tl.float32)
        tail = tl.where(u_i == float("inf"), float("inf"),  # the exp's error: see the decode merge
                        n_tok * tl.exp(tl.minimum(2.0 * u_i - 87.0, 88.0)) * 1.0000152587890625)
        cert = (tl.math.div_rn(a_i, l_i) * (1.0 + kappa) + tail) * 1.00000023841858  # IEEE quotient
        cert = tl.where(q_bad | (cert != cert), float("inf"), cert)
        tl.store(Cert + orow, cert, mask=row_ok)


def _e_soft(tiles: int) -> float:
    """The softmax weights' logit-equivalent error of a row whose weights go through ``tiles``
    rescales (the Triton kernel's ``e_soft``, PROOFS 5.4), rounded up to fp32."""
    return _f32_up(1.0616e-05 + (tiles + 2) * 4.76837158203125e-07)


def split_rescales(splits: int) -> int:
    """The rescales the merge of ``splits`` prefix splits adds to every weight's count (and twice
    that to its sums' roundings, through ``prefix_tiles``): ``splits`` where there is a merge, 0
    for one split (PROOFS 5.4, "prefix splits")."""
    return splits if splits > 1 else 0


def prefix_chunk_tokens(*, n_p: int, tile: int, prefix_chunk: int, workspace_mib: int, tile_bytes: int) -> int:
    """Prefix tokens per launch of the CUDA prefix phase: ``prefix_chunk`` rounded down to whole
    tiles of ``tile`` tokens (at least one), or, when it is 0, as many whole tiles as
    ``workspace_mib`` MiB of workspace holds (``tile_bytes`` per tile and all KV heads; at least
    one); at most ``n_p`` (one pass)."""
    if prefix_chunk:
        chunk = max(tile, prefix_chunk // tile * tile)
    else:
        chunk = tile * max(1, (workspace_mib << 20) // tile_bytes)
    return min(chunk, n_p)


def _cuda_prefix(cfg, *, q, layer_kv, prefix_slots, sm_scale, cert, delta_t, delta_s, soft_tiles, bits,
                 logits, radius, plan, launches=None):
    """The prefix phase in extend.cu on q's current stream: the state of each of its S prefix
    splits (max, sum, certificate sum, largest radius f32 [S, T, Hq]; output sum f32 [S, T, Hq,
    D]) the Triton kernel merges and starts from. plan: the call's ``ExtendPlan`` (its workspace
    cap, chunk and splits). S: ``plan.split_count`` of the grid; one where the library predates
    splits. soft_tiles: the rescales a row's weights go through without splits (prefix tiles +
    new tokens' tiles); the merge adds ``split_rescales(S)`` (``e_soft``, PROOFS 5.4).
    launches: a list that receives each chunk's prefix length (one entry per launch), or None.
    cert: the CertConfig, None without certificate; logits / radius: the debug arrays. The call's
    workspace (each prefix tile staged once per KV head, ``wc_extend_workspace_bytes``: 2 + 2
    bytes per channel, prefix token and KV head (the keys and the values in fp16) plus about 4.1 KB
    of records per 32-token tile, 7.8 KB per 64-token tile, e.g. 159 MiB at 32,768 tokens x 8 KV
    heads)
    comes from torch's allocator on q's device. A prefix whose workspace would pass
    ``workspace_mib`` MiB (or longer than ``prefix_chunk`` tokens, a multiple of 32, when given;
    rounded down to whole tiles of a build with larger ones, at least one) runs in chunks of whole
    tiles of the build (``wc_extend_tile_tokens``: 64 tokens at 8 warps, 32 at 4,
    ``ExtendPlan.prefix_build``), one launch each: every CTA thread leaves its registers'
    state (``wc_extend_carry_floats`` floats) for the next chunk's same
    thread, so the result is bitwise that of one pass (the same tiles in the same order; the
    radius's ``lf`` counts the whole prefix); the splits divide the whole prefix's tiles, and
    each chunk runs each split's tiles among its own, so chunks stay bitwise one pass. The cap
    is at least one tile per KV head. The carried state (only when the call chunks) takes 292
    bytes per thread of the grid, about 1.1x the output sum ``oacc``."""
    lib = wc_cuda.library(**cfg)
    if q.stride(-1) != 1:
        q = q.contiguous()
    T, hq, d = q.shape
    hkv = layer_kv.num_kv_heads
    f32 = dict(dtype=torch.float32, device=q.device)
    k, v = layer_kv.k, layer_kv.v
    k0, k1 = seed_to_key(layer_kv.seed)
    n_p = prefix_slots.shape[0]
    prefix_slots = prefix_slots.contiguous()
    # the build's prefix tile (an earlier extend.cu without the export: 32)
    tile = lib.wc_extend_tile_tokens() if hasattr(lib, "wc_extend_tile_tokens") else wc_cuda.EXTEND_TILE
    if hasattr(lib, "wc_extend_carry_floats"):
        chunk = prefix_chunk_tokens(n_p=n_p, tile=tile, prefix_chunk=plan.prefix_chunk,
                                    workspace_mib=plan.workspace_mib,
                                    tile_bytes=lib.wc_extend_workspace_bytes(tile, hkv))
    else:  # (not in an earlier extend.cu: same-run tools)
        chunk = n_p
    ws = lib.wc_extend_workspace_bytes(chunk, hkv) if hasattr(lib, "wc_extend_workspace_bytes") else 0
    work = torch.empty(ws, dtype=torch.uint8, device=q.device)  # (0: an earlier extend.cu, same-run tools)
    grid_x = wc_cuda.extend_blocks(tokens=T, qgp=cfg["qgp"], warps=cfg["warps"])
    splits = 1
    if hasattr(lib, "wc_extend_max_splits"):  # (not in an earlier extend.cu: same-run tools)
        splits = plan.split_count(ctas=grid_x * hkv, warps=cfg["warps"], sms=wlaunch._sm_count(q.device),
                                  tiles=cdiv(n_p, tile))
    e_soft = _e_soft(soft_tiles + split_rescales(splits))
    om, ol, oa, ou = (torch.empty(splits, T, hq, **f32) for _ in range(4))
    oacc = torch.empty(splits, T, hq, d, **f32)
    carry = None
    if chunk < n_p:
        n_thr = grid_x * hkv * splits * lib.wc_extend_cta_threads()
        carry = torch.empty(lib.wc_extend_carry_floats() * n_thr, **f32)
    ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
    args = wc_cuda.ExtArgs(
        q=q.data_ptr(), kc=k["codes"].data_ptr(), vc=v["codes"].data_ptr(), ks=k["scales"].data_ptr(),
        vs=v["scales"].data_ptr(), kw=k["wit"].data_ptr(), vw=v["wit"].data_ptr(),
        epochs=layer_kv.epochs.data_ptr(), positions=ptr(layer_kv.positions), prefix_slots=prefix_slots.data_ptr(),
        delta=ptr(delta_t), om=om.data_ptr(), ol=ol.data_ptr(), oa=oa.data_ptr(), ou=ou.data_ptr(),
        oacc=oacc.data_ptr(), logits=ptr(logits), radius=ptr(radius), work=work.data_ptr(), carry=ptr(carry),
        tile0=0, np_all=n_p, carry_mode=0, sq_t=q.stride(0),
        sq_h=q.stride(1), rad_n=n_p + T, sm=sm_scale, delta_scalar=delta_s,
        bias_coef=2.0 ** -(bits + 1) + FP_BIAS_SLACK, arith_gamma=dot_coef(), arith_abs=ARITH_ABS, e_soft=e_soft,
        key0=k0, key1=k1, q_dtype=_Q_DTYPES[q.dtype], T=T, Np=n_p, Hq=hq, Hkv=hkv,
        layer=layer_kv.layer, cert=int(cert is not None),
        radius_mode={"det": 0, "prob": 1, "min": 2}[cert.radius] if cert is not None else 0, n_splits=splits)
    stream = torch.cuda.current_stream(q.device).cuda_stream
    for c0 in range(0, n_p, chunk):
        n = min(chunk, n_p - c0)
        args.prefix_slots, args.Np, args.tile0 = prefix_slots.data_ptr() + 8 * c0, n, c0 // tile
        args.carry_mode = (1 if c0 else 0) | (2 if c0 + n < n_p else 0)
        rc = lib.wc_extend_launch(ctypes.byref(args), grid_x, hkv, stream)
        if rc:
            raise RuntimeError(f"witcert: CUDA extend launch failed (cudaError {rc})")
        if launches is not None:
            launches.append(n)
    return om, ol, oa, ou, oacc


def extend_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, layer_kv,
                     prefix_slots: torch.Tensor, *, sm_scale: float, causal: bool = True,
                     cert=None, delta_loc=1e-6, debug: dict | None = None,
                     plan=None):
    """Prefill/extend for one sequence (Triton, tensor cores).

    q: float [T, Hq, D]; k_new, v_new: float [T, Hkv, D] (exact); prefix_slots: int64 [Np].
    Without ``cert`` returns out f32 [T, Hq, D] (the contract of the reference
    ``extend_attention``); with a ``CertConfig`` returns ``witcert.ref.extend.ExtendOut``
    (out, lse, cert f32 [T, Hq]): the contract of ``extend_attention_cert``. delta_loc: the
    budget of each (head, new token) for the prob / min radius (a float or a tensor [T]).
    debug: a dict that receives ``logits`` f32 [T, Hq, Np + T], the logits the kernel used
    (-inf where a row does not see a token), with a certificate ``radius`` (the same
    shape: each token's whole radius u, 0 where not seen; soundness tests), and ``impl``
    (``cuda`` or ``triton``: which kernel ran the prefix phase), and ``prefix_chunks``, the
    prefix tokens of each launch of the CUDA prefix phase (one entry: one pass). plan: an
    ``ExtendPlan`` (tiles, warps, the workspace cap; default the automatic one, its cap from
    ``WITCERT_EXTEND_WORKSPACE_MIB``). Pools whose scale groups hold
    fewer than 32 channels are refused (``supports``).
    """
    check_pool(layer_kv)
    sm_scale = check_sm_scale(sm_scale)
    check_attention_dtypes(q=q, k_new=k_new, v_new=v_new)
    assert q.dim() == 3 and k_new.shape == v_new.shape and k_new.shape[0] == q.shape[0], \
        f"q [T, Hq, D] {tuple(q.shape)} and k_new/v_new [T, Hkv, D] {tuple(k_new.shape)} disagree"
    T, hq, d = q.shape
    hkv = layer_kv.num_kv_heads
    assert d == layer_kv.head_dim and k_new.shape[1:] == (hkv, d) and hq % hkv == 0, \
        "k_new must be [T, Hkv, D] matching the pool; Hq % Hkv must be 0"
    assert prefix_slots.dim() == 1, "prefix_slots must be int64 [Np]"
    if not supports(layer_kv):
        raise ValueError(f"group_size {layer_kv.quant.group_size}: the Triton extend needs scale groups "
                         "of at least 32 channels (use the reference extend)")
    enabled = cert is not None and bool(cert.enabled)
    if enabled and cert.radius != "det":
        check_delta_loc(delta_loc, batch=q.shape[0])
    dev = q.device
    delta_t, delta_s = _delta_arg(delta_loc if enabled and cert.radius != "det" else 0.5, q.shape[0], dev)
    prefix_slots = prefix_slots.to(device=dev, dtype=torch.int64).contiguous()
    quant = layer_kv.quant
    bits, G = quant.dither_bits, quant.group_size
    ng, qg, n_p = d // G, hq // hkv, prefix_slots.shape[0]
    kargs, km2 = side_args(layer_kv.k, layer_kv.k_outlier_idx, hkv=hkv, d=d, device=dev)
    vargs, vm2 = side_args(layer_kv.v, layer_kv.v_outlier_idx, hkv=hkv, d=d, device=dev)
    f32 = dict(dtype=torch.float32, device=dev)
    out = torch.empty(T, hq, d, **f32)
    lse = torch.empty(T, hq, **f32)
    c = torch.empty(T, hq, **f32) if enabled else lse
    logits = torch.full((T, hq, n_p + T), float("-inf"), **f32) if debug is not None else lse
    radius = torch.zeros(T, hq, n_p + T, **f32) if debug is not None and enabled else lse
    cuda_cfg, chunks = None, []
    if T:
        qdig = digits_for(q.dtype)
        arith_gamma = gamma(combine_roundings(qdig=qdig, bits=bits, groups=ng), U32)
        # the exact new tokens' q.k: on tensor cores where q and the keys are both fp16 or both
        # bf16 (exact products), else in fp32 ``ieee`` dots (PROOFS 5.4); not bf16 under the
        # Triton interpreter, whose bf16 dots are not the hardware's (numpy has no bf16)
        interp = interpreting() or dev.type == "cpu"
        new_tc = q.dtype == k_new.dtype and q.dtype in (torch.float16, torch.bfloat16) and not (
            q.dtype == torch.bfloat16 and interp)
        dot_gamma, dot_abs = tc_dot_slack(d, sm_scale) if new_tc else (gamma(d + 2, U32), 0.0)
        if plan is None:
            plan = ExtendPlan(workspace_mib=extend_workspace_mib())
        asked, plan = plan, plan.resolve(interpreter=interp)
        qgp = next_pow2(qg)
        if n_p:
            cuda_cfg = wlaunch._cuda_config(plan, q, layer_kv, qg=qg, d=d, bits=bits, G=G, km2=km2, vm2=vm2,
                                            kind="extend")
        if cuda_cfg is not None:
            plan = asked.resolve(interpreter=interp, cuda_prefix=True)  # Triton: the new tokens only
            # every row's weights are rescaled once per CUDA prefix tile; counting the prefix at the
            # finer of the two tilings covers both the CUDA sums and the Triton ones
            prefix_tiles = cdiv(n_p, min(wc_cuda.EXTEND_TILE, plan.block_n))
            init = _cuda_prefix(cuda_cfg, q=q, layer_kv=layer_kv, prefix_slots=prefix_slots, sm_scale=sm_scale,
                                cert=cert if enabled else None, delta_t=delta_t, delta_s=delta_s,
                                soft_tiles=prefix_tiles + cdiv(T, plan.block_n),
                                bits=bits, logits=logits if debug is not None else None,
                                radius=radius if debug is not None and enabled else None,
                                plan=plan, launches=chunks)
            n_splits = init[0].shape[0]
            prefix_tiles += split_rescales(n_splits)  # the merge's rescales and sums (PROOFS 5.4)
            # unused (the prefix phase is done): stand-ins from the call's own buffers (an int8 view of
            # the slots for the digits), so no allocation and no fill kernel
            dig, rowf = prefix_slots.view(torch.int8), lse
        else:
            prefix_tiles = cdiv(n_p, plan.block_n)
            init, n_splits = (lse,) * 5, 1
            dig = torch.empty(T, hq, ng, 3, G, dtype=torch.int8, device=dev)
            rowf = torch.empty(T, hq, ng, 4, **f32)
            n_rows = T * hq * ng
            _digits_kernel[(cdiv(n_rows, 64),)](
                Q=q, stride_qt=q.stride(0), stride_qh=q.stride(1), stride_qd=q.stride(2), KBypPos=kargs[5],
                Dig=dig, RowF=rowf, n_rows=n_rows, sm_scale=sm_scale, arith_gamma=arith_gamma,
                HQ=hq, HKV=hkv, D=d, G=G, KM2=km2, BITS=bits, QDIG=qdig, BLOCK_R=64)
        block_t = max(1, plan.block_m // qgp)
        # the new tokens' flags, key norms and sanitized copies, once per (token, KV head), not in every program
        new_bad = torch.empty(hkv, T, dtype=torch.int32, device=dev)
        new_norm = torch.empty(hkv, T, **f32) if enabled else lse
        k_s = torch.empty(hkv, T, d, dtype=k_new.dtype, device=dev)
        v_s = torch.empty(hkv, T, d, dtype=v_new.dtype, device=dev)
        q_s = torch.empty(T, hq, d, dtype=q.dtype, device=dev)
        _new_key_stats[(cdiv(T, 16), hkv)](
            k_new, k_new.stride(0), k_new.stride(1), k_new.stride(2), v_new, v_new.stride(0), v_new.stride(1),
            v_new.stride(2), new_bad, new_norm, k_s, v_s, q, q.stride(0), q.stride(1), q.stride(2), q_s, T,
            HQ=hq, QG=qg, D=d, BLOCK=16, HAS_CERT=enabled)
        _extend_kernel[(cdiv(T, block_t), hkv)](
            Q=q, stride_qt=q.stride(0), stride_qh=q.stride(1), stride_qd=q.stride(2),
            KCodes=kargs[0], KScales=kargs[1], KWit=kargs[2], KOutl=kargs[3], KBypPos=kargs[5],
            VCodes=vargs[0], VScales=vargs[1], VWit=vargs[2], VOutl=vargs[3], VBypPos=vargs[5],
            Epochs=layer_kv.epochs,
            Positions=layer_kv.positions if layer_kv.positions is not None else layer_kv.epochs,
            PrefixSlots=prefix_slots, Dig=dig, RowF=rowf, Out=out, Lse=lse, Cert=c, Logits=logits, Radius=radius,
            Delta=delta_t if delta_t is not None else lse, InitM=init[0], InitL=init[1], InitA=init[2],
            InitU=init[3], InitAcc=init[4], n_splits=n_splits, split_stride=T * hq, NewBad=new_bad, NewNorm=new_norm,
            KS=k_s, VS=v_s, QS=q_s,
            n_prefix=n_p, n_new=T,
            prefix_tiles=prefix_tiles, sm_scale=sm_scale,
            layer=layer_kv.layer, seed_lo=layer_kv.seed & 0xFFFFFFFF, seed_hi=layer_kv.seed >> 32,
            delta=delta_s, bias_coef=2.0 ** -(bits + 1) + FP_BIAS_SLACK, dot_gamma=dot_gamma,
            byp_gamma=gamma(d + ng + 3, U32), arith_abs=ARITH_ABS, dot_abs=dot_abs,
            HQ=hq, HKV=hkv, QG=qg, QGP=qgp, BLOCK_T=block_t, D=d, G=G, LOG2G=G.bit_length() - 1,
            KM2=km2, VM2=vm2, BITS=bits, CPC=CHANNELS_PER_CALL[bits], ROUNDS=quant.philox_rounds, QDIG=qdig,
            CAUSAL=bool(causal), BLOCK_N=plan.block_n, HAS_CERT=enabled,
            RADIUS_DET=enabled and cert.radius in ("det", "min"),
            RADIUS_PROB=enabled and cert.radius in ("prob", "min"), HAS_POS=layer_kv.positions is not None,
            DELTA_PER_TOKEN=delta_t is not None, RETURN_LOGITS=debug is not None,
            HAS_INIT=cuda_cfg is not None, NEW_TC=new_tc,
            V_DIRECT=cuda_cfg is not None and v_new.dtype == torch.float16,
            num_warps=plan.num_warps, num_stages=plan.num_stages)
    if debug is not None:
        debug["impl"] = "cuda" if T and cuda_cfg is not None else "triton"  # who ran the prefix phase
        debug["prefix_chunks"] = chunks  # the CUDA prefix phase's launches (prefix tokens each)
        debug["prefix_splits"] = n_splits if T else 1  # its splits (1: none; the Triton kernel's prefix: 1)
        debug["new_dot"] = "tc" if T and new_tc else "ieee"  # the exact new tokens' q.k
        debug["logits"] = logits
        if enabled:
            debug["radius"] = radius
    if cert is None:
        return out
    return ExtendOut(out=out, lse=lse, cert=c if enabled else None,
                     radius_kind=cert.radius if enabled else "none")
