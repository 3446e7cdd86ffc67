"""The decode launcher: checks, partial buffers and the two launches (split, merge), by keyword.

Kept apart from the kernels so ``decode.py`` reads as helpers, one kernel pair and nothing
else. Every value the kernels derive from the host (the rounding constants of the
certificate, the dither bias coefficient, delta rounded down) is computed here once.
"""

from __future__ import annotations

import ctypes
import functools
import logging

import numpy as np
import torch

from witcert.kernels import cuda as wc_cuda
from witcert.kernels.dequant import combine_roundings, digits_for
from witcert.kernels.philox import CHANNELS_PER_CALL
from witcert.kernels.plan import DecodePlan, decode_plan, next_pow2, plan_splits, tile_tokens
from witcert.kernels.write import check_pool, side_args
from witcert.ref.arith import U32, gamma
from witcert.ref.attention import DecodeOut
from witcert.ref.cert import FP_BIAS_SLACK
from witcert.ref.philox import seed_to_key
from witcert.ref.validate import check_attention_dtypes, check_delta_loc, check_sm_scale

# absolute floor of the logit arithmetic (underflow or flush to zero of the tiny products)
ARITH_ABS = 2.0**-100


def _f32_down(x: float) -> float:
    """Largest fp32 <= x (delta rounded down keeps ln(2N / delta) from shrinking)."""
    f = np.float32(x)
    return float(np.nextafter(f, np.float32(-np.inf)) if float(f) > x else f)


def _f32_up(x: float) -> float:
    """Least fp32 >= x (a host constant the kernel takes as an fp32 bound: ctypes' c_float keeps it)."""
    f = np.float32(x)
    return float(np.nextafter(f, np.float32(np.inf)) if float(f) < x else f)


def _delta_arg(delta_loc, B: int, dev) -> tuple[torch.Tensor | None, float]:
    if isinstance(delta_loc, torch.Tensor):
        d64 = delta_loc.to(device=dev, dtype=torch.float64).reshape(-1).expand(B)
        d32 = d64.to(torch.float32)
        d32 = torch.where(d32.to(torch.float64) > d64, torch.nextafter(d32, torch.zeros_like(d32)), d32)
        return d32.contiguous(), 0.5
    return None, _f32_down(float(delta_loc))


