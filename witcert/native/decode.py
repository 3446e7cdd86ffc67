"""Thin ctypes launchers of ``decode.c`` (the fused decode) and ``probe.c`` (dither, gather).

``decode_attention`` is ``witcert.integrations.vllm.attend.decode_batched`` in one C call:
same inputs, same outputs (out f32 [B, Hq, D], cert f32 [B, Hq]), dither and dequantized
K/V bitwise the reference, logits / softmax / output / certificate in float64 inside C.
``decode_attention_full`` also returns lse and vbound (the rest of
``witcert.ref.attention.DecodeOut``; ``witcert.backend`` uses it on CPU).
Both take an optional exact overlay (``exact=``: the vLLM gate's ``ExactCopy``, see
``exact_unsupported``): live entries are read exactly with radius 0.
``dither`` and ``gather`` expose the C dither and dequantization for the bitwise tests.
Only ``dither8`` (with or without outlier bypass) on CPU tensors is supported
(``unsupported`` says why not otherwise); the torch reference path covers everything else.
"""

from __future__ import annotations

import ctypes
import functools
from ctypes import c_double, c_int32, c_int64, c_uint32, c_void_p

import torch

from witcert import native
from witcert.ref.arith import native_model
from witcert.ref.philox import seed_to_key
from witcert.ref.pool import LayerKV
from witcert.ref.validate import check_sm_scale
from witcert.ref.types import K_SIDE

RADIUS_CODES = {"det": 0, "prob": 1, "min": 2}
MAX_HEAD_DIM, MAX_GROUPS, MAX_GQA = 256, 32, 16
ERRORS = {-1: "a slot outside [0, num_slots) (block table or seq_lens wrong)",
          -2: "an epoch or slot outside [0, 2^32)", -3: "an argument out of range",
          -4: "out of memory", -5: "pthread_create failed"}


class _Side(ctypes.Structure):
    """``wc_side``: base pointers of codes / scales / wit (and outl with the int32 bypassed
    channel indices) and their (slot, head) strides."""

    _fields_ = [("codes", c_void_p), ("scales", c_void_p), ("wit", c_void_p),
                ("codes_s0", c_int64), ("codes_s1", c_int64), ("scales_s0", c_int64),
                ("scales_s1", c_int64), ("wit_s0", c_int64), ("wit_s1", c_int64),
                ("outl", c_void_p), ("outl_s0", c_int64), ("outl_s1", c_int64),
                ("oidx", c_void_p), ("m2", c_int32)]


class _DecodeArgs(ctypes.Structure):
    """``wc_decode_args`` (field order = the C struct)."""

    _fields_ = [("q", c_void_p), ("k", _Side), ("v", _Side), ("epochs", c_void_p),
                ("block_table", c_void_p), ("seq_lens", c_void_p), ("delta_loc", c_void_p),
                ("out", c_void_p), ("cert", c_void_p), ("num_slots", c_int64),
                ("bt_s0", c_int64), ("pages", c_int64), ("sm_scale", c_double),
                ("key0", c_uint32), ("key1", c_uint32), ("B", c_int32), ("Hq", c_int32),
                ("Hkv", c_int32), ("D", c_int32), ("G", c_int32), ("page_size", c_int32),
                ("layer", c_int32), ("bits", c_int32), ("radius", c_int32),
                ("num_threads", c_int32), ("lse", c_void_p), ("vbound", c_void_p),
                ("xk", c_void_p), ("xv", c_void_p), ("xflag", c_void_p), ("xepoch", c_void_p),
                ("xslot_epochs", c_void_p), ("xdtype", c_int32),
                ("arith_rel_s", c_double), ("arith_abs", c_double), ("softmax_slack", c_double),
                ("tail_gap", c_double), ("sum_rel", c_double), ("rounds", c_int32),
                ("dbg_n", c_int64), ("dbg_radius", c_void_p), ("dbg_logits", c_void_p),
                ("xwk", c_void_p), ("xwv", c_void_p)]


