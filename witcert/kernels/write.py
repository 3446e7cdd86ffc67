"""GPU write path: quantize + dither + witness + store K and V in one launch.

Two kernels, both bitwise twins of the reference writer (``witcert.ref.quant`` dither8
encode and ``witcert.ref.witness``; docs/DESIGN.md "Dithered INT8, token granularity"):
codes, scales, witnesses and outliers are ``torch.equal`` to the reference. The Triton
kernel below serves every pool; the CUDA C++ one (``witcert/kernels/cuda/write.cu``) serves
head dim 128, 8- or 16-bit dither, groups of 32 / 64 / 128 and no bypassed channels, and is
the default there (``write_kv_(impl=)``).
"""

from __future__ import annotations

import ctypes

import torch
import triton
import triton.language as tl

from witcert.kernels.philox import CHANNELS_PER_CALL, dither_r_join, dither_words, dither_xi, seed_key
from witcert.kernels.plan import cdiv, next_pow2
from witcert.ref.validate import check_attention_dtypes



@triton.jit
def fp16_round_up(x):
    """Smallest fp16 >= x for fp32/fp64 x; NaN -> +inf (mirror of ref.fp.fp16_round_up)."""
    h = x.to(tl.float16)
    low = h.to(x.dtype) < x
    bits = h.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    up = tl.where(bits < 0x8000, bits + 1, bits - 1)
    up = up.to(tl.int16).to(tl.float16, bitcast=True)
    out = tl.where(low, up, h)
    return tl.where(x != x, float("inf"), out)