def decode_launch(q, layer_kv, block_table, seq_lens, *, page_size: int, sm_scale: float, cert,
                  delta_loc, num_splits: int | None, return_radius: bool, plan: DecodePlan | None,
                  debug: dict | None, split_kernel, merge_kernel):
    """See ``witcert.kernels.decode.decode_attention`` (this is its body)."""
    check_pool(layer_kv)
    sm_scale = check_sm_scale(sm_scale)
    assert q.dim() == 3 and q.is_floating_point(), f"q must be float [B, Hq, D], got {q.dtype} {tuple(q.shape)}"
    check_attention_dtypes(q=q)
    B, hq, d = q.shape
    hkv = layer_kv.num_kv_heads
    assert d == layer_kv.head_dim and hq % hkv == 0, f"q {tuple(q.shape)} does not fit Hkv={hkv} D={layer_kv.head_dim}"
    assert block_table.dtype == torch.int32 and block_table.dim() == 2 and block_table.shape[0] == B, \
        f"block_table must be int32 [B={B}, pages], got {block_table.dtype} {tuple(block_table.shape)}"
    assert seq_lens.dtype == torch.int32 and seq_lens.shape == (B,), "seq_lens must be int32 [B]"
    assert page_size >= 1 and layer_kv.num_slots % page_size == 0, "page_size must divide num_slots"
    assert num_splits is None or num_splits >= 1, "num_splits must be None or >= 1"
    quant = layer_kv.quant
    bits, G = quant.dither_bits, quant.group_size
    assert G >= 16 or d // G <= 16, f"group_size {G}: at most 16 groups per head"
    enabled = bool(cert.enabled)
    if enabled and cert.radius != "det":
        check_delta_loc(delta_loc, batch=B)
    plan = plan or decode_plan(q.device.type if q.device.type == "cpu" else str(q.device))
    dev = q.device
    qg, ng = hq // hkv, d // G
    rows = max(16, next_pow2(qg * ng))
    block_h = rows // ng
    block_n = tile_tokens(plan, rows=rows)
    nmax = block_table.shape[1] * page_size
    s_grid = plan_splits(nmax, plan) if num_splits is None else int(num_splits)
    f32 = dict(dtype=torch.float32, device=dev)
    part_m = torch.empty(B, hq, s_grid, **f32)
    part_l = torch.empty_like(part_m)
    part_acc = torch.empty(B, hq, s_grid, d, **f32)
    if enabled:
        part_a, part_vw, part_vmax, part_u = (torch.empty_like(part_m) for _ in range(4))
    else:
        part_a = part_vw = part_vmax = part_u = part_m
    dl_t, dl_s = _delta_arg(delta_loc if enabled and cert.radius != "det" else 0.5, B, dev)
    want_radius = bool(return_radius and enabled)
    radius = torch.zeros(B, hq, nmax, **f32) if want_radius else part_m
    logits = torch.full((B, hq, nmax), float("nan"), **f32) if debug is not None else part_m
    kargs, km2 = side_args(layer_kv.k, layer_kv.k_outlier_idx, hkv=hkv, d=d, device=dev)
    vargs, vm2 = side_args(layer_kv.v, layer_kv.v_outlier_idx, hkv=hkv, d=d, device=dev)
    qdig = digits_for(q.dtype)
    k_tc = combine_roundings(qdig=qdig, bits=bits, groups=ng)
    cuda_cfg = _cuda_config(plan, q, layer_kv, qg=qg, d=d, bits=bits, G=G, km2=km2, vm2=vm2)
    if cuda_cfg is not None:
        merge_depth = _cuda_split(cuda_cfg, q=q, layer_kv=layer_kv, block_table=block_table, seq_lens=seq_lens,
                                  page_size=page_size, sm_scale=sm_scale, cert=cert, enabled=enabled,
                                  dl_t=dl_t, dl_s=dl_s, parts=(part_m, part_l, part_a, part_vw, part_vmax,
                                                               part_u, part_acc),
                                  radius=radius if want_radius else None,
                                  logits=logits if debug is not None else None, nmax=nmax, s_grid=s_grid,
                                  num_splits=num_splits, plan=plan, arith_gamma=gamma(k_tc, U32))
    else:
        merge_depth = block_n
        split_kernel[(B * hkv, s_grid)](
            Q=q, stride_qb=q.stride(0), stride_qh=q.stride(1), stride_qd=q.stride(2),
            KCodes=kargs[0], KScales=kargs[1], KWit=kargs[2], KOutl=kargs[3], KBypPos=kargs[5],
            VCodes=vargs[0], VScales=vargs[1], VWit=vargs[2], VOutl=vargs[3], VBypPos=vargs[5],
            Epochs=layer_kv.epochs,
            Positions=layer_kv.positions if layer_kv.positions is not None else layer_kv.epochs,
            BlockTable=block_table, stride_bt=block_table.stride(0),
            SeqLens=seq_lens, DeltaLoc=dl_t if dl_t is not None else part_m, delta_scalar=dl_s,
            PartM=part_m, PartL=part_l, PartA=part_a, PartVW=part_vw, PartVMax=part_vmax, PartU=part_u,
            PartAcc=part_acc, Radius=radius, Logits=logits, stride_rb=hq * nmax, stride_rh=nmax,
            sm_scale=sm_scale, layer=layer_kv.layer, seed_lo=layer_kv.seed & 0xFFFFFFFF,
            seed_hi=layer_kv.seed >> 32, bias_coef=2.0 ** -(bits + 1) + FP_BIAS_SLACK,
            arith_gamma=gamma(k_tc, U32), byp_gamma=gamma(d + ng + 3, U32), arith_abs=ARITH_ABS,
            num_splits_grid=s_grid, fixed_splits=0 if num_splits is None else s_grid,
            min_tokens_per_split=plan.min_tokens_per_split, max_splits=plan.max_splits,
            HQ=hq, HKV=hkv, QG=qg, BLOCK_H=block_h, NG=ng, ROWS=rows, D=d, G=G, KM2=km2, VM2=vm2,
            P=page_size, BITS=bits, CPC=CHANNELS_PER_CALL[bits], ROUNDS=quant.philox_rounds, QDIG=qdig,
            BLOCK_N=block_n, HAS_CERT=enabled,
            RADIUS_DET=enabled and cert.radius in ("det", "min"),
            RADIUS_PROB=enabled and cert.radius in ("prob", "min"),
            RETURN_RADIUS=want_radius, RETURN_LOGITS=debug is not None, DELTA_PTR=dl_t is not None,
            HAS_POS=layer_kv.positions is not None,
            num_warps=plan.num_warps, num_stages=plan.num_stages,
            **({"maxnreg": plan.max_registers} if plan.max_registers else {}))
    out = torch.empty(B, hq, d, **f32)
    lse = torch.empty(B, hq, **f32)
    c = torch.empty(B, hq, **f32) if enabled else lse
    vb = torch.empty(B, hq, **f32) if enabled else lse
    merge_kernel[(B * hq,)](
        PartM=part_m, PartL=part_l, PartA=part_a, PartVW=part_vw, PartVMax=part_vmax, PartU=part_u,
        PartAcc=part_acc, Out=out, Lse=lse, Cert=c, VBound=vb, Q=q, stride_qb=q.stride(0),
        stride_qh=q.stride(1), stride_qd=q.stride(2), SeqLens=seq_lens, num_splits=s_grid,
        block_n=merge_depth, fixed_splits=0 if num_splits is None else s_grid,
        min_tokens_per_split=plan.min_tokens_per_split, max_splits=plan.max_splits,
        HQ=hq, D=d, S_PAD=next_pow2(s_grid), HAS_CERT=enabled, num_warps=4)
    rad = None
    if want_radius:
        qbad = ~torch.isfinite(q).all(-1)
        rad = torch.where(qbad[..., None], float("inf"), radius)
    if debug is not None:
        debug["logits"] = logits
    return DecodeOut(out=out, lse=lse, cert=c if enabled else None, vbound=vb if enabled else None,
                     radius=rad, radius_kind=cert.radius if enabled else "none")