EXACT_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def exact_unsupported(exact, layer_kv: LayerKV) -> str | None:
    """Why the native decode cannot read this exact overlay, or None if it can.

    exact: an object with ``k``, ``v`` (f32 / f16 / bf16 [num_slots, Hkv, D], contiguous,
    same dtype), ``exact`` (bool or uint8 [num_slots, Hkv]), ``exact_epoch`` (int64
    [num_slots, Hkv]) and ``epochs`` (int64 [num_slots]), all contiguous CPU tensors, and
    optionally ``wk``, ``wv`` (None, or f32 [num_slots, Hkv]: rounding witnesses of the copy)
    (``witcert.exact.ExactCopy``)."""
    S, H, D = layer_kv.num_slots, layer_kv.num_kv_heads, layer_kv.head_dim
    try:
        k, v, flag, xep, ep = exact.k, exact.v, exact.exact, exact.exact_epoch, exact.epochs
    except AttributeError as e:
        return f"exact overlay lacks a field ({e})"
    want = (("k", k, tuple(EXACT_DTYPES), (S, H, D)), ("v", v, (k.dtype,), (S, H, D)),
            ("exact", flag, (torch.bool, torch.uint8), (S, H)),
            ("exact_epoch", xep, (torch.int64,), (S, H)), ("epochs", ep, (torch.int64,), (S,)))
    wit = tuple((name, t, (torch.float32,), (S, H)) for name in ("wk", "wv")
                if (t := getattr(exact, name, None)) is not None)
    want = want + wit
    for name, t, dts, shape in want:
        if not isinstance(t, torch.Tensor) or t.dtype not in dts or t.device.type != "cpu" \
                or tuple(t.shape) != shape or not t.is_contiguous():
            got = (f"{t.dtype} {list(t.shape)} on {t.device}" if isinstance(t, torch.Tensor)
                   else type(t).__name__)
            return (f"exact overlay field {name!r}: need a contiguous CPU tensor {list(shape)} of "
                    f"{' / '.join(str(d) for d in dts)}, got {got}")
    return None


def _exact_fields(exact, layer_kv: LayerKV) -> dict:
    if exact is None:
        return {}
    why = exact_unsupported(exact, layer_kv)
    if why:
        raise ValueError(f"witcert native decode: {why}")
    wk, wv = getattr(exact, "wk", None), getattr(exact, "wv", None)
    return dict(xk=exact.k.data_ptr(), xv=exact.v.data_ptr(), xflag=exact.exact.data_ptr(),
                xepoch=exact.exact_epoch.data_ptr(), xslot_epochs=exact.epochs.data_ptr(),
                xdtype=EXACT_DTYPES[exact.k.dtype], xwk=None if wk is None else wk.data_ptr(),
                xwv=None if wv is None else wv.data_ptr())


@functools.lru_cache(maxsize=None)
def _fns(extra_flags: tuple[str, ...] = ()):
    """The C entry points with their prototypes, set once per library."""
    lib = native.lib(extra_flags=extra_flags)
    dec = lib.wc_decode
    dec.argtypes, dec.restype = [ctypes.POINTER(_DecodeArgs)], c_int32
    dit = lib.wc_dither
    dit.argtypes = [c_void_p, c_void_p, c_int64, c_int32, c_int32, c_int32, c_int32, c_int32,
                    c_uint32, c_uint32, c_void_p, c_int32]
    dit.restype = c_int32
    gat = lib.wc_gather
    gat.argtypes = [ctypes.POINTER(_Side), c_void_p, c_int64, c_void_p, c_int64, c_int32, c_int32,
                    c_int32, c_int32, c_int32, c_int32, c_uint32, c_uint32, c_void_p, c_int32]
    gat.restype = c_int32
    phx = lib.wc_philox_block
    phx.argtypes = [c_void_p, c_void_p, c_int64, c_int32, c_void_p]
    phx.restype = c_int32
    return dec, dit, gat, phx


def _check(rc: int, what: str) -> None:
    if rc:
        raise ValueError(f"witcert native {what}: {ERRORS.get(rc, f'error {rc}')}")


# the attribute of an outlier_idx tensor that caches (its version, int32 copy for C, why not)
_OIDX_ATTR = "_witcert_native_oidx"


