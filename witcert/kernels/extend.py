"""Triton extend (prefill) attention: T new tokens over the compressed prefix + themselves,
with a certificate per (new token, query head).

Spec: ``witcert.ref.extend.extend_attention_cert`` (and, without certificate,
``witcert.ref.attention.extend_attention``). The prefix is dequantized in-kernel exactly as the
reference does (``witcert.kernels.dequant.dequant_tile_f32``: the same Philox/dither helpers as
the decode kernel); the new tokens' exact K/V are attended causally. Logits are fp32 ``ieee``
dots (any summation order: ``|l - sm q.k| <= gamma_{D+2} sm sum_i |q_i k_i|``, docs/PROOFS.md
5.4), with ``sum |q_i k_i|`` bounded by ``127.5 sum_g ||q_g||_1 s_g`` plus the bypassed
channels on the prefix and computed by a second dot on the new tokens. Weights, sums,
``expm1_up`` and the tail follow PROOFS 5.5, as in the decode kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from witcert.kernels.decode import exp_acc, expm1_up
from witcert.kernels.dequant import dequant_tile_f32, round_up_f32
from witcert.kernels.philox import CHANNELS_PER_CALL, seed_key
from witcert.ref.arith import U32, gamma
from witcert.ref.cert import FP_BIAS_SLACK


@triton.jit
def _col(x, g, NG: tl.constexpr):
    """Column g of x [R, NG] as [R]."""
    return tl.sum(tl.where(tl.arange(0, NG)[None, :] == g, x, 0.0), axis=1)


@triton.jit
def _extend_kernel(Q, stride_qt, stride_qh, stride_qd,
                   KN, stride_kt, stride_kh, stride_kd, VN, stride_vt, stride_vh, stride_vd,
                   KCodes, KScales, KWit, KOutl, KBypPos, VCodes, VScales, VWit, VOutl, VBypPos,
                   Epochs, Positions, PrefixSlots, Out, Lse, Cert, Delta, n_prefix, n_new, sm_scale, layer,
                   seed_lo, seed_hi, delta, bias_coef, dot_gamma, arith_abs,
                   HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                   LOG2G: tl.constexpr, KM2: tl.constexpr, VM2: tl.constexpr, BITS: tl.constexpr,
                   CPC: tl.constexpr, ROUNDS: tl.constexpr, CAUSAL: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_CERT: tl.constexpr,
                   RADIUS_DET: tl.constexpr, RADIUS_PROB: tl.constexpr, HAS_POS: tl.constexpr,
                   DELTA_PER_TOKEN: tl.constexpr):
    """grid (cdiv(T, BLOCK_M), Hq). Out f32 [T, Hq, D], Lse f32 [T, Hq], Cert f32 [T, Hq].

    Delta f32 [T] (rounded down) when DELTA_PER_TOKEN, else the scalar ``delta``."""
    NG: tl.constexpr = D // G
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    kvh = (h // (HQ // HKV)).to(tl.int64)
    k0, k1 = seed_key(seed_lo, seed_hi)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < n_new
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * stride_qt + h * stride_qh + offs_d[None, :] * stride_qd,
                mask=mask_m[:, None], other=0.0).to(tl.float32)
    q_bad = tl.max(((q != q) | (tl.abs(q) == float("inf"))).to(tl.int32), axis=1) > 0
    q = tl.where((q == q) & (tl.abs(q) < float("inf")), q, 0.0)
    if KM2 > 0:
        kbyp = tl.load(KBypPos + kvh * D + offs_d)
    else:
        kbyp = offs_d * 0 - 1
    if VM2 > 0:
        vbyp = tl.load(VBypPos + kvh * D + offs_d)
    else:
        vbyp = offs_d * 0 - 1
    if HAS_CERT:
        qm = tl.reshape(tl.where(kbyp[None, :] >= 0, 0.0, q), (BLOCK_M, NG, G)).to(tl.float64)
        qn2 = round_up_f32(tl.sqrt(tl.sum(qm * qm, axis=2)))  # [BLOCK_M, NG], bypass excluded
        qn1 = round_up_f32(tl.sum(tl.abs(qm), axis=2))
        qb = tl.abs(tl.where(kbyp[None, :] >= 0, q, 0.0))
        qa = tl.abs(q)
        if RADIUS_PROB:
            npf = tl.maximum(tl.zeros([], tl.float64) + n_prefix, 1.0)
            if DELTA_PER_TOKEN:
                dl = tl.load(Delta + offs_m, mask=mask_m, other=0.5).to(tl.float64)
            else:
                dl = tl.zeros([BLOCK_M], tl.float64) + delta
            lf = round_up_f32(tl.sqrt(2.0 * tl.log(2.0 * npf / dl)) * 1.0000000000001)[:, None]
        tiles = tl.cdiv(n_prefix, BLOCK_N) + tl.cdiv(n_new, BLOCK_N)
        e_soft = 1.0616e-05 + (tiles + 2).to(tl.float32) * 4.76837158203125e-07
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    a_i = tl.zeros([BLOCK_M], tl.float32)
    u_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)

    for start in range(0, n_prefix, BLOCK_N):  # compressed prefix: every new token sees all of it
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < n_prefix
        slot = tl.load(PrefixSlots + offs_n, mask=mask_n, other=0)
        epoch = tl.load(Epochs + slot, mask=mask_n, other=0).to(tl.int64)
        if HAS_POS:
            word0 = tl.load(Positions + slot, mask=mask_n, other=0).to(tl.int64)
        else:
            word0 = slot
        k, ks, kbad = dequant_tile_f32(KCodes, KScales, KOutl, kbyp, slot, word0, mask_n, epoch, kvh, 0, layer, k0, k1,
                                       HKV, D, G, LOG2G, KM2, BITS, CPC, BLOCK_N, ROUNDS)
        v, vs, vbad = dequant_tile_f32(VCodes, VScales, VOutl, vbyp, slot, word0, mask_n, epoch, kvh, 1, layer, k0, k1,
                                       HKV, D, G, LOG2G, VM2, BITS, CPC, BLOCK_N, ROUNDS)
        z = tl.dot(q, tl.trans(k), input_precision="ieee") * sm_scale
        ovf = (tl.abs(z) == float("inf")) | (z != z)  # finite inputs, overflowing logit: flagged
        z = tl.where(z != z, 0.0, tl.minimum(tl.maximum(z, -3.4028234e38), 3.4028234e38))
        z = tl.where(mask_n[None, :], z, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(z, axis=1))
        p = exp_acc(z - m_new[:, None])
        alpha = exp_acc(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        if HAS_CERT:
            row = slot * HKV + kvh
            kw = tl.load(KWit + row[:, None] * NG + tl.arange(0, NG)[None, :], mask=mask_n[:, None], other=0.0)
            kw = kw.to(tl.float32)
            vw = tl.load(VWit + row[:, None] * NG + tl.arange(0, NG)[None, :], mask=mask_n[:, None], other=0.0)
            vbad = vbad | (tl.max(vw.to(tl.float32), axis=1) == float("inf"))
            kbad = kbad | (tl.max(kw, axis=1) == float("inf"))
            ksf = tl.where(ks == float("inf"), 0.0, ks)
            kwf = tl.where(kw == float("inf"), 0.0, kw)
            ud = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            s2 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            s1 = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            for g in tl.static_range(NG):
                n2 = _col(qn2, g, NG)[:, None]
                sg = _col(ksf, g, NG)[None, :]
                ud += n2 * _col(kwf, g, NG)[None, :]
                s2 += (n2 * sg) * (n2 * sg)
                s1 += _col(qn1, g, NG)[:, None] * sg
            u = tl.full([BLOCK_M, BLOCK_N], float("inf"), tl.float32)
            if RADIUS_DET:
                u = ud * sm_scale
            if RADIUS_PROB:
                u = tl.minimum(u, sm_scale * tl.sqrt(s2 / 12.0) * lf + bias_coef * sm_scale * s1)
            sabs = 127.5 * s1
            if KM2 > 0:
                xo = tl.where(kbyp[None, :] >= 0, tl.abs(k), 0.0)
                sabs += tl.dot(qb, tl.trans(xo), input_precision="ieee")
            u = u * 1.0000152587890625 + dot_gamma * sm_scale * sabs * 1.0000152587890625 + (arith_abs + e_soft)
            bad = (kbad | vbad)[None, :] | q_bad[:, None] | (u != u) | ovf
            u = tl.where(bad, float("inf"), u)
            live = mask_n[None, :] & mask_m[:, None]
            term = tl.where(live & (p > 0.0), p * expm1_up(u), 0.0)
            a_i = tl.where(a_i == float("inf"), a_i, a_i * alpha) + tl.sum(term, axis=1)
            u_i = tl.maximum(u_i, tl.max(tl.where(live, u, 0.0), axis=1))
        m_i = m_new

    hi = n_new
    if CAUSAL:
        hi = tl.minimum(n_new, (pid_m + 1) * BLOCK_M)
    for start in range(0, hi, BLOCK_N):  # exact new tokens
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < n_new
        k = tl.load(KN + offs_n[:, None] * stride_kt + kvh * stride_kh + offs_d[None, :] * stride_kd,
                    mask=mask_n[:, None], other=0.0).to(tl.float32)
        v = tl.load(VN + offs_n[:, None] * stride_vt + kvh * stride_vh + offs_d[None, :] * stride_vd,
                    mask=mask_n[:, None], other=0.0).to(tl.float32)
        nbad = (tl.max(((k != k) | (tl.abs(k) == float("inf"))).to(tl.int32), axis=1) > 0) \
            | (tl.max(((v != v) | (tl.abs(v) == float("inf"))).to(tl.int32), axis=1) > 0)
        k = tl.where(nbad[:, None], 0.0, k)  # a non-finite new row reads 0 and is flagged
        v = tl.where(nbad[:, None], 0.0, v)
        z = tl.dot(q, tl.trans(k), input_precision="ieee") * sm_scale
        ovf = (tl.abs(z) == float("inf")) | (z != z)
        z = tl.where(z != z, 0.0, tl.minimum(tl.maximum(z, -3.4028234e38), 3.4028234e38))
        live = mask_n[None, :]
        if CAUSAL:
            live = live & (offs_n[None, :] <= offs_m[:, None])
        z = tl.where(live, z, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(z, axis=1))
        p = exp_acc(z - m_new[:, None])
        alpha = exp_acc(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        if HAS_CERT:
            sabs = tl.dot(qa, tl.trans(tl.abs(k)), input_precision="ieee")
            u = dot_gamma * sm_scale * sabs * 1.0000152587890625 + (arith_abs + e_soft)
            bad = nbad[None, :] | q_bad[:, None] | (u != u) | ovf
            u = tl.where(bad, float("inf"), u)
            live = live & mask_m[:, None]
            term = tl.where(live & (p > 0.0), p * expm1_up(u), 0.0)
            a_i = tl.where(a_i == float("inf"), a_i, a_i * alpha) + tl.sum(term, axis=1)
            u_i = tl.maximum(u_i, tl.max(tl.where(live, u, 0.0), axis=1))
        m_i = m_new

    out = acc / l_i[:, None]
    tl.store(Out + (offs_m[:, None] * HQ + h) * D + offs_d[None, :], out, mask=mask_m[:, None])
    tl.store(Lse + offs_m * HQ + h, m_i + tl.log(l_i), mask=mask_m)
    if HAS_CERT:
        tiles = tl.cdiv(n_prefix, BLOCK_N) + tl.cdiv(n_new, BLOCK_N)
        depth = (BLOCK_N + 2 * tiles + 5).to(tl.float32)
        kappa = 2.0 * depth * 5.9604644775390625e-08 / (1.0 - depth * 5.9604644775390625e-08)
        n_tok = (n_prefix + offs_m + 1).to(tl.float32)
        tail = tl.where(u_i == float("inf"), float("inf"), n_tok * tl.exp(tl.minimum(2.0 * u_i - 87.0, 88.0)))
        cert = ((a_i / l_i) * (1.0 + kappa) + tail) * 1.00000023841858
        cert = tl.where(q_bad | (cert != cert), float("inf"), cert)
        tl.store(Cert + offs_m * HQ + h, cert, mask=mask_m)


def extend_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, layer_kv,
                     prefix_slots: torch.Tensor, *, sm_scale: float, causal: bool = True,
                     cert=None, delta_loc=1e-6, block_m: int = 16, block_n: int = 16):
    """Prefill/extend for one sequence (Triton).

    q: float [T, Hq, D]; k_new, v_new: float [T, Hkv, D] (exact); prefix_slots: int64 [Np].
    Without ``cert`` returns out f32 [T, Hq, D] (the contract of the reference
    ``extend_attention``); with a ``CertConfig`` returns ``witcert.ref.extend.ExtendOut``
    (out, lse, cert f32 [T, Hq]): the contract of ``extend_attention_cert``. delta_loc: the
    budget of each (head, new token) for the prob / min radius (a float or a tensor [T]).
    """
    from witcert.kernels.launch import _delta_arg
    from witcert.kernels.write import check_pool, side_args
    from witcert.ref.extend import ExtendOut
    from witcert.ref.validate import check_delta_loc, check_sm_scale

    check_pool(layer_kv)
    sm_scale = check_sm_scale(sm_scale)
    assert q.dim() == 3 and k_new.shape == v_new.shape and k_new.shape[0] == q.shape[0], \
        f"q [T, Hq, D] {tuple(q.shape)} and k_new/v_new [T, Hkv, D] {tuple(k_new.shape)} disagree"
    T, hq, d = q.shape
    hkv = layer_kv.num_kv_heads
    assert d == layer_kv.head_dim and k_new.shape[1:] == (hkv, d) and hq % hkv == 0, \
        "k_new must be [T, Hkv, D] matching the pool; Hq % Hkv must be 0"
    assert prefix_slots.dim() == 1, "prefix_slots must be int64 [Np]"
    enabled = cert is not None and bool(cert.enabled)
    if enabled and cert.radius != "det":
        check_delta_loc(delta_loc, batch=q.shape[0])
    dev = q.device
    delta_t, delta_s = _delta_arg(delta_loc if enabled and cert.radius != "det" else 0.5, q.shape[0], dev)
    prefix_slots = prefix_slots.to(device=dev, dtype=torch.int64).contiguous()
    bits = layer_kv.quant.dither_bits
    kargs, km2 = side_args(layer_kv.k, layer_kv.k_outlier_idx, hkv=hkv, d=d, device=dev)
    vargs, vm2 = side_args(layer_kv.v, layer_kv.v_outlier_idx, hkv=hkv, d=d, device=dev)
    out = torch.empty(T, hq, d, dtype=torch.float32, device=dev)
    lse = torch.empty(T, hq, dtype=torch.float32, device=dev)
    c = torch.empty(T, hq, dtype=torch.float32, device=dev) if enabled else lse
    if T:
        _extend_kernel[(triton.cdiv(T, block_m), hq)](
            Q=q, stride_qt=q.stride(0), stride_qh=q.stride(1), stride_qd=q.stride(2),
            KN=k_new, stride_kt=k_new.stride(0), stride_kh=k_new.stride(1), stride_kd=k_new.stride(2),
            VN=v_new, stride_vt=v_new.stride(0), stride_vh=v_new.stride(1), stride_vd=v_new.stride(2),
            KCodes=kargs[0], KScales=kargs[1], KWit=kargs[2], KOutl=kargs[3], KBypPos=kargs[5],
            VCodes=vargs[0], VScales=vargs[1], VWit=vargs[2], VOutl=vargs[3], VBypPos=vargs[5],
            Epochs=layer_kv.epochs,
            Positions=layer_kv.positions if layer_kv.positions is not None else layer_kv.epochs,
            PrefixSlots=prefix_slots, Out=out, Lse=lse, Cert=c,
            Delta=delta_t if delta_t is not None else lse, n_prefix=prefix_slots.shape[0], n_new=T, sm_scale=sm_scale, layer=layer_kv.layer,
            seed_lo=layer_kv.seed & 0xFFFFFFFF, seed_hi=layer_kv.seed >> 32,
            delta=delta_s,
            bias_coef=2.0 ** -(bits + 1) + FP_BIAS_SLACK, dot_gamma=gamma(d + 2, U32), arith_abs=2.0**-100,
            HQ=hq, HKV=hkv, D=d, G=layer_kv.quant.group_size, LOG2G=layer_kv.quant.group_size.bit_length() - 1,
            KM2=km2, VM2=vm2, BITS=bits, CPC=CHANNELS_PER_CALL[bits], ROUNDS=layer_kv.quant.philox_rounds,
            CAUSAL=bool(causal), BLOCK_M=block_m, BLOCK_N=block_n, HAS_CERT=enabled,
            RADIUS_DET=enabled and cert.radius in ("det", "min"),
            RADIUS_PROB=enabled and cert.radius in ("prob", "min"), HAS_POS=layer_kv.positions is not None,
            DELTA_PER_TOKEN=delta_t is not None)
    if cert is None:
        return out
    return ExtendOut(out=out, lse=lse, cert=c if enabled else None,
                     radius_kind=cert.radius if enabled else "none")