@triton.jit
def _quant_side(X, stride_xt, stride_xh, stride_xd,
                Codes, Scales, Wit, Outl, OutlIdx, BypPos,
                offs_r, mask_r, tok, head, slot, epoch, word0, side, layer, k0, k1,
                HKV: tl.constexpr, D: tl.constexpr, G: tl.constexpr, M2: tl.constexpr,
                M2_PAD: tl.constexpr, BITS: tl.constexpr, CPC: tl.constexpr,
                ROUNDS: tl.constexpr, BLOCK_R: tl.constexpr):
    """One side of BLOCK_R (token, KV head) rows: ``offs_r`` / ``mask_r`` the rows, ``tok``,
    ``head``, ``slot``, ``epoch`` and ``word0`` (the dither counter's first word) per row, read
    once by ``_write_kernel`` for both sides."""
    NG: tl.constexpr = D // G
    NCH: tl.constexpr = D // CPC

    # channel c = g * G + j, tiles are [BLOCK_R, NG, G]
    offs_g = tl.arange(0, NG)[None, :, None]
    offs_j = tl.arange(0, G)[None, None, :]
    offs_c = offs_g * G + offs_j
    m3 = mask_r[:, None, None]
    t3 = tok[:, None, None].to(tl.int64)
    h3 = head[:, None, None].to(tl.int64)
    x = tl.load(X + t3 * stride_xt + h3 * stride_xh + offs_c * stride_xd, mask=m3, other=0.0)
    x = x.to(tl.float32)
    finite = (x == x) & (tl.abs(x) < float("inf"))
    bad = tl.min(tl.min(finite.to(tl.int32), axis=2), axis=1) == 0  # [BLOCK_R]
    if M2 > 0:
        byp = tl.load(BypPos + h3 * D + offs_c, mask=m3, other=-1) >= 0
        # outl stores bypassed values in fp16: a value fp16 cannot hold flags the row
        inexact = byp & (x.to(tl.float16).to(tl.float32) != x)
        bad = bad | (tl.max(tl.max(inexact.to(tl.int32), axis=2), axis=1) > 0)
    else:
        byp = offs_c < 0

    amax = tl.max(tl.where(byp, 0.0, tl.abs(x)), axis=2)  # [BLOCK_R, NG]
    s = fp16_round_up(tl.math.div_rn(amax, 126.5)).to(tl.float32)
    s = tl.maximum(s, 1.0 / 16384.0)
    bad = bad | (tl.max(s, axis=1) == float("inf"))
    b3 = bad[:, None, None]

    w0, w1, w2, w3 = dither_words(word0[:, None], epoch[:, None], tl.arange(0, NCH)[None, :],
                                  (layer << 16) | head[:, None], side, k0, k1, ROUNDS)
    xi = dither_xi(tl.reshape(dither_r_join(w0, w1, w2, w3, BLOCK_R, D, BITS), (BLOCK_R, NG, G)), BITS)
    s3 = s[:, :, None]
    y = tl.math.div_rn(x, s3) + xi
    n = (y + 12582912.0) - 12582912.0  # 1.5 * 2^23: round half to even for |y| < 2^22
    n = tl.where(byp | b3, 0.0, n)
    xhat = (n - xi) * s3
    err = xhat.to(tl.float64) - x.to(tl.float64)
    err = tl.where(byp | b3, 0.0, err)
    ss = tl.sum(err * err, axis=2)
    nrm = tl.sqrt(ss)
    wit = fp16_round_up(nrm + nrm * 9.094947017729282e-13)  # * (1 + 2^-40), 2^-40 exact
    wit = tl.where(bad[:, None], float("inf"), wit)

    row_base = slot * HKV + head.to(tl.int64)  # [BLOCK_R]
    tl.store(Codes + row_base[:, None, None] * D + offs_c, n.to(tl.int8), mask=m3)
    offs_g2 = tl.arange(0, NG)[None, :]
    m2 = mask_r[:, None]
    sc = tl.where(bad[:, None], float("inf"), s).to(tl.float16)
    tl.store(Scales + row_base[:, None] * NG + offs_g2, sc, mask=m2)
    tl.store(Wit + row_base[:, None] * NG + offs_g2, wit, mask=m2)
    if M2 > 0:
        offs_o = tl.arange(0, M2_PAD)[None, :]
        mask_o = m2 & (offs_o < M2)
        oc = tl.load(OutlIdx + head[:, None].to(tl.int64) * M2 + offs_o, mask=mask_o, other=0)
        xo = tl.load(X + tok[:, None].to(tl.int64) * stride_xt + head[:, None].to(tl.int64) * stride_xh
                     + oc * stride_xd, mask=mask_o, other=0.0)
        xo = tl.where(bad[:, None], 0.0, xo.to(tl.float32)).to(tl.float16)
        tl.store(Outl + row_base[:, None] * M2 + offs_o, xo, mask=mask_o)


@triton.jit
def _write_kernel(K, stride_kt, stride_kh, stride_kd, V, stride_vt, stride_vh, stride_vd,
                  KCodes, KScales, KWit, KOutl, KOutlIdx, KBypPos,
                  VCodes, VScales, VWit, VOutl, VOutlIdx, VBypPos,
                  Slots, Epochs, Positions, num_rows, layer, seed_lo, seed_hi,
                  HKV: tl.constexpr, D: tl.constexpr, G: tl.constexpr,
                  KM2: tl.constexpr, KM2_PAD: tl.constexpr, VM2: tl.constexpr, VM2_PAD: tl.constexpr,
                  BITS: tl.constexpr, CPC: tl.constexpr, ROUNDS: tl.constexpr, HAS_POS: tl.constexpr,
                  BLOCK_R: tl.constexpr):
    """grid (cdiv(T * Hkv, BLOCK_R),): each program reads its rows' slots, epochs and positions
    once, then quantizes their K and their V (one program for both sides: measured 4-6% faster
    on the H200 than one side per program, BENCHMARKS.md 4g)."""
    offs_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    mask_r = offs_r < num_rows
    tok = offs_r // HKV
    head = offs_r % HKV
    slot = tl.load(Slots + tok, mask=mask_r, other=0).to(tl.int64)
    epoch = tl.load(Epochs + slot, mask=mask_r, other=0).to(tl.int64)
    if HAS_POS:  # position-keyed dither: the counter's first word is the token's position
        word0 = tl.load(Positions + slot, mask=mask_r, other=0).to(tl.int64)
    else:
        word0 = slot
    k0, k1 = seed_key(seed_lo, seed_hi)
    _quant_side(K, stride_kt, stride_kh, stride_kd, KCodes, KScales, KWit, KOutl, KOutlIdx,
                KBypPos, offs_r, mask_r, tok, head, slot, epoch, word0, 0, layer, k0, k1,
                HKV, D, G, KM2, KM2_PAD, BITS, CPC, ROUNDS, BLOCK_R)
    _quant_side(V, stride_vt, stride_vh, stride_vd, VCodes, VScales, VWit, VOutl, VOutlIdx,
                VBypPos, offs_r, mask_r, tok, head, slot, epoch, word0, 1, layer, k0, k1,
                HKV, D, G, VM2, VM2_PAD, BITS, CPC, ROUNDS, BLOCK_R)