def _outlier_idx32(idx: torch.Tensor, *, num_kv_heads: int, head_dim: int) -> tuple:
    """(int32 [Hkv, 2m] contiguous copy, None) or (None, why C cannot use ``idx``); cached
    per index tensor (and its in-place version), so the checks run once per layer."""
    hit = getattr(idx, _OIDX_ATTR, None)
    if hit is not None and hit[0] == idx._version:
        return hit[1], hit[2]
    why, i32 = None, None
    if idx.dtype != torch.int64 or idx.dim() != 2 or idx.shape[0] != num_kv_heads \
            or idx.device.type != "cpu":
        why = f"outlier_idx must be a CPU int64 [{num_kv_heads}, 2m], got {idx.dtype} " \
              f"{list(idx.shape)} on {idx.device}"
    elif idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= head_dim):
        why = f"outlier_idx entries must lie in [0, {head_dim})"
    elif idx.numel() and bool((idx.sort(-1).values.diff(dim=-1) == 0).any()):
        why = "outlier_idx repeats a channel within a head (native: distinct channels only)"
    else:
        i32 = idx.to(torch.int32).contiguous()
    setattr(idx, _OIDX_ATTR, (idx._version, i32, why))
    return i32, why


def _side(store: dict[str, torch.Tensor], idx: torch.Tensor | None = None,
          keep: list | None = None) -> _Side:
    """The C view of one side. idx: the side's outlier_idx (None: no bypass); keep: a list
    that receives the int32 index copy, to be held alive for the C call."""
    c, s, w = store["codes"], store["scales"], store["wit"]
    sd = _Side(codes=c.data_ptr(), scales=s.data_ptr(), wit=w.data_ptr(),
               codes_s0=c.stride(0), codes_s1=c.stride(1), scales_s0=s.stride(0),
               scales_s1=s.stride(1), wit_s0=w.stride(0), wit_s1=w.stride(1), m2=0)
    if idx is not None and idx.shape[-1]:
        i32, why = _outlier_idx32(idx, num_kv_heads=c.shape[1], head_dim=c.shape[2])
        if why:
            raise ValueError(f"witcert native: {why}")
        o = store["outl"]
        assert tuple(o.shape) == (c.shape[0], c.shape[1], i32.shape[1]) and o.dtype == torch.float16 \
            and (o.shape[-1] <= 1 or o.stride(-1) == 1), "outl: fp16 [num_slots, Hkv, 2m]"
        sd.outl, sd.outl_s0, sd.outl_s1 = o.data_ptr(), o.stride(0), o.stride(1)
        sd.oidx, sd.m2 = i32.data_ptr(), i32.shape[1]
        if keep is not None:
            keep.append(i32)
    return sd


def layer_sides(layer_kv: LayerKV, keep: list) -> tuple[_Side, _Side]:
    """(K side, V side) of ``layer_kv`` for C, outlier bypass included; ``keep`` holds the
    index copies alive for the call."""
    return (_side(layer_kv.k, layer_kv.k_outlier_idx, keep),
            _side(layer_kv.v, layer_kv.v_outlier_idx, keep))


def philox_rounds(layer_kv: LayerKV) -> int:
    """Philox rounds of the pool's dither (``QuantConfig.philox_rounds``: 10 or 7)."""
    return int(getattr(layer_kv.quant, "philox_rounds", 10))


def _group_and_bits(layer_kv: LayerKV) -> tuple[int, int]:
    comp = layer_kv.compressor
    return (getattr(comp, "group_size", layer_kv.quant.group_size),
            getattr(comp, "bits", layer_kv.quant.dither_bits))


def unsupported_shape(*, head_dim: int, group_size: int, num_q_heads: int,
                      num_kv_heads: int) -> str | None:
    """Why the native path cannot serve these head shapes, or None if it can."""
    D, G = head_dim, group_size
    if D > MAX_HEAD_DIM or D % 8 or D % G or D // G > MAX_GROUPS:
        return (f"head_dim {D} / group {G} (native: D a multiple of 8 and <= {MAX_HEAD_DIM}, "
                f"G divides D, D / G <= {MAX_GROUPS})")
    if num_q_heads % num_kv_heads or num_q_heads // num_kv_heads > MAX_GQA:
        return f"GQA ratio {num_q_heads}/{num_kv_heads} (native: <= {MAX_GQA})"
    return None


# the attribute of a LayerKV that caches (the objects the pool check read, its answer)
_POOL_ATTR = "_witcert_native_pool_check"


