"""Triton paged decode attention over the dithered INT8 pool, with the certificate.

One program of ``_decode_split_kernel`` handles (sequence b, KV head, split) and all ``QG``
query heads of the GQA group. Its tensor-core M side is the ``ROWS = QG * NG`` (query head,
scale group) pairs (padded to a power of two >= 16): row ``(h, g)`` holds head h's query
restricted to group g. So one int8 dot per query digit and byte plane gives every group's
partial dot at once, and the per-token group scales apply after the dot, exactly:

- q.k: integer dots of the query's int8 digits with the stored codes and the dither's byte
  planes (``witcert.kernels.dequant``), combined in fp32 and scaled; the logit used differs
  from ``sm q.k^`` by at most the arithmetic slack the radius includes (PROOFS 5.4).
- p.v: fp16 dots of ``p s_g / r_g`` (``r_g`` the running largest V scale of group g, so
  the operand lies in [0, 1]) with the codes and byte planes (exact in fp16), fp32
  accumulators: the output's float tier is that of fp16 SDPA (the weights rounded to fp16).
- the certificate: per (head, token) radius from the group norms of q and the stored
  witnesses / scales, plus the slack; ``a_i = sum p expm1_up(u)`` accumulated directly,
  merged across splits like the softmax; never negative, never NaN.

``_decode_merge_kernel`` combines the splits. Spec: ``witcert.ref.attention.decode_attention``
(docs/DESIGN.md "Decode attention", docs/PROOFS.md section 5).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from witcert.kernels.dequant import (dither_plane, finite_or_zero, i8_to_f16, key_dots, pow2_f32, q_digits,
                                     round_up_f32, sqrt_up)
from witcert.kernels.launch import decode_launch
from witcert.kernels.philox import dither_words, seed_key
from witcert.kernels.plan import DecodePlan, decode_plan, plan_splits  # noqa: F401 (re-export)

# ex2.approx.ftz.f32 relative error (PTX: 2^-22 on the normal range; 2^-21 leaves room) and
# the exponent-argument roundings of exp_acc over the gaps that keep a weight normal
EXP_ETA = 2.0**-21
EXP_ARG = 2.0 * 89.0 * 2.0**-24


@triton.jit
def exp_acc(x):
    """exp(x) with the argument reduction x * log2(e) done in two parts (fma)."""
    return tl.exp2(tl.fma(x, 1.44269502162933349609375, x * 1.92596298909109e-08))


@triton.jit
def expm1_up(u):
    """A value >= expm1(u) for u >= 0 (+inf for +inf), within 2^-12 relative: a Taylor
    polynomial below 1/16 (truncation < 2^-28 relative, rounding < 2^-21), else
    exp_acc(u) - 1 (relative error < 17 * (EXP_ETA + 89 * 2^-24) < 2^-12.5 there)."""
    t = u * (1.0 + u * (0.5 + u * (0.16666667163372 + u * (0.041666667908430 + u * 0.0083333337679505))))
    small = t * 1.00000095367431640625
    big = (exp_acc(u) - 1.0) * 1.000244140625
    return tl.where(u < 0.0625, small, big)


@triton.jit
def _rows_to_heads(x, BLOCK_H: tl.constexpr, NG: tl.constexpr, BLOCK_N: tl.constexpr):
    """[ROWS, BLOCK_N] -> [BLOCK_H, BLOCK_N]: sum of the NG group rows of each head."""
    return tl.sum(tl.reshape(x, (BLOCK_H, NG, BLOCK_N)), axis=1)


@triton.jit
def _heads_to_rows(x, BLOCK_H: tl.constexpr, NG: tl.constexpr, BLOCK_N: tl.constexpr):
    """[BLOCK_H, BLOCK_N] -> [ROWS, BLOCK_N]: each head's row repeated for its NG groups."""
    return tl.reshape(tl.broadcast_to(x[:, None, :], (BLOCK_H, NG, BLOCK_N)), (BLOCK_H * NG, BLOCK_N))