def bypass_positions(outlier_idx: torch.Tensor | None, *, num_kv_heads: int, head_dim: int,
                     device) -> torch.Tensor | None:
    """int32 [Hkv, D]: position j of channel c in ``outlier_idx[h]``, or -1 (not bypassed).

    Built with device-side torch ops only (no host sync), so it is CUDA-graph safe.
    """
    if outlier_idx is None or outlier_idx.numel() == 0:
        return None
    m2 = outlier_idx.shape[-1]
    pos = torch.full((num_kv_heads, head_dim), -1, dtype=torch.int32, device=device)
    src = torch.arange(m2, dtype=torch.int32, device=device).expand(num_kv_heads, m2).contiguous()
    return pos.scatter_(1, outlier_idx.to(device=device, dtype=torch.int64), src)


def check_pool(layer_kv) -> None:
    """The kernels serve the dither8 token-granular pool (``witcert.ref.pool.LayerKV``)."""
    q = layer_kv.quant
    assert q.method == "dither8", f"Triton kernels serve quant.method 'dither8', got {q.method!r}"
    d = layer_kv.head_dim
    assert d % q.group_size == 0 and d % CHANNELS_PER_CALL[q.dither_bits] == 0, \
        f"head_dim {d} must be a multiple of group_size {q.group_size} and of the Philox chunk"
    assert d & (d - 1) == 0, f"head_dim {d} must be a power of two"
    for side in (layer_kv.k, layer_kv.v):
        for name, t in side.items():
            assert t.is_contiguous(), f"pool tensor {name} must be contiguous"


def side_args(store: dict, outlier_idx, *, hkv: int, d: int, device):
    """(codes, scales, wit, outl, outlier_idx, bypass_pos) pointers of one side, and 2m."""
    m2 = 0 if outlier_idx is None else int(outlier_idx.shape[-1])
    dummy = store["codes"]
    if m2 == 0:
        return (store["codes"], store["scales"], store["wit"], dummy, dummy, dummy), 0
    pos = bypass_positions(outlier_idx, num_kv_heads=hkv, head_dim=d, device=device)
    idx = outlier_idx.to(device=device, dtype=torch.int64).contiguous()
    return (store["codes"], store["scales"], store["wit"], store["outl"], idx, pos), m2