def unsupported(layer_kv: LayerKV, q: torch.Tensor | None = None) -> str | None:
    """Why the native decode cannot serve this pool (and query), or None if it can.

    The pool part is cached on ``layer_kv`` for as long as it holds the same objects
    (compressor, storage tensors, outlier indices and their versions, epochs): a decode
    step asks several times per layer, and the answer only changes when they are replaced."""
    if q is not None:
        if q.device.type != "cpu":
            return f"query on {q.device}"
        why = unsupported_shape(head_dim=layer_kv.head_dim, group_size=_group_and_bits(layer_kv)[0],
                                num_q_heads=q.shape[1], num_kv_heads=layer_kv.num_kv_heads)
        if why:
            return why
    idx = (layer_kv.k_outlier_idx, layer_kv.v_outlier_idx)
    key = (layer_kv.compressor, layer_kv.epochs, *layer_kv.k.values(), *layer_kv.v.values(),
           *idx, *(None if i is None else i._version for i in idx))
    hit = layer_kv.__dict__.get(_POOL_ATTR)
    if hit is not None and len(hit[0]) == len(key) and all(a is b for a, b in zip(hit[0], key)):
        return hit[1]
    why = _unsupported_pool(layer_kv)
    layer_kv.__dict__[_POOL_ATTR] = (key, why)
    return why