@triton.jit
def _load_rows(Ptr, row, mask_n, g_r, NG: tl.constexpr, other):
    """Per-token group fields (fp16 [slot, Hkv, NG]) gathered to rows: f32 [ROWS, BLOCK_N]."""
    return tl.load(Ptr + row[None, :] * NG + g_r[:, None], mask=mask_n[None, :], other=other).to(tl.float32)


@triton.jit
def _decode_split_kernel(
        Q, stride_qb, stride_qh, stride_qd,
        KCodes, KScales, KWit, KOutl, KBypPos, VCodes, VScales, VWit, VOutl, VBypPos,
        Epochs, Positions, BlockTable, stride_bt, SeqLens, DeltaLoc, delta_scalar,
        PartM, PartL, PartA, PartVW, PartVMax, PartU, PartAcc, Radius, Logits, stride_rb, stride_rh,
        sm_scale, layer, seed_lo, seed_hi, bias_coef, arith_gamma, byp_gamma, arith_abs, num_splits_grid,
        fixed_splits, min_tokens_per_split, max_splits,
        HQ: tl.constexpr, HKV: tl.constexpr, QG: tl.constexpr, BLOCK_H: tl.constexpr,
        NG: tl.constexpr, ROWS: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
        KM2: tl.constexpr, VM2: tl.constexpr, P: tl.constexpr, BITS: tl.constexpr,
        CPC: tl.constexpr, ROUNDS: tl.constexpr, QDIG: tl.constexpr, BLOCK_N: tl.constexpr,
        HAS_CERT: tl.constexpr, RADIUS_DET: tl.constexpr, RADIUS_PROB: tl.constexpr,
        RETURN_RADIUS: tl.constexpr, RETURN_LOGITS: tl.constexpr, DELTA_PTR: tl.constexpr,
        HAS_POS: tl.constexpr):
    """grid (B * Hkv, num_splits_grid). Partials per (b, query head, split): m, l, a, vw,
    vmax, umax f32 and acc f32 [D] (unnormalized), laid out [B, Hq, S(, D)]."""
    NCH: tl.constexpr = D // CPC
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = pid // HKV
    kvh = pid % HKV
    b64 = b.to(tl.int64)
    kvh64 = kvh.to(tl.int64)
    k0, k1 = seed_key(seed_lo, seed_hi)
    n_tok = tl.load(SeqLens + b)
    # the split count of a request depends on its own length only (batch invariance)
    n_splits = tl.maximum(fixed_splits, 1)
    if fixed_splits == 0:
        while (n_splits * min_tokens_per_split < n_tok) & (n_splits < max_splits):
            n_splits = n_splits * 2
    per_split = tl.cdiv(n_tok, n_splits)
    t_lo = split * per_split
    t_hi = tl.minimum(t_lo + per_split, n_tok)

    # ---- the query: rows (head, group), digits, norms, arithmetic weights -------------
    offs_r = tl.arange(0, ROWS)
    h_r = offs_r // NG
    g_r = offs_r % NG
    row_ok = h_r < QG
    offs_d = tl.arange(0, D)
    offs_h = tl.arange(0, BLOCK_H)
    mask_h = offs_h < QG
    heads = kvh * QG + offs_h
    qh = tl.load(Q + b64 * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                 mask=mask_h[:, None], other=0.0).to(tl.float32)
    q_bad = tl.max(((qh != qh) | (tl.abs(qh) == float("inf"))).to(tl.int32), axis=1) > 0
    if KM2 > 0:
        kbyp = tl.load(KBypPos + kvh64 * D + offs_d) >= 0
    else:
        kbyp = offs_d < 0
    in_row = row_ok[:, None] & ((offs_d[None, :] // G) == g_r[:, None])
    qr = tl.load(Q + b64 * stride_qb + (kvh * QG + h_r)[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                 mask=in_row, other=0.0).to(tl.float32)
    qr = finite_or_zero(qr)
    qmain = tl.where(kbyp[None, :], 0.0, qr)
    d1, d2, d3, e_r, res_r, dab_r = q_digits(qmain, QDIG)
    # row factor 2^(e - b - 8) sm: the combination below is 2^(b+1) q.(n - xi) / (2^e / 128)
    f_r = ((2.0 ** (-(BITS + 8))) * sm_scale * pow2_f32(e_r >> 1)) * pow2_f32(e_r - (e_r >> 1))
    sq1 = tl.sum(d1.to(tl.int32), axis=1)
    sq2 = tl.sum(d2.to(tl.int32), axis=1)
    sq3 = tl.sum(d3.to(tl.int32), axis=1)
    if KM2 > 0:
        qbyp = tl.where(kbyp[None, :] & (g_r[:, None] == 0), tl.load(
            Q + b64 * stride_qb + (kvh * QG + h_r)[:, None] * stride_qh + offs_d[None, :] * stride_qd,
            mask=row_ok[:, None], other=0.0).to(tl.float32), 0.0)
        qbyp = finite_or_zero(qbyp)
    if HAS_CERT:
        q64 = qmain.to(tl.float64)
        qn2 = round_up_f32(tl.sqrt(tl.sum(q64 * q64, axis=1)))  # [ROWS], bypass excluded
        qn1 = round_up_f32(tl.sum(tl.abs(q64), axis=1))
        # |l - sm q.k^| <= sm sum_g s_g (gamma 128 A_g + 127.5 R_g) (PROOFS 5.4)
        w_ar = (arith_gamma * 128.0 * dab_r + 127.5 * res_r) * sm_scale * 1.0000019073486328125
        if RADIUS_PROB:
            if DELTA_PTR:
                dl = tl.load(DeltaLoc + b).to(tl.float64)
            else:
                dl = tl.zeros([], tl.float64) + delta_scalar
            log_factor = round_up_f32(tl.sqrt(2.0 * tl.log(2.0 * n_tok.to(tl.float64) / dl))
                                      * 1.0000000000001)
        n_tiles = tl.cdiv(t_hi - t_lo, BLOCK_N)
        # softmax weights' logit-equivalent error: argument roundings + one exp per weight
        # and per rescale (the tiles of this split and the merge)
        e_soft = 1.0616e-05 + (n_tiles + 2).to(tl.float32) * 4.76837158203125e-07

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    a_i = tl.zeros([BLOCK_H], tl.float32)
    vw_i = tl.zeros([BLOCK_H], tl.float32)
    u_i = tl.zeros([BLOCK_H], tl.float32)
    vmax_i = tl.zeros([BLOCK_H], tl.float32)
    ROWF: tl.constexpr = 2.0 ** (BITS + 1)
    CB: tl.constexpr = 1.0 if BITS == 8 else (257.0 if BITS == 16 else 65793.0)
    acc = tl.zeros([ROWS, D], tl.float32)  # 2^(b+1) sum_t p s_g (n - xi) / r_v, per (head, group) row
    r_v = tl.zeros([ROWS], tl.float32)
    AO_R: tl.constexpr = ROWS if VM2 > 0 else 16
    AO_D: tl.constexpr = D if VM2 > 0 else 16
    acc_o = tl.zeros([AO_R, AO_D], tl.float32)  # bypassed V channels (exact fp16 values)

    for start in range(t_lo, t_hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < t_hi
        page = tl.load(BlockTable + b64 * stride_bt + offs_n // P, mask=mask_n, other=0)
        slot = page.to(tl.int64) * P + offs_n % P
        epoch = tl.load(Epochs + slot, mask=mask_n, other=0).to(tl.int64)
        if HAS_POS:  # position-keyed dither: the counter's first word is the token's position
            word0 = tl.load(Positions + slot, mask=mask_n, other=0).to(tl.int64)
        else:
            word0 = slot
        row = slot * HKV + kvh64
        lh = (layer << 16) | kvh

        # ---- logits: int8 dots of the digits with codes and dither planes -------------
        n_k = tl.load(KCodes + row[:, None] * D + offs_d[None, :], mask=mask_n[:, None], other=0)
        t_rows = key_dots(d1, d2, d3, sq1, sq2, sq3, n_k, word0, epoch, 0, lh, k0, k1,
                          ROUNDS, BLOCK_N, D, NCH, BITS, QDIG)
        ks_r = _load_rows(KScales, row, mask_n, g_r, NG, 1.0)  # [ROWS, BLOCK_N]
        z_rows = (t_rows * ks_r) * f_r[:, None]
        if KM2 > 0:
            xo = tl.load(KOutl + row[:, None] * KM2 + tl.load(KBypPos + kvh64 * D + offs_d)[None, :],
                         mask=mask_n[:, None] & kbyp[None, :], other=0.0).to(tl.float32)
            z_rows += tl.dot(qbyp, tl.trans(xo), input_precision="ieee") * sm_scale
        z = _rows_to_heads(z_rows, BLOCK_H, NG, BLOCK_N)  # [BLOCK_H, BLOCK_N]
        kbad = tl.max(ks_r, axis=0) == float("inf")
        ovf = (tl.abs(z) == float("inf")) | (z != z)
        z = tl.where(z != z, 0.0, tl.minimum(tl.maximum(z, -3.4028234e38), 3.4028234e38))
        z = tl.where(kbad[None, :], 0.0, z)  # a flagged key reads as 0, so its logit is 0
        z = tl.where(mask_n[None, :], z, float("-inf"))
        if RETURN_LOGITS:
            tl.store(Logits + b64 * stride_rb + heads[:, None].to(tl.int64) * stride_rh + offs_n[None, :],
                     z, mask=mask_h[:, None] & mask_n[None, :])
        m_new = tl.maximum(m_i, tl.max(z, axis=1))
        alpha = exp_acc(m_i - m_new)
        p = exp_acc(z - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)

        # ---- values: fp16 dots of p s_g / r_v with codes and planes -----------------
        vs_r = _load_rows(VScales, row, mask_n, g_r, NG, 1.0)
        vbad = tl.max(vs_r, axis=0) == float("inf")
        if HAS_CERT:
            vw_r = _load_rows(VWit, row, mask_n, g_r, NG, 0.0)
            vwn = sqrt_up(tl.sum(tl.reshape(vw_r * vw_r, (BLOCK_H, NG, BLOCK_N)), axis=1))
            vwn = tl.max(vwn, axis=0) * 1.00000095367431640625  # [BLOCK_N], inf if flagged
            vbad = vbad | (vwn == float("inf"))
        n_v = tl.load(VCodes + row[:, None] * D + offs_d[None, :], mask=mask_n[:, None], other=0)
        v0, v1, v2, v3 = dither_words(word0[:, None], epoch[:, None], tl.arange(0, NCH)[None, :],
                                      lh, 1, k0, k1, ROUNDS)
        p_rows = _heads_to_rows(tl.where(vbad[None, :], 0.0, p), BLOCK_H, NG, BLOCK_N)
        # p s_g in fp16, relative to the largest V scale of the group seen so far (r_v), so
        # it lies in [0, 1] whatever the scales' range; the accumulator carries r_v's rescale
        vsm = tl.where(vbad[None, :] | ~mask_n[None, :], 0.0, vs_r)
        r_new = tl.maximum(r_v, tl.max(vsm, axis=1))
        r_new = tl.where(r_new > 0.0, r_new, 1.0)
        a2 = _heads_to_rows(alpha[:, None] + tl.zeros([BLOCK_H, 1], tl.float32), BLOCK_H, NG, 1) \
            * (r_v / r_new)[:, None]
        pv = (p_rows * (vsm / r_new[:, None])).to(tl.float16)
        r_v = r_new
        # 2^(b+1) (n - xi) = 2^(b+1) n - 2 sum_p 256^p rho_p - C_b: one accumulator
        pvn = tl.dot(pv, i8_to_f16(n_v)) * ROWF
        pvr = tl.dot(pv, i8_to_f16(dither_plane(v0, v1, v2, v3, 0, BLOCK_N, D, BITS)))
        if BITS >= 16:
            pvr += tl.dot(pv, i8_to_f16(dither_plane(v0, v1, v2, v3, 1, BLOCK_N, D, BITS))) * 256.0
        if BITS == 24:
            pvr += tl.dot(pv, i8_to_f16(dither_plane(v0, v1, v2, v3, 2, BLOCK_N, D, BITS))) * 65536.0
        pvc = tl.sum(pv.to(tl.float32), axis=1)
        acc = acc * a2 + (pvn - 2.0 * pvr - CB * pvc[:, None])
        if VM2 > 0:
            vpos = tl.load(VBypPos + kvh64 * D + offs_d)
            xv = tl.load(VOutl + row[:, None] * VM2 + vpos[None, :],
                         mask=mask_n[:, None] & (vpos[None, :] >= 0) & ~vbad[:, None], other=0.0)
            p0_rows = tl.where(g_r[:, None] == 0, p_rows, 0.0)  # each head once (rows of group 0)
            acc_o = acc_o * _heads_to_rows(alpha[:, None] + tl.zeros([BLOCK_H, 1], tl.float32), BLOCK_H, NG, 1) \
                + tl.dot(p0_rows.to(tl.float16), xv.to(tl.float16))

        if HAS_CERT:
            kw_r = _load_rows(KWit, row, mask_n, g_r, NG, 0.0)
            u = tl.full([BLOCK_H, BLOCK_N], float("inf"), tl.float32)
            if RADIUS_DET:
                u = _rows_to_heads(qn2[:, None] * tl.where(kw_r == float("inf"), 0.0, kw_r),
                                   BLOCK_H, NG, BLOCK_N) * sm_scale
            if RADIUS_PROB:
                ksf = tl.where(ks_r == float("inf"), 0.0, ks_r)
                t2v = qn2[:, None] * ksf
                sig2 = _rows_to_heads(t2v * t2v, BLOCK_H, NG, BLOCK_N)
                l1 = _rows_to_heads(qn1[:, None] * ksf, BLOCK_H, NG, BLOCK_N)
                up = sm_scale * sqrt_up(sig2 / 12.0) * log_factor + bias_coef * sm_scale * l1
                u = tl.minimum(u, up)
            ksf2 = tl.where(ks_r == float("inf"), 0.0, ks_r)
            u_ar = _rows_to_heads(w_ar[:, None] * ksf2, BLOCK_H, NG, BLOCK_N)
            if KM2 > 0:
                sb = tl.dot(tl.abs(qbyp), tl.trans(tl.abs(xo)), input_precision="ieee")
                u_ar += _rows_to_heads(sb, BLOCK_H, NG, BLOCK_N) * (sm_scale * byp_gamma)
            u = u * 1.0000152587890625 + u_ar * 1.0000152587890625 + (arith_abs + e_soft)
            flagged = kbad | vbad
            u = tl.where(flagged[None, :] | ovf | q_bad[:, None] | (u != u), float("inf"), u)
            live = mask_n[None, :] & mask_h[:, None]
            term = tl.where(live & (p > 0.0), p * expm1_up(u), 0.0)
            a_i = tl.where(a_i == float("inf"), a_i, a_i * alpha) + tl.sum(term, axis=1)
            u_i = tl.maximum(u_i, tl.max(tl.where(live, u, 0.0), axis=1))
            pw = tl.where(vwn[None, :] == float("inf"), float("inf"), p * vwn[None, :])
            pw = tl.where(live, pw, 0.0)
            vw_i = tl.where(vw_i == float("inf"), vw_i, vw_i * alpha) + tl.sum(pw, axis=1)
            # ||v^_t|| <= 127.5 sqrt(G sum_g s_g^2) on the stored channels (spec: vmax bound)
            vsf = tl.where(vs_r == float("inf"), 0.0, vs_r)
            vn2 = tl.max(tl.reshape(vsf * vsf, (BLOCK_H, NG, BLOCK_N)).sum(axis=1), axis=0)
            vrad = 127.5 * sqrt_up(vn2 * G) * 1.00000095367431640625 + vwn
            if VM2 > 0:
                vrad += sqrt_up(tl.sum(xv.to(tl.float32) * xv.to(tl.float32), axis=1)) * 1.00000095367431640625
            vmax_i = tl.maximum(vmax_i, tl.max(tl.where(mask_n & ~vbad, vrad, 0.0), axis=0))
            vmax_i = tl.where(tl.max((mask_n & vbad).to(tl.int32), axis=0) > 0, float("inf"), vmax_i)
            if RETURN_RADIUS:
                tl.store(Radius + b64 * stride_rb + heads[:, None].to(tl.int64) * stride_rh + offs_n[None, :],
                         u, mask=mask_h[:, None] & mask_n[None, :])
        m_i = m_new

    # ---- partials: combine the planes, select each channel's group row ----------------
    sel = tl.where((offs_d[None, :] // G) == g_r[:, None], acc * r_v[:, None], 0.0) * (1.0 / ROWF)
    out = tl.sum(tl.reshape(sel, (BLOCK_H, NG, D)), axis=1)
    if VM2 > 0:
        vsel = tl.load(VBypPos + kvh64 * D + offs_d) >= 0
        out = tl.where(vsel[None, :], _rows_to_heads(acc_o, BLOCK_H, NG, D), out)
    part = (b * HQ + heads).to(tl.int64) * num_splits_grid + split
    tl.store(PartM + part, m_i, mask=mask_h)
    tl.store(PartL + part, l_i, mask=mask_h)
    tl.store(PartAcc + part[:, None] * D + offs_d[None, :], out, mask=mask_h[:, None])
    if HAS_CERT:
        tl.store(PartA + part, a_i, mask=mask_h)
        tl.store(PartVW + part, vw_i, mask=mask_h)
        tl.store(PartVMax + part, vmax_i, mask=mask_h)
        tl.store(PartU + part, u_i, mask=mask_h)


@triton.jit
def _decode_merge_kernel(PartM, PartL, PartA, PartVW, PartVMax, PartU, PartAcc,
                         Out, Lse, Cert, VBound, Q, stride_qb, stride_qh, stride_qd, SeqLens,
                         num_splits, block_n, fixed_splits, min_tokens_per_split, max_splits,
                         HQ: tl.constexpr, D: tl.constexpr, S_PAD: tl.constexpr,
                         HAS_CERT: tl.constexpr):
    """grid (B * Hq,). Rescales split s by w_s = exp(m_s - M): acc, l, a, vw; maxes vmax and
    umax. cert = (1 + kappa) sum_s w_s a_s / L + N exp(2 U - 87) (PROOFS 5.5), kappa from
    the depth of the sums; a query head with a non-finite entry gets cert = vbound = +inf."""
    row = tl.program_id(0).to(tl.int64)
    offs_s = tl.arange(0, S_PAD)
    mask_s = offs_s < num_splits
    base = row * num_splits + offs_s
    m = tl.load(PartM + base, mask=mask_s, other=float("-inf"))
    l = tl.load(PartL + base, mask=mask_s, other=0.0)
    m_all = tl.max(m, axis=0)
    w = tl.where(m > float("-inf"), exp_acc(m - m_all), 0.0)
    l_all = tl.sum(w * l, axis=0)
    offs_d = tl.arange(0, D)
    accs = tl.load(PartAcc + base[:, None] * D + offs_d[None, :], mask=mask_s[:, None], other=0.0)
    out = tl.sum(w[:, None] * accs, axis=0) / l_all
    tl.store(Out + row * D + offs_d, out)
    tl.store(Lse + row, m_all + tl.log(l_all))
    if HAS_CERT:
        b = row // HQ
        h = row % HQ
        n_tok = tl.load(SeqLens + b)
        n_splits = tl.maximum(fixed_splits, 1)
        if fixed_splits == 0:
            while (n_splits * min_tokens_per_split < n_tok) & (n_splits < max_splits):
                n_splits = n_splits * 2
        tiles = tl.cdiv(tl.cdiv(n_tok, n_splits), block_n)
        # roundings a term of a or l goes through: product, tile sum, the tiles' rescales and
        # adds, the split weight, the split sum, the division, 2 to spare
        depth = (block_n + 2 * tiles + n_splits + 5).to(tl.float32)
        kappa = 2.0 * depth * 5.9604644775390625e-08 / (1.0 - depth * 5.9604644775390625e-08)
        a = tl.load(PartA + base, mask=mask_s, other=0.0)
        vw = tl.load(PartVW + base, mask=mask_s, other=0.0)
        vmax = tl.max(tl.load(PartVMax + base, mask=mask_s, other=0.0), axis=0)
        umax = tl.max(tl.load(PartU + base, mask=mask_s, other=0.0), axis=0)
        wa = tl.where(w > 0, w * a, 0.0)
        wv = tl.where(w > 0, w * vw, 0.0)
        # tl.exp is ex2.approx of a rounded x log2(e): within 2^-17.5 relative at |x| <= 88
        # (PROOFS 5.5), inside the 1 + 2^-16 the tail is multiplied by
        tail = tl.where(umax == float("inf"), float("inf"),
                        n_tok.to(tl.float32) * tl.exp(tl.minimum(2.0 * umax - 87.0, 88.0)) * 1.0000152587890625)
        # IEEE quotients (``/`` is div.full.f32 in Triton: 2 ulp) so each is the one rounding
        # the depth counts
        cert = tl.math.div_rn(tl.sum(wa, axis=0), l_all) * (1.0 + kappa) + tail
        cert = cert * 1.00000023841858  # the two adds above
        vbound = (2.0 * tl.minimum(cert, 1.0) * vmax + tl.math.div_rn(tl.sum(wv, axis=0), l_all)) * (1.0 + kappa)
        q = tl.load(Q + b * stride_qb + h * stride_qh + offs_d * stride_qd).to(tl.float32)
        q_bad = tl.sum(((q != q) | (tl.abs(q) == float("inf"))).to(tl.int32), axis=0) > 0
        tl.store(Cert + row, tl.where(q_bad | (cert != cert), float("inf"), cert))
        tl.store(VBound + row, tl.where(q_bad | (vbound != vbound), float("inf"), vbound))


def decode_attention(q: torch.Tensor, layer_kv, block_table: torch.Tensor, seq_lens: torch.Tensor, *,
                     page_size: int, sm_scale: float, cert, delta_loc, num_splits: int | None = 1,
                     return_radius: bool = False, plan: DecodePlan | None = None,
                     debug: dict | None = None):
    """One decode step for B sequences over one layer's pool (Triton).

    Same contract as ``witcert.ref.attention.decode_attention``: q float [B, Hq, D] (any
    strides); block_table int32 [B, pages]; seq_lens int32 [B] (each in [1, pages * P],
    not checked: checking would sync with the host); delta_loc float or f32 [B] on q's
    device. num_splits: an int S applied to every request (the reference's split for
    split), or None: each request uses its own planned split count (``plan``, a function
    of its length only: batch invariant). Returns ``witcert.ref.attention.DecodeOut``;
    radius is [B, Hq, pages * P] (0 past each seq_len) when requested. No host sync: safe to
    capture in a CUDA graph. plan: tiles and warps (``decode_plan`` by default, cached per
    device and geometry). debug: a dict that receives ``logits`` f32 [B, Hq, pages * P],
    the logits the kernel used (soundness tests).
    """
    return decode_launch(q, layer_kv, block_table, seq_lens, page_size=page_size, sm_scale=sm_scale,
                         cert=cert, delta_loc=delta_loc, num_splits=num_splits,
                         return_radius=return_radius, plan=plan, debug=debug,
                         split_kernel=_decode_split_kernel, merge_kernel=_decode_merge_kernel)