def write_kv_(layer_kv, k: torch.Tensor, v: torch.Tensor, *, slots: torch.Tensor,
              block_rows: int = 8, num_warps: int = 2, impl: str = "auto") -> None:
    """Quantize, dither, witness and store T new tokens of K and V in one launch.

    layer_kv: ``witcert.ref.pool.LayerKV`` (dither8), tensors on k's device.
    k, v: fp16/bf16/fp32 [T, Hkv, D], any strides. slots: int64 [T], distinct.
    The dither is keyed by ``layer_kv.epochs[slot]`` (read in-kernel, no host sync).
    Writes codes int8 [slot, h, D], scales / wit fp16 [slot, h, D/G], outl fp16
    [slot, h, 2m], bitwise equal to ``witcert.ref.pool.write_``.
    impl: ``auto`` (the CUDA kernel where it serves the call, ``cuda_write_reason``, else
    the Triton kernel), ``cuda`` (ValueError naming the reason where it does not serve it)
    or ``triton``. block_rows, num_warps: the Triton kernel's tiles.
    """
    if impl not in ("auto", "cuda", "triton"):
        raise ValueError(f"impl: {impl!r} must be 'auto', 'cuda' or 'triton'")
    check_pool(layer_kv)
    assert k.dim() == 3 and k.shape == v.shape, f"k {tuple(k.shape)} and v {tuple(v.shape)} must be [T, Hkv, D]"
    check_attention_dtypes(k=k, v=v)
    T, hkv, d = k.shape
    assert hkv == layer_kv.num_kv_heads and d == layer_kv.head_dim, \
        f"k is [T, {hkv}, {d}], pool holds Hkv={layer_kv.num_kv_heads} D={layer_kv.head_dim}"
    assert slots.shape == (T,), f"slots must be [T={T}], got {tuple(slots.shape)}"
    assert k.device == layer_kv.epochs.device, "k and the pool must be on the same device"
    if T == 0:
        return
    dev = k.device
    bits = layer_kv.quant.dither_bits
    slots = slots.to(device=dev, dtype=torch.int64).contiguous()
    if impl != "triton":
        why = cuda_write_reason(layer_kv, k, v)
        if why is None:
            _cuda_write(layer_kv, k, v, slots=slots)
            return
        if impl == "cuda":
            raise ValueError(f"impl='cuda': the CUDA write kernel does not serve this call ({why})")
    kargs, km2 = side_args(layer_kv.k, layer_kv.k_outlier_idx, hkv=hkv, d=d, device=dev)
    vargs, vm2 = side_args(layer_kv.v, layer_kv.v_outlier_idx, hkv=hkv, d=d, device=dev)
    rows = T * hkv
    grid = (cdiv(rows, block_rows),)
    _write_kernel[grid](
        K=k, stride_kt=k.stride(0), stride_kh=k.stride(1), stride_kd=k.stride(2),
        V=v, stride_vt=v.stride(0), stride_vh=v.stride(1), stride_vd=v.stride(2),
        KCodes=kargs[0], KScales=kargs[1], KWit=kargs[2], KOutl=kargs[3], KOutlIdx=kargs[4], KBypPos=kargs[5],
        VCodes=vargs[0], VScales=vargs[1], VWit=vargs[2], VOutl=vargs[3], VOutlIdx=vargs[4], VBypPos=vargs[5],
        Slots=slots, Epochs=layer_kv.epochs,
        Positions=layer_kv.positions if layer_kv.positions is not None else layer_kv.epochs,
        num_rows=rows, layer=layer_kv.layer,
        seed_lo=layer_kv.seed & 0xFFFFFFFF, seed_hi=layer_kv.seed >> 32,
        HKV=hkv, D=d, G=layer_kv.quant.group_size,
        KM2=km2, KM2_PAD=next_pow2(max(km2, 1)),
        VM2=vm2, VM2_PAD=next_pow2(max(vm2, 1)),
        BITS=bits, CPC=CHANNELS_PER_CALL[bits], ROUNDS=layer_kv.quant.philox_rounds,
        HAS_POS=layer_kv.positions is not None, BLOCK_R=block_rows, num_warps=num_warps)