def _unsupported_pool(layer_kv: LayerKV) -> str | None:
    comp = layer_kv.compressor
    if comp.name != "dither8":
        return f"method {comp.name!r} (native: dither8 only)"
    m2 = 2 * getattr(comp, "outliers", 0)
    G, _ = _group_and_bits(layer_kv)
    why = unsupported_shape(head_dim=layer_kv.head_dim, group_size=G,
                            num_q_heads=layer_kv.num_kv_heads, num_kv_heads=layer_kv.num_kv_heads)
    if why:
        return why
    S, H, D = layer_kv.num_slots, layer_kv.num_kv_heads, layer_kv.head_dim
    want = {"codes": (torch.int8, (S, H, D)), "scales": (torch.float16, (S, H, D // G)),
            "wit": (torch.float16, (S, H, D // G))}
    if m2:
        want["outl"] = (torch.float16, (S, H, m2))
        for name, idx in (("k_outlier_idx", layer_kv.k_outlier_idx),
                          ("v_outlier_idx", layer_kv.v_outlier_idx)):
            if idx is None or tuple(idx.shape) != (H, m2):
                return f"{name} is not [{H}, {m2}] for outliers {m2 // 2}"
            why = _outlier_idx32(idx, num_kv_heads=H, head_dim=D)[1]
            if why:
                return why
    elif layer_kv.k_outlier_idx is not None and layer_kv.k_outlier_idx.numel():
        return "outlier indices given but the compressor has outliers 0"
    for store in (layer_kv.k, layer_kv.v):
        for name, (dt, shape) in want.items():
            t = store.get(name)
            if t is None or t.dtype != dt or t.device.type != "cpu" or tuple(t.shape) != shape \
                    or (t.shape[-1] > 1 and t.stride(-1) != 1):
                return (f"storage field {name!r} is not a CPU {dt} {list(shape)} with unit last "
                        "stride")
    ep = layer_kv.epochs
    if ep.dtype != torch.int64 or ep.device.type != "cpu" or not ep.is_contiguous():
        return "epochs are not a contiguous CPU int64 tensor"
    return None


def decode_attention(q: torch.Tensor, layer_kv: LayerKV, block_table: torch.Tensor,
                     seq_lens: torch.Tensor, *, page_size: int, sm_scale: float, radius: str,
                     delta_loc: torch.Tensor, num_threads: int = 1, exact=None,
                     _extra_flags: tuple[str, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode query per sequence over one layer's pool, in one C call.

    q: float [B, Hq, D] (CPU, any float dtype); block_table: int32 [B, pages] (unit last
    stride); seq_lens: int32 [B], each in [1, pages * P]; delta_loc: f64 [B] (used by the
    prob / min radius). radius: ``det`` | ``prob`` | ``min``. Returns (out f32 [B, Hq, D],
    cert f32 [B, Hq]); a non-finite query head gets cert = +inf. num_threads: pthreads
    over (sequence, KV head), same bits for any count. Call ``unsupported`` first (this
    only asserts what C needs to be memory safe). exact: None, or the exact overlay
    (``ExactCopy``; ``exact_unsupported`` says what it must be, ``ValueError`` otherwise): an
    entry (slot, KV head) with ``exact`` set at the slot's current epoch reads the exact K
    (radius 0) and V instead of the stored record. ``_extra_flags``: a library built with
    extra flags (tests compare the portable build with the default one).
    """
    out, _, cert, _ = decode_attention_full(
        q, layer_kv, block_table, seq_lens, page_size=page_size, sm_scale=sm_scale,
        radius=radius, delta_loc=delta_loc, num_threads=num_threads, with_cert=True,
        with_lse_vbound=False, exact=exact, _extra_flags=_extra_flags)
    return out, cert


def decode_attention_full(q: torch.Tensor, layer_kv: LayerKV, block_table: torch.Tensor,
                          seq_lens: torch.Tensor, *, page_size: int, sm_scale: float, radius: str,
                          delta_loc: torch.Tensor | None, num_threads: int = 1,
                          with_cert: bool = True, with_lse_vbound: bool = True, exact=None,
                          debug: dict | None = None, _extra_flags: tuple[str, ...] = ()):
    """``decode_attention`` with the rest of ``witcert.ref.attention.DecodeOut``.

    Returns (out f32 [B, Hq, D], lse f32 [B, Hq] | None, cert f32 [B, Hq] | None,
    vbound f32 [B, Hq] | None). lse = log sum_t exp(z^_t) (natural log); vbound is the
    reference's value bound (MATH 5) computed in float64 and rounded up to f32, +inf on a
    non-finite query head. with_cert=False skips the radii (cert and vbound None, radius
    and delta_loc unused); with_lse_vbound=False skips lse and vbound. exact: the overlay
    of ``decode_attention`` (a live exact V has witness norm 0 in vbound).
    debug: a dict that receives ``logits`` f64 [B, Hq, Nmax] (the logits the C code used) and,
    with the certificate, ``radius`` f32 [B, Hq, Nmax] (whole radii, rounded up); entries
    past each seq_len are unset (NaN). For the soundness tests.
    """
    check_sm_scale(sm_scale)
    B, Hq, D = q.shape
    assert D == layer_kv.head_dim and Hq % layer_kv.num_kv_heads == 0, "q does not fit the pool"
    assert block_table.dtype == torch.int32 and block_table.dim() == 2 and block_table.shape[0] == B \
        and (block_table.shape[1] <= 1 or block_table.stride(1) == 1), "block_table: int32 [B, pages]"
    assert seq_lens.dtype == torch.int32 and tuple(seq_lens.shape) == (B,), "seq_lens: int32 [B]"
    xf = _exact_fields(exact, layer_kv)
    q32 = q.to(torch.float32).contiguous()
    sl = seq_lens.contiguous()
    if with_cert and radius != "det":
        dl = delta_loc.to(torch.float64).contiguous()
        assert tuple(dl.shape) == (B,), "delta_loc: f64 [B]"
        dl_ptr = dl.data_ptr()
    else:
        dl_ptr = None  # read by C only for the prob / min radius
    out = torch.empty(B, Hq, D, dtype=torch.float32)
    cert = torch.empty(B, Hq, dtype=torch.float32) if with_cert else None
    lse = torch.empty(B, Hq, dtype=torch.float32) if with_lse_vbound else None
    vbound = torch.empty(B, Hq, dtype=torch.float32) if with_lse_vbound and with_cert else None
    G, bits = _group_and_bits(layer_kv)
    k0, k1 = seed_to_key(layer_kv.seed)
    model = native_model(D)
    keep: list = []
    ks, vs = layer_sides(layer_kv, keep)
    dbg = {}
    if debug is not None:
        nmax = int(sl.max()) if B else 1
        dbg = dict(dbg_n=nmax, dbg_logits=None, dbg_radius=None)
        debug["logits"] = torch.full((B, Hq, nmax), float("nan"), dtype=torch.float64)
        dbg["dbg_logits"] = debug["logits"].data_ptr()
        if with_cert:
            debug["radius"] = torch.full((B, Hq, nmax), float("nan"), dtype=torch.float32)
            dbg["dbg_radius"] = debug["radius"].data_ptr()
    args = _DecodeArgs(
        q=q32.data_ptr(), k=ks, v=vs,
        epochs=layer_kv.epochs.data_ptr(), block_table=block_table.data_ptr(),
        seq_lens=sl.data_ptr(), delta_loc=dl_ptr, out=out.data_ptr(),
        cert=None if cert is None else cert.data_ptr(), num_slots=layer_kv.num_slots,
        bt_s0=block_table.stride(0), pages=block_table.shape[1], sm_scale=float(sm_scale),
        key0=k0, key1=k1, B=B, Hq=Hq, Hkv=layer_kv.num_kv_heads, D=D, G=G,
        page_size=page_size, layer=layer_kv.layer, bits=bits,
        radius=RADIUS_CODES[radius if with_cert else "det"], num_threads=num_threads,
        lse=None if lse is None else lse.data_ptr(),
        vbound=None if vbound is None else vbound.data_ptr(), **xf,
        arith_rel_s=model.rel_s, arith_abs=model.abs_err, softmax_slack=model.softmax,
        tail_gap=model.tail_gap, sum_rel=model.sum_rel, rounds=philox_rounds(layer_kv), **dbg)
    _check(_fns(tuple(_extra_flags))[0](ctypes.byref(args)), "decode")
    return out, lse, cert, vbound


def dither(*, seed: int, layer: int, num_kv_heads: int, side: int, slots: torch.Tensor,
           epochs: torch.Tensor, head_dim: int, bits: int, rounds: int = 10,
           extra_flags: tuple[str, ...] = ()) -> torch.Tensor:
    """``witcert.ref.philox.dither`` for heads 0..H-1 from C: f32 [T, H, head_dim]."""
    s = slots.to(torch.int64).contiguous()
    e = epochs.to(torch.int64).contiguous()
    out = torch.empty(s.shape[0], num_kv_heads, head_dim, dtype=torch.float32)
    k0, k1 = seed_to_key(seed)
    _check(_fns(extra_flags)[1](s.data_ptr(), e.data_ptr(), s.shape[0], num_kv_heads, head_dim,
                                layer, side, bits, k0, k1, out.data_ptr(), rounds), "dither")
    return out


def philox_block(ctr: torch.Tensor, key: torch.Tensor, *, rounds: int = 10) -> torch.Tensor:
    """Philox4x32 from C, one block per counter (the known-answer tests): ctr int [n, 4],
    key int [n, 2] (values < 2^32) -> int64 [n, 4]."""
    c = ctr.to(torch.int64).reshape(-1, 4)
    k = key.to(torch.int64).reshape(-1, 2).expand(c.shape[0], 2)
    c32 = c.to(torch.uint32).contiguous()
    k32 = k.to(torch.uint32).contiguous()
    out = torch.empty_like(c32)
    _check(_fns()[3](c32.data_ptr(), k32.data_ptr(), c32.shape[0], rounds, out.data_ptr()),
           "philox")
    return out.to(torch.int64)


def gather(layer_kv: LayerKV, side: int, slots: torch.Tensor, *,
           extra_flags: tuple[str, ...] = ()) -> torch.Tensor:
    """``witcert.ref.pool.gather(...)[0]`` from C: dequantized f32 [T, Hkv, D]."""
    why = unsupported(layer_kv)
    if why:
        raise ValueError(f"witcert native gather: {why}")
    s = slots.to(torch.int64).contiguous()
    G, bits = _group_and_bits(layer_kv)
    k0, k1 = seed_to_key(layer_kv.seed)
    out = torch.empty(s.shape[0], layer_kv.num_kv_heads, layer_kv.head_dim, dtype=torch.float32)
    keep: list = []
    sd = _side(layer_kv.storage(side), layer_kv.outlier_idx(side), keep)
    _check(_fns(extra_flags)[2](ctypes.byref(sd), layer_kv.epochs.data_ptr(), layer_kv.num_slots,
                                s.data_ptr(), s.shape[0], layer_kv.num_kv_heads, layer_kv.head_dim,
                                G, layer_kv.layer, side, bits, k0, k1, out.data_ptr(),
                                philox_rounds(layer_kv)), "gather")
    return out
