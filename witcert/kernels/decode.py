"""Triton paged decode attention over the dithered INT8 pool, with the certificate.

One program of ``_decode_split_kernel`` handles (batch b, KV head, split): all the
query heads of the GQA group at once, so every K/V load and every Philox call of the
dither reconstruction is shared by the group. It dequantizes (codes - xi) * scale,
runs the online softmax and accumulates the certificate sum ``a_i`` (and the value
bound terms) in the same pass. ``_decode_merge_kernel`` combines the splits with the
same log-sum-exp weights. Spec: ``witcert.ref.attention.decode_attention`` and
docs/DESIGN.md "Decode attention".
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from witcert.kernels.philox import CHANNELS_PER_CALL, dither_r_join, dither_words, dither_xi, seed_key


MIN_TOKENS_PER_SPLIT = tl.constexpr(512)
MAX_SPLITS = tl.constexpr(256)
DEFAULT_FMA_DOT = True  # register multiply-reduce for the GQA group (see decode_attention)


def plan_splits(max_seq_len: int) -> int:
    """Number of KV splits for a sequence of ``max_seq_len`` tokens (its length alone).

    Never depends on the batch: the launcher applies it per request (in-kernel, from
    that request's own length), so a request's result does not change with what it is
    batched with; called with the capacity it sizes the grid. The smallest power of
    two giving at most ``MIN_TOKENS_PER_SPLIT`` tokens per split, capped at ``MAX_SPLITS``.
    """
    n = max(int(max_seq_len), 1)
    s = 1 << (-(-n // MIN_TOKENS_PER_SPLIT.value) - 1).bit_length()
    return min(s, MAX_SPLITS.value)


@triton.jit
def exp_acc(x):
    """exp(x) with the argument reduction x * log2(e) done in two parts (fma): the fast
    ``tl.exp`` rounds x * log2(e) first, a relative error of |x| * 2^-24 in the result,
    which for logit gaps of ~20 is several times torch's expf error."""
    return tl.exp2(tl.fma(x, 1.44269502162933349609375, x * 1.92596298909109e-08))


@triton.jit
def _kahan_add(s, c, x):
    """Compensated ``s + x``: returns (sum, compensation); the true running sum is sum - c."""
    y = x - c
    t = s + y
    return t, (t - s) - y


@triton.jit
def _repeat_groups(s, BLOCK_N: tl.constexpr, NG: tl.constexpr, LOG2G: tl.constexpr):
    """[BLOCK_N, NG] -> [BLOCK_N, NG << LOG2G], each entry repeated G times (register joins)."""
    for i in tl.static_range(LOG2G):
        s = tl.reshape(tl.join(s, s), (BLOCK_N, NG << (i + 1)))
    return s


@triton.jit
def _dequant_tile(Codes, Scales, Outl, byp_pos, slot, mask_n, epoch, kv_head, side,
                  layer, k0, k1,
                  HKV: tl.constexpr, D: tl.constexpr, G: tl.constexpr, LOG2G: tl.constexpr,
                  M2: tl.constexpr, BITS: tl.constexpr, CPC: tl.constexpr, BLOCK_N: tl.constexpr):
    """Dequantized tile f32 [BLOCK_N, D], scales f32 [BLOCK_N, NG] and the flag [BLOCK_N].

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
    if BITS == 0:  # benchmark-only variant: no dither reconstruction (wrong values)
        x = n.to(tl.float32) * _repeat_groups(s, BLOCK_N, NG, LOG2G)
    else:
        w0, w1, w2, w3 = dither_words(slot[:, None], epoch[:, None], tl.arange(0, NCH)[None, :],
                                      (layer << 16) | kv_head, side, k0, k1)
        r = dither_r_join(w0, w1, w2, w3, BLOCK_N, D, BITS)
        if BITS <= 16:
            # n - xi = (n 2^(b+1) - 2r + 2^b - 1) / 2^(b+1) exactly (|numerator| < 2^24), and
            # scaling s by the power of two is exact, so this equals (n - xi) * s bitwise.
            num = n * (1 << (BITS + 1)) - 2 * r + ((1 << BITS) - 1)
            x = num.to(tl.float32) * _repeat_groups(s * (1.0 / (1 << (BITS + 1))), BLOCK_N, NG, LOG2G)
        else:
            x = (n.to(tl.float32) - dither_xi(r, BITS)) * _repeat_groups(s, BLOCK_N, NG, LOG2G)
    if M2 > 0:
        xo = tl.load(Outl + row[:, None] * M2 + byp_pos[None, :],
                     mask=mask_n[:, None] & (byp_pos[None, :] >= 0), other=0.0)
        x = tl.where(byp_pos[None, :] >= 0, xo.to(tl.float32), x)
    x = tl.where(bad[:, None], 0.0, x)
    return x, s, bad


@triton.jit
def _dequant_group(Codes, s_g, Outl, BypPos, slot, mask_n, epoch, kv_head, side, layer, k0, k1, g,
                   HKV: tl.constexpr, D: tl.constexpr, G: tl.constexpr, M2: tl.constexpr,
                   BITS: tl.constexpr, CPC: tl.constexpr, BLOCK_N: tl.constexpr):
    """Channels [g G, (g+1) G) of the dequantized tile, f32 [BLOCK_N, G] (G % CPC == 0).

    s_g: f32 [BLOCK_N], the group's scales. Same values as ``_dequant_tile`` (flag not
    applied: the caller masks flagged rows).
    """
    NCH: tl.constexpr = G // CPC
    row = slot * HKV + kv_head
    offs_c = g * G + tl.arange(0, G)
    n = tl.load(Codes + row[:, None] * D + offs_c[None, :], mask=mask_n[:, None], other=0).to(tl.int32)
    w0, w1, w2, w3 = dither_words(slot[:, None], epoch[:, None], g * NCH + tl.arange(0, NCH)[None, :],
                                  (layer << 16) | kv_head, side, k0, k1)
    r = dither_r_join(w0, w1, w2, w3, BLOCK_N, G, BITS)
    if BITS <= 16:
        num = n * (1 << (BITS + 1)) - 2 * r + ((1 << BITS) - 1)
        x = num.to(tl.float32) * (s_g * (1.0 / (1 << (BITS + 1))))[:, None]
    else:
        x = (n.to(tl.float32) - dither_xi(r, BITS)) * s_g[:, None]
    if M2 > 0:
        pos = tl.load(BypPos + kv_head * D + offs_c)
        xo = tl.load(Outl + row[:, None] * M2 + pos[None, :], mask=mask_n[:, None] & (pos[None, :] >= 0),
                     other=0.0)
        x = tl.where(pos[None, :] >= 0, xo.to(tl.float32), x)
    return x


@triton.jit
def _group_col(x, g, NG: tl.constexpr):
    """Column g of x [R, NG] as [R]."""
    return tl.sum(tl.where(tl.arange(0, NG)[None, :] == g, x, 0.0), axis=1)


@triton.jit
def _decode_split_kernel(
        Q, stride_qb, stride_qh, stride_qd,
        KCodes, KScales, KWit, KOutl, KBypPos,
        VCodes, VScales, VWit, VOutl, VBypPos,
        Epochs, BlockTable, stride_bt, SeqLens, DeltaLoc, delta_scalar,
        PartM, PartL, PartA, PartVW, PartVMax, PartAcc, Radius, stride_rb, stride_rh,
        sm_scale, layer, seed_lo, seed_hi, bias_coef,
        HQ: tl.constexpr, HKV: tl.constexpr, QG: tl.constexpr, BLOCK_H: tl.constexpr,
        D: tl.constexpr, G: tl.constexpr, LOG2G: tl.constexpr, KM2: tl.constexpr, VM2: tl.constexpr,
        num_splits_grid, fixed_splits, P: tl.constexpr,
        BITS: tl.constexpr, CPC: tl.constexpr, BLOCK_N: tl.constexpr,
        HAS_CERT: tl.constexpr, RADIUS_DET: tl.constexpr, RADIUS_PROB: tl.constexpr,
        RETURN_RADIUS: tl.constexpr, DELTA_PTR: tl.constexpr,
        CHUNK_QK: tl.constexpr, FMA_DOT: tl.constexpr):
    """grid (B * Hkv, num_splits_grid). A request uses ``fixed_splits`` splits, or
    ``plan_splits(seq_len)`` when fixed_splits == 0; programs past it emit empty partials
    (m = -inf, l = 0). The QG query heads of the KV group are the BLOCK_H rows of every
    tile: FMA_DOT multiplies and reduces in registers (BLOCK_H = next power of two of QG,
    no padding), else an fp32 (ieee) ``tl.dot`` (BLOCK_H >= 16, Triton's minimum). Partials per (b, query head, split): m, l, a,
    vw, vmax f32 and acc f32 [D] (unnormalized), laid out [B, Hq, S(, D)]."""
    NG: tl.constexpr = D // G
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = pid // HKV
    kvh = pid % HKV
    k0, k1 = seed_key(seed_lo, seed_hi)
    n_tok = tl.load(SeqLens + b)
    # fixed_splits > 0: that many splits for every request; 0: plan_splits(n_tok) in-kernel,
    # so the split of a request depends on its own length only
    n_splits = tl.maximum(fixed_splits, 1)
    if fixed_splits == 0:
        while (n_splits * MIN_TOKENS_PER_SPLIT < n_tok) & (n_splits < MAX_SPLITS):
            n_splits = n_splits * 2
    per_split = tl.cdiv(n_tok, n_splits)
    t_lo = split * per_split
    t_hi = tl.minimum(t_lo + per_split, n_tok)

    offs_h = tl.arange(0, BLOCK_H)
    mask_h = offs_h < QG
    heads = kvh * QG + offs_h
    offs_d = tl.arange(0, D)
    q = tl.load(Q + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh + offs_d[None, :] * stride_qd,
                mask=mask_h[:, None], other=0.0).to(tl.float32)
    q_fin = (q == q) & (tl.abs(q) < float("inf"))
    q_bad = tl.min(q_fin.to(tl.int32), axis=1) == 0  # [BLOCK_H]
    q = tl.where(q_fin, q, 0.0)
    if KM2 > 0:
        kbyp = tl.load(KBypPos + kvh * D + offs_d)
    else:
        kbyp = offs_d * 0 - 1
    if VM2 > 0:
        vbyp = tl.load(VBypPos + kvh * D + offs_d)
    else:
        vbyp = offs_d * 0 - 1
    qs = q * sm_scale

    if HAS_CERT:
        qm = tl.reshape(tl.where(kbyp[None, :] >= 0, 0.0, q), (BLOCK_H, NG, G))
        qn2 = tl.sqrt(tl.sum(qm * qm, axis=2))  # [BLOCK_H, NG]
        qn1 = tl.sum(tl.abs(qm), axis=2)
        if RADIUS_PROB:
            if DELTA_PTR:
                dl = tl.load(DeltaLoc + b).to(tl.float32)
            else:
                dl = delta_scalar
            # sqrt(2 ln(2N / delta)) in fp32 with fast log/sqrt; the factor (1 + 2^-18)
            # covers their error (<< 1e-6 relative) so the radius never shrinks
            log_factor = tl.sqrt(2.0 * tl.log(2.0 * n_tok.to(tl.float32) / dl)) * 1.000003814697265625

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    a_i = tl.zeros([BLOCK_H], tl.float32)
    vw_i = tl.zeros([BLOCK_H], tl.float32)
    vmax_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, D], tl.float32)
    l_c = tl.zeros([BLOCK_H], tl.float32)
    acc_c = tl.zeros([BLOCK_H, D], tl.float32)
    kvh64 = kvh.to(tl.int64)

    for start in range(t_lo, t_hi, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < t_hi
        page = tl.load(BlockTable + b.to(tl.int64) * stride_bt + offs_n // P, mask=mask_n, other=0)
        slot = page.to(tl.int64) * P + offs_n % P
        epoch = tl.load(Epochs + slot, mask=mask_n, other=0).to(tl.int64)
        row = slot * HKV + kvh64

        if CHUNK_QK:
            # q.k one scale group at a time: each fp32 FMA dot has K = G, not D, which keeps
            # its operands (a K-long slice per thread) in registers
            ks = tl.load(KScales + row[:, None] * NG + tl.arange(0, NG)[None, :], mask=mask_n[:, None],
                         other=1.0).to(tl.float32)
            kbad = tl.max(ks, axis=1) == float("inf")
            z = tl.zeros([BLOCK_H, BLOCK_N], tl.float32)
            z64 = tl.zeros([BLOCK_H, BLOCK_N], tl.float64)
            for g in tl.static_range(NG):
                kg = _dequant_group(KCodes, _group_col(ks, g, NG), KOutl, KBypPos, slot, mask_n, epoch, kvh64,
                                    0, layer, k0, k1, g, HKV, D, G, KM2, BITS, CPC, BLOCK_N)
                offs_cg = g * G + tl.arange(0, G)
                qg = tl.load(Q + b.to(tl.int64) * stride_qb + heads[:, None] * stride_qh
                             + offs_cg[None, :] * stride_qd, mask=mask_h[:, None], other=0.0).to(tl.float32)
                qg = tl.where((qg == qg) & (tl.abs(qg) < float("inf")), qg, 0.0)
                if not FMA_DOT:
                    qg = qg * sm_scale
                if FMA_DOT:
                    # float64 products and sums (the fp32 operands multiply exactly): one
                    # rounding of z instead of one per term; large logits make these
                    # rounding errors the largest error of the output
                    z64 += tl.sum(qg.to(tl.float64)[:, None, :] * kg.to(tl.float64)[None, :, :], axis=2)
                else:
                    z += tl.dot(qg, tl.trans(kg), input_precision="ieee")
        else:
            k, ks, kbad = _dequant_tile(KCodes, KScales, KOutl, kbyp, slot, mask_n, epoch, kvh64, 0,
                                        layer, k0, k1, HKV, D, G, LOG2G, KM2, BITS, CPC, BLOCK_N)
            if FMA_DOT:
                z = (tl.sum(q.to(tl.float64)[:, None, :] * k.to(tl.float64)[None, :, :], axis=2)
                     * sm_scale).to(tl.float32)
            else:
                z = tl.dot(qs, tl.trans(k), input_precision="ieee")  # [BLOCK_H, BLOCK_N]
        if CHUNK_QK and FMA_DOT:
            z = (z64 * sm_scale).to(tl.float32)
        if HAS_CERT:
            # the reference flags a token-head by its witness (+inf when flagged at write)
            kw = tl.load(KWit + row[:, None] * NG + tl.arange(0, NG)[None, :], mask=mask_n[:, None],
                         other=0.0).to(tl.float32)
            kbad = kbad | (tl.max(kw, axis=1) == float("inf"))
        z = tl.where(kbad[None, :], 0.0, z)  # a flagged key reads as 0, so its logit is 0
        z = tl.where(mask_n[None, :], z, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(z, axis=1))
        alpha = exp_acc(m_i - m_new)
        p = exp_acc(z - m_new[:, None])
        # compensated (Kahan) running sums: the tile sums are exact-ish tree reductions, the
        # sequential sum over tiles would otherwise grow its rounding error with the length
        l_i, l_c = _kahan_add(l_i * alpha, l_c * alpha, tl.sum(p, axis=1))

        v, vs, vbad = _dequant_tile(VCodes, VScales, VOutl, vbyp, slot, mask_n, epoch, kvh64, 1,
                                    layer, k0, k1, HKV, D, G, LOG2G, VM2, BITS, CPC, BLOCK_N)
        if HAS_CERT:
            vw = tl.load(VWit + row[:, None] * NG + tl.arange(0, NG)[None, :], mask=mask_n[:, None],
                         other=0.0).to(tl.float32)
            vwn = tl.sqrt(tl.sum(vw * vw, axis=1))  # [BLOCK_N], inf for a flagged V
            vbad = vbad | (vwn == float("inf"))
            v = tl.where(vbad[:, None], 0.0, v)
        if FMA_DOT:
            pv = tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        else:
            pv = tl.dot(p, v, input_precision="ieee")
        acc, acc_c = _kahan_add(acc * alpha[:, None], acc_c * alpha[:, None], pv)

        if HAS_CERT:
            u = tl.zeros([BLOCK_H, BLOCK_N], tl.float32)
            if RADIUS_DET:
                kwf = tl.where(kw == float("inf"), 0.0, kw)
                for g in tl.static_range(NG):
                    u += _group_col(qn2, g, NG)[:, None] * _group_col(kwf, g, NG)[None, :]
                u = u * sm_scale
            if RADIUS_PROB:
                ksf = tl.where(kbad[:, None], 0.0, ks)
                sig2 = tl.zeros([BLOCK_H, BLOCK_N], tl.float32)
                l1 = tl.zeros([BLOCK_H, BLOCK_N], tl.float32)
                for g in tl.static_range(NG):
                    sg = _group_col(ksf, g, NG)[None, :]
                    t2 = _group_col(qn2, g, NG)[:, None] * sg
                    sig2 += t2 * t2
                    l1 += _group_col(qn1, g, NG)[:, None] * sg
                up = sm_scale * tl.sqrt(sig2 / 12.0) * log_factor + bias_coef * sm_scale * l1
                if RADIUS_DET:
                    u = tl.minimum(u, up)
                else:
                    u = up
            flagged = kbad | vbad
            u = tl.where(flagged[None, :] | q_bad[:, None], float("inf"), u)
            e = tl.where(mask_n[None, :], exp_acc(z - m_new[:, None] + u), 0.0)
            # alpha can underflow to 0 after an inf entered: keep inf, never inf * 0
            a_i = tl.where(a_i == float("inf"), a_i, a_i * alpha) + tl.sum(e, axis=1)
            pw = tl.where(vwn[None, :] == float("inf"), float("inf"), p * vwn[None, :])
            pw = tl.where(mask_n[None, :], pw, 0.0)
            vw_i = tl.where(vw_i == float("inf"), vw_i, vw_i * alpha) + tl.sum(pw, axis=1)
            vrad = tl.sqrt(tl.sum(v * v, axis=1)) + vwn
            vmax_i = tl.maximum(vmax_i, tl.max(tl.where(mask_n, vrad, 0.0), axis=0))
            if RETURN_RADIUS:
                tl.store(Radius + b.to(tl.int64) * stride_rb + heads[:, None].to(tl.int64) * stride_rh
                         + offs_n[None, :], u, mask=mask_h[:, None] & mask_n[None, :])
        m_i = m_new

    l_i = l_i - l_c
    acc = acc - acc_c
    part = (b * HQ + heads).to(tl.int64) * num_splits_grid + split  # [BLOCK_H]
    tl.store(PartM + part, m_i, mask=mask_h)
    tl.store(PartL + part, l_i, mask=mask_h)
    tl.store(PartAcc + part[:, None] * D + offs_d[None, :], acc, mask=mask_h[:, None])
    if HAS_CERT:
        tl.store(PartA + part, a_i, mask=mask_h)
        tl.store(PartVW + part, vw_i, mask=mask_h)
        tl.store(PartVMax + part, vmax_i, mask=mask_h)


@triton.jit
def _decode_merge_kernel(PartM, PartL, PartA, PartVW, PartVMax, PartAcc,
                         Out, Lse, Cert, VBound, Q, stride_qb, stride_qh, stride_qd, num_splits,
                         HQ: tl.constexpr, D: tl.constexpr,
                         S_PAD: tl.constexpr, HAS_CERT: tl.constexpr):
    """grid (B * Hq,). Rescales split s by w_s = exp(m_s - M): acc, l, a, vw; maxes vmax.
    Splits with w_s = 0 (empty, or underflowed) contribute nothing, as in the reference.
    A query head with a non-finite entry gets cert = vbound = +inf."""
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
        a = tl.load(PartA + base, mask=mask_s, other=0.0)
        vw = tl.load(PartVW + base, mask=mask_s, other=0.0)
        vmax = tl.max(tl.load(PartVMax + base, mask=mask_s, other=0.0), axis=0)
        wa = tl.where(w > 0, w * a, 0.0)
        wv = tl.where(w > 0, w * vw, 0.0)
        cert = tl.sum(wa, axis=0) / l_all - 1.0
        vbound = 2.0 * tl.minimum(cert, 1.0) * vmax + tl.sum(wv, axis=0) / l_all
        b = row // HQ
        h = row % HQ
        q = tl.load(Q + b * stride_qb + h * stride_qh + offs_d * stride_qd).to(tl.float32)
        q_bad = tl.sum(((q != q) | (tl.abs(q) == float("inf"))).to(tl.int32), axis=0) > 0
        tl.store(Cert + row, tl.where(q_bad, float("inf"), cert))
        tl.store(VBound + row, tl.where(q_bad, float("inf"), vbound))


def decode_attention(q: torch.Tensor, layer_kv, block_table: torch.Tensor, seq_lens: torch.Tensor, *,
                     page_size: int, sm_scale: float, cert, delta_loc, num_splits: int | None = 1,
                     return_radius: bool = False, block_n: int | None = None,
                     num_warps: int | None = None, chunk_qk: bool | None = None,
                     fma_dot: bool | None = None, _bench_no_dither: bool = False,
                     _launch_info: dict | None = None):
    """One decode step for B sequences over one layer's pool (Triton).

    Same contract as ``witcert.ref.attention.decode_attention``: q float [B, Hq, D] (any
    strides); block_table int32 [B, pages]; seq_lens int32 [B] (each in [1, pages * P],
    not checked: checking would sync with the host); delta_loc float or f32 [B].
    num_splits: an int S applied to every request (matches the reference split for
    split), or None: each request uses ``plan_splits(its own seq_len)`` (batch invariant).
    Returns ``witcert.ref.attention.DecodeOut``; radius is [B, Hq, pages * P] (0 past each
    seq_len) when requested. No host sync: safe to capture in a CUDA graph.
    block_n, num_warps: tile tokens and warps per program (tuning). chunk_qk: compute q.k
    one scale group at a time (default when the group is a whole number of Philox chunks).
    fma_dot: q.k and p.v as register multiply-reduce over the QG heads of the group (no
    padding to 16 rows), with q.k in float64 (exact products, one rounding of each logit),
    instead of an fp32 ``tl.dot`` (default ``DEFAULT_FMA_DOT``; a float64 ``tl.dot`` does
    not compile on Triton 3.6). ``_bench_no_dither``
    skips the dither reconstruction (wrong values; benchmarks only, to cost the PRNG);
    ``_launch_info`` (a dict) receives the split kernel's registers and spills (tuning).
    """
    from witcert.kernels.write import check_pool, side_args
    from witcert.ref.attention import DecodeOut

    check_pool(layer_kv)
    assert q.dim() == 3 and q.is_floating_point(), f"q must be float [B, Hq, D], got {q.dtype} {tuple(q.shape)}"
    B, hq, d = q.shape
    hkv = layer_kv.num_kv_heads
    assert d == layer_kv.head_dim and hq % hkv == 0, f"q {tuple(q.shape)} does not fit Hkv={hkv} D={layer_kv.head_dim}"
    assert block_table.dtype == torch.int32 and block_table.dim() == 2 and block_table.shape[0] == B, \
        f"block_table must be int32 [B={B}, pages], got {block_table.dtype} {tuple(block_table.shape)}"
    assert seq_lens.dtype == torch.int32 and seq_lens.shape == (B,), "seq_lens must be int32 [B]"
    assert page_size >= 1 and layer_kv.num_slots % page_size == 0, "page_size must divide num_slots"
    assert num_splits is None or num_splits >= 1, "num_splits must be None or >= 1"
    dev = q.device
    qg = hq // hkv
    nmax = block_table.shape[1] * page_size
    s_grid = plan_splits(nmax) if num_splits is None else int(num_splits)
    bits = 0 if _bench_no_dither else layer_kv.quant.dither_bits
    enabled = bool(cert.enabled)
    want_det = enabled and cert.radius in ("det", "min")
    want_prob = enabled and cert.radius in ("prob", "min")
    f32 = dict(dtype=torch.float32, device=dev)
    part_m = torch.empty(B, hq, s_grid, **f32)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty(B, hq, s_grid, d, **f32)
    part_a, part_vw, part_vmax = (torch.empty_like(part_m) for _ in range(3)) if enabled else (part_m,) * 3
    delta_ptr = isinstance(delta_loc, torch.Tensor)
    if delta_ptr:
        assert delta_loc.numel() in (1, B), f"delta_loc tensor must be [B={B}] or a scalar"
        # no-op for an f32 [B] tensor already on q's device (the graph-safe case)
        delta_loc = delta_loc.to(device=dev, dtype=torch.float32).reshape(-1).expand(B).contiguous()
    else:
        assert 0.0 < float(delta_loc) < 1.0, f"delta_loc {delta_loc} must be in (0, 1)"
    radius = torch.zeros(B, hq, nmax, **f32) if (return_radius and enabled) else part_m
    kargs, km2 = side_args(layer_kv.k, layer_kv.k_outlier_idx, hkv=hkv, d=d, device=dev)
    vargs, vm2 = side_args(layer_kv.v, layer_kv.v_outlier_idx, hkv=hkv, d=d, device=dev)
    if fma_dot is None:
        fma_dot = DEFAULT_FMA_DOT
    g = layer_kv.quant.group_size
    cpc = CHANNELS_PER_CALL.get(bits, 16)
    # measured on the H200 (benchmarks/tune_decode.py, BENCHMARKS.md 4c): FMA path, whole-row
    # q.k, 8-token tiles, ONE warp per program: fewer threads share the [heads, tokens, D]
    # products, so the cross-lane reductions shrink (QG 4: 450 vs 721 us with 16-token tiles
    # and 2 warps; QG 7: 808 vs 2290 us with the per-group q.k). The fp32 tl.dot path keeps
    # 16-token tiles, 4 warps and per-group q.k.
    if block_n is None:
        block_n = 8 if fma_dot else 16
    if num_warps is None:
        num_warps = 1 if fma_dot else 4
    if chunk_qk is None:
        chunk_qk = bits != 0 and g >= 16 and g % cpc == 0 and not fma_dot
    block_h = triton.next_power_of_2(qg) if fma_dot else max(16, triton.next_power_of_2(qg))
    handle = _decode_split_kernel[(B * hkv, s_grid)](
        q, *q.stride(), kargs[0], kargs[1], kargs[2], kargs[3], kargs[5],
        vargs[0], vargs[1], vargs[2], vargs[3], vargs[5],
        layer_kv.epochs, block_table, block_table.stride(0), seq_lens,
        delta_loc if delta_ptr else part_m, 0.5 if delta_ptr else float(delta_loc),
        part_m, part_l, part_a, part_vw, part_vmax, part_acc, radius, hq * nmax, nmax,
        float(sm_scale), layer_kv.layer, layer_kv.seed & 0xFFFFFFFF, layer_kv.seed >> 32,
        2.0 ** -(bits + 1) + 2.0 ** -15,
        HQ=hq, HKV=hkv, QG=qg, BLOCK_H=block_h, D=d, G=layer_kv.quant.group_size,
        LOG2G=layer_kv.quant.group_size.bit_length() - 1,
        KM2=km2, VM2=vm2, num_splits_grid=s_grid, fixed_splits=0 if num_splits is None else s_grid,
        P=page_size,
        BITS=bits, CPC=CHANNELS_PER_CALL.get(bits, 16), BLOCK_N=block_n,
        HAS_CERT=enabled, RADIUS_DET=want_det, RADIUS_PROB=want_prob,
        RETURN_RADIUS=bool(return_radius and enabled), DELTA_PTR=delta_ptr,
        CHUNK_QK=chunk_qk, FMA_DOT=bool(fma_dot), num_warps=num_warps)
    if _launch_info is not None:
        _launch_info.update(n_regs=getattr(handle, "n_regs", None), n_spills=getattr(handle, "n_spills", None))
    out = torch.empty(B, hq, d, **f32)
    lse = torch.empty(B, hq, **f32)
    c = torch.empty(B, hq, **f32) if enabled else lse
    vb = torch.empty(B, hq, **f32) if enabled else lse
    _decode_merge_kernel[(B * hq,)](
        part_m, part_l, part_a, part_vw, part_vmax, part_acc, out, lse, c, vb, q, *q.stride(), s_grid,
        HQ=hq, D=d, S_PAD=triton.next_power_of_2(s_grid), HAS_CERT=enabled,
        num_warps=4)
    rad = None
    if return_radius and enabled:
        qbad = ~torch.isfinite(q).all(-1)
        rad = torch.where(qbad[..., None], float("inf"), radius)
    return DecodeOut(out=out, lse=lse, cert=c if enabled else None, vbound=vb if enabled else None,
                     radius=rad, radius_kind=cert.radius if enabled else "none")