_Q_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
_WARNED: set = set()


def _cuda_config(plan, q, layer_kv, *, qg, d, bits, G, km2, vm2, kind: str = "decode") -> dict | None:
    """The CUDA kernel's configuration when the plan asks for it (``cuda``, or ``auto``) and it
    serves this call; None sends the call to the Triton kernel (with one log line per reason
    when the plan asked for ``cuda`` explicitly). kind: ``decode`` (decode.cu) or ``extend``
    (extend.cu: the same shapes)."""
    if plan.impl == "triton" or not q.is_cuda:
        return None
    why = wc_cuda.reason()
    cfg = None if why else wc_cuda.config_for(qg=qg, d=d, bits=bits, group=G, outliers=max(km2, vm2),
                                              rounds=layer_kv.quant.philox_rounds)
    if cfg is not None and (q.dtype not in _Q_DTYPES or layer_kv.epochs.dtype != torch.int64
                            or layer_kv.num_slots * layer_kv.num_kv_heads >= 2**31
                            or not _aligned(layer_kv, ng=d // G)):
        cfg, why = None, (f"q {q.dtype}, epochs {layer_kv.epochs.dtype}, {layer_kv.num_slots} slots, "
                          "or storage not aligned for its vector loads")
    if cfg is not None and kind == "extend" and int(_arch(q.device)) < 90:
        cfg, why = None, "extend.cu's bulk copies need compute capability 9.0 or newer"
    if cfg is None:
        why = why or f"qg={qg} D={d} bits={bits} group={G} outliers={km2 // 2}"
        if plan.impl == "cuda" and why not in _WARNED:
            _WARNED.add(why)
            logging.getLogger("witcert.kernels").warning(
                "witcert: CUDA %s kernel not used (%s); the Triton kernel serves this call", kind, why)
        return None
    cfg = dict(cfg, arch=_arch(q.device), maxreg=getattr(plan, "max_registers", 0), kind=kind)
    if kind == "extend":
        ctas = wc_cuda.extend_blocks(tokens=q.shape[0], qgp=cfg["qgp"], warps=4) * layer_kv.num_kv_heads
        cfg["warps"], tile = plan.prefix_build(ctas_at_4_warps=ctas, sms=_sm_count(q.device))
        cfg["tile"] = 0 if tile == wc_cuda.EXTEND_TILE else tile  # 0: the source's
    if plan.impl == "auto" and not _builds(**cfg):
        return None
    return cfg


@functools.lru_cache(maxsize=None)
def _sm_count(device) -> int:
    """The multiprocessors of ``device``, asked once per device."""
    return torch.cuda.get_device_properties(device).multi_processor_count


@functools.lru_cache(maxsize=None)
def _arch(device) -> str:
    """The compute capability of ``device`` as nvcc's arch digits ("90"), asked once per device."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"{major}{minor}"


def _aligned(layer_kv, *, ng: int) -> bool:
    """decode.cu reads codes rows in 16-byte and (scale, witness) rows in 2 NG-byte vectors:
    storage that is a view at an odd offset goes to the Triton kernel instead."""
    sides = (layer_kv.k, layer_kv.v)
    return all(s["codes"].data_ptr() % 16 == 0 and s["scales"].data_ptr() % (2 * ng) == 0
               and s["wit"].data_ptr() % (2 * ng) == 0 for s in sides)


@functools.lru_cache(maxsize=None)
def _builds(**cfg) -> bool:
    """Whether the CUDA kernel builds in this configuration (asked once per configuration): the
    default plan must not fail where the Triton kernel works, so a toolchain that cannot build
    it sends the calls to Triton with one log line."""
    try:
        wc_cuda.library(**cfg)
        return True
    except RuntimeError as e:
        logging.getLogger("witcert.kernels").warning(
            "witcert: the CUDA %s kernel did not build (%s); the Triton kernel serves these calls",
            cfg.get("kind", "decode"), str(e).strip().splitlines()[-1][:200])
        return False


def _cuda_split(cfg, *, q, layer_kv, block_table, seq_lens, page_size, sm_scale, cert, enabled, dl_t, dl_s,
                parts, radius, logits, nmax, s_grid, num_splits, plan, arith_gamma) -> int:
    """Launch decode.cu's split kernel on q's current stream; returns the merge kernel's
    per-tile depth for its rounding allowance (decode.cu: a weight's sums go through at most
    2 per tile + 10 roundings in the split kernel, inside the 16 + 2 per tile counted)."""
    B, hq, d = q.shape
    if wc_cuda.pairs_for_grid(qgp=cfg["qgp"], group=cfg["group"], bits=cfg["bits"],
                              ctas=B * layer_kv.num_kv_heads * s_grid, sms=_sm_count(q.device),
                              mode=plan.cuda_pairs) and _builds(**cfg, few_ctas=True):
        cfg = dict(cfg, few_ctas=True)
    lib = wc_cuda.library(**cfg)
    if q.stride(-1) != 1:
        q = q.contiguous()
    k, v = layer_kv.k, layer_kv.v
    k0, k1 = seed_to_key(layer_kv.seed)
    bits = layer_kv.quant.dither_bits
    pm, pl, pa, pvw, pvmax, pu, pacc = parts
    ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
    args = wc_cuda.Args(
        q=q.data_ptr(), kc=k["codes"].data_ptr(), vc=v["codes"].data_ptr(), ks=k["scales"].data_ptr(),
        vs=v["scales"].data_ptr(), kw=k["wit"].data_ptr(), vw=v["wit"].data_ptr(),
        epochs=layer_kv.epochs.data_ptr(), bt=block_table.data_ptr(), seq_lens=seq_lens.data_ptr(),
        delta=ptr(dl_t), pm=pm.data_ptr(), pl=pl.data_ptr(), pa=pa.data_ptr(), pvw=pvw.data_ptr(),
        pvmax=pvmax.data_ptr(), pu=pu.data_ptr(), pacc=pacc.data_ptr(), radius=ptr(radius),
        logits=ptr(logits), sq_b=q.stride(0), sq_h=q.stride(1), bt_s0=block_table.stride(0), rad_n=nmax,
        sm=sm_scale, delta_scalar=dl_s, bias_coef=2.0 ** -(bits + 1) + FP_BIAS_SLACK,
        arith_gamma=arith_gamma, arith_abs=ARITH_ABS,
        key0=k0, key1=k1, q_dtype=_Q_DTYPES[q.dtype], Hq=hq, Hkv=layer_kv.num_kv_heads,
        G=layer_kv.quant.group_size, P=page_size, layer=layer_kv.layer, rounds=layer_kv.quant.philox_rounds,
        cert=int(enabled), radius_mode={"det": 0, "prob": 1, "min": 2}[cert.radius] if enabled else 0,
        num_splits_grid=s_grid, fixed_splits=0 if num_splits is None else s_grid,
        min_tokens_per_split=plan.min_tokens_per_split, max_splits=plan.max_splits,
        positions=ptr(layer_kv.positions))
    stream = torch.cuda.current_stream(q.device).cuda_stream
    rc = lib.wc_decode_launch(ctypes.byref(args), B * layer_kv.num_kv_heads, s_grid, stream)
    if rc:
        raise RuntimeError(f"witcert: CUDA decode launch failed (cudaError {rc})")
    return wc_cuda.TILE
