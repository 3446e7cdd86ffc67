"""Triton extend (prefill) attention: T new tokens over the compressed prefix + themselves.

Spec: ``witcert.ref.attention.extend_attention``. The prefix is dequantized in-kernel
exactly as the decode kernel does (codes - xi) * scale, outliers, flagged rows -> 0);
the new tokens' exact K/V are attended causally. fp32 dots with ieee precision.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from witcert.kernels.decode import exp_acc
from witcert.kernels.dequant import dequant_tile_f32
from witcert.kernels.philox import CHANNELS_PER_CALL, seed_key


@triton.jit
def _extend_kernel(Q, stride_qt, stride_qh, stride_qd,
                   KN, stride_kt, stride_kh, stride_kd, VN, stride_vt, stride_vh, stride_vd,
                   KCodes, KScales, KOutl, KBypPos, VCodes, VScales, VOutl, VBypPos,
                   Epochs, PrefixSlots, Out, n_prefix, n_new, sm_scale, layer, seed_lo, seed_hi,
                   HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                   LOG2G: tl.constexpr, KM2: tl.constexpr, VM2: tl.constexpr, BITS: tl.constexpr, CPC: tl.constexpr,
                   CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   ROUNDS: tl.constexpr):
    """grid (cdiv(T, BLOCK_M), Hq). Out f32 [T, Hq, D] contiguous."""
    pid_m = tl.program_id(0)
    h = tl.program_id(1)
    kvh = (h // (HQ // HKV)).to(tl.int64)
    k0, k1 = seed_key(seed_lo, seed_hi)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < n_new
    offs_d = tl.arange(0, D)
    q = tl.load(Q + offs_m[:, None] * stride_qt + h * stride_qh + offs_d[None, :] * stride_qd,
                mask=mask_m[:, None], other=0.0).to(tl.float32)
    if KM2 > 0:
        kbyp = tl.load(KBypPos + kvh * D + offs_d)
    else:
        kbyp = offs_d * 0 - 1
    if VM2 > 0:
        vbyp = tl.load(VBypPos + kvh * D + offs_d)
    else:
        vbyp = offs_d * 0 - 1
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)

    for start in range(0, n_prefix, BLOCK_N):  # compressed prefix: every new token sees all of it
        offs_n = start + tl.arange(0, BLOCK_N)
        mask_n = offs_n < n_prefix
        slot = tl.load(PrefixSlots + offs_n, mask=mask_n, other=0)
        epoch = tl.load(Epochs + slot, mask=mask_n, other=0).to(tl.int64)
        k, _, _ = dequant_tile_f32(KCodes, KScales, KOutl, kbyp, slot, mask_n, epoch, kvh, 0, layer, k0, k1,
                                HKV, D, G, LOG2G, KM2, BITS, CPC, BLOCK_N, ROUNDS)
        v, _, _ = dequant_tile_f32(VCodes, VScales, VOutl, vbyp, slot, mask_n, epoch, kvh, 1, layer, k0, k1,
                                HKV, D, G, LOG2G, VM2, BITS, CPC, BLOCK_N, ROUNDS)
        z = tl.dot(q, tl.trans(k), input_precision="ieee") * sm_scale
        z = tl.where(mask_n[None, :], z, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(z, axis=1))
        p = exp_acc(z - m_new[:, None])
        alpha = exp_acc(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
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
        z = tl.dot(q, tl.trans(k), input_precision="ieee") * sm_scale
        live = mask_n[None, :]
        if CAUSAL:
            live = live & (offs_n[None, :] <= offs_m[:, None])
        z = tl.where(live, z, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(z, axis=1))
        p = exp_acc(z - m_new[:, None])
        alpha = exp_acc(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new

    out = acc / l_i[:, None]
    tl.store(Out + (offs_m[:, None] * HQ + h) * D + offs_d[None, :], out, mask=mask_m[:, None])


def extend_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, layer_kv,
                     prefix_slots: torch.Tensor, *, sm_scale: float, causal: bool = True,
                     block_m: int = 16, block_n: int = 16) -> torch.Tensor:
    """Prefill/extend for one sequence (Triton); contract of the reference ``extend_attention``.

    q: float [T, Hq, D]; k_new, v_new: float [T, Hkv, D] (exact); prefix_slots: int64 [Np].
    Returns f32 [T, Hq, D]. Rows of the prefix flagged at write time read as 0, as in the
    reference gather.
    """
    from witcert.kernels.write import check_pool, side_args

    check_pool(layer_kv)
    assert q.dim() == 3 and k_new.shape == v_new.shape and k_new.shape[0] == q.shape[0], \
        f"q [T, Hq, D] {tuple(q.shape)} and k_new/v_new [T, Hkv, D] {tuple(k_new.shape)} disagree"
    T, hq, d = q.shape
    hkv = layer_kv.num_kv_heads
    assert d == layer_kv.head_dim and k_new.shape[1:] == (hkv, d) and hq % hkv == 0, \
        "k_new must be [T, Hkv, D] matching the pool; Hq % Hkv must be 0"
    assert prefix_slots.dim() == 1, "prefix_slots must be int64 [Np]"
    dev = q.device
    prefix_slots = prefix_slots.to(device=dev, dtype=torch.int64).contiguous()
    bits = layer_kv.quant.dither_bits
    kargs, km2 = side_args(layer_kv.k, layer_kv.k_outlier_idx, hkv=hkv, d=d, device=dev)
    vargs, vm2 = side_args(layer_kv.v, layer_kv.v_outlier_idx, hkv=hkv, d=d, device=dev)
    out = torch.empty(T, hq, d, dtype=torch.float32, device=dev)
    if T == 0:
        return out
    _extend_kernel[(triton.cdiv(T, block_m), hq)](
        q, *q.stride(), k_new, *k_new.stride(), v_new, *v_new.stride(),
        kargs[0], kargs[1], kargs[3], kargs[5], vargs[0], vargs[1], vargs[3], vargs[5],
        layer_kv.epochs, prefix_slots, out, prefix_slots.shape[0], T, float(sm_scale), layer_kv.layer,
        layer_kv.seed & 0xFFFFFFFF, layer_kv.seed >> 32,
        HQ=hq, HKV=hkv, D=d, G=layer_kv.quant.group_size,
        LOG2G=layer_kv.quant.group_size.bit_length() - 1, KM2=km2, VM2=vm2, BITS=bits,
        CPC=CHANNELS_PER_CALL[bits], CAUSAL=bool(causal), BLOCK_M=block_m, BLOCK_N=block_n,
        ROUNDS=layer_kv.quant.philox_rounds)
    return out