_X_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def cuda_write_reason(layer_kv, k: torch.Tensor, v: torch.Tensor) -> str | None:
    """Why ``write.cu`` does not serve this call (None: it does): a CUDA device with nvcc, head
    dim 128, 8- or 16-bit dither, groups of 32 / 64 / 128, 7 or 10 Philox rounds, no bypassed
    channels, k and v of one float dtype with channel stride 1 and 16-byte aligned rows (its
    vector loads), int64 epochs (and positions), pool storage aligned for its stores, and a
    build that succeeds (asked once per configuration)."""
    from witcert.kernels import cuda as wc_cuda
    from witcert.kernels.launch import _aligned, _arch, _builds

    if not k.is_cuda:
        return "k is not on a CUDA device"
    why = wc_cuda.reason()
    if why:
        return why
    q = layer_kv.quant
    m = max(0 if i is None else i.numel() for i in (layer_kv.k_outlier_idx, layer_kv.v_outlier_idx))
    cfg = wc_cuda.config_for(qg=1, d=layer_kv.head_dim, bits=q.dither_bits, group=q.group_size,
                             outliers=m, rounds=q.philox_rounds)
    if cfg is None:
        return (f"D={layer_kv.head_dim} bits={q.dither_bits} group={q.group_size} bypassed channels={m > 0} "
                f"rounds={q.philox_rounds}")
    if k.dtype != v.dtype or k.dtype not in _X_DTYPES:
        return f"k {k.dtype} and v {v.dtype} must be one of fp32 / fp16 / bf16"
    esz = k.element_size()
    for x in (k, v):
        if x.stride(2) != 1 or x.data_ptr() % 16 or (x.stride(0) * esz) % 16 or (x.stride(1) * esz) % 16:
            return "k / v rows not contiguous and 16-byte aligned"
    if k.shape[0] * k.shape[1] >= 2**31 - 256:
        return "more than 2^31 (token, KV head) rows"
    if layer_kv.epochs.dtype != torch.int64 or (layer_kv.positions is not None
                                                and layer_kv.positions.dtype != torch.int64):
        return "epochs / positions not int64"
    if not _aligned(layer_kv, ng=layer_kv.head_dim // q.group_size):
        return "pool storage not aligned"
    if not _builds(**cfg, arch=_arch(k.device), kind="write"):
        return "the CUDA write kernel did not build"
    return None


def _cuda_write(layer_kv, k: torch.Tensor, v: torch.Tensor, *, slots: torch.Tensor) -> None:
    """``write.cu`` on k's current stream (``cuda_write_reason`` said it serves the call)."""
    from witcert.kernels import cuda as wc_cuda
    from witcert.kernels.launch import _arch

    q = layer_kv.quant
    lib = wc_cuda.library(qgp=1, group=q.group_size, bits=q.dither_bits, rounds=q.philox_rounds,
                          arch=_arch(k.device), kind="write")
    T, hkv, _ = k.shape
    ks, vs = layer_kv.k, layer_kv.v
    pos = layer_kv.positions
    args = wc_cuda.WriteArgs(
        k=k.data_ptr(), v=v.data_ptr(), kc=ks["codes"].data_ptr(), vc=vs["codes"].data_ptr(),
        ks=ks["scales"].data_ptr(), vs=vs["scales"].data_ptr(), kw=ks["wit"].data_ptr(),
        vw=vs["wit"].data_ptr(), slots=slots.data_ptr(), epochs=layer_kv.epochs.data_ptr(),
        positions=pos.data_ptr() if pos is not None else None,
        sk_t=k.stride(0), sk_h=k.stride(1), sv_t=v.stride(0), sv_h=v.stride(1), num_rows=T * hkv,
        key0=layer_kv.seed & 0xFFFFFFFF, key1=(layer_kv.seed >> 32) & 0xFFFFFFFF,
        x_dtype=_X_DTYPES[k.dtype], Hkv=hkv, layer=layer_kv.layer)
    rows = T * hkv
    per_cta = lib.wc_write_rows_per_cta()
    stream = torch.cuda.current_stream(k.device).cuda_stream
    rc = lib.wc_write_launch(ctypes.byref(args), (rows + per_cta - 1) // per_cta, stream)
    if rc != 0:
        raise RuntimeError(f"witcert: CUDA write launch failed (cudaError {rc})")
