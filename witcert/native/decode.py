"""Thin ctypes launchers of ``decode.c`` (the fused decode) and ``probe.c`` (dither, gather).

``decode_attention`` is the reference decode (``witcert.ref.attention.decode_attention`` with
one split, one query per sequence) for a whole batch in one C call: same inputs, same outputs (out f32 [B, Hq, D], cert f32 [B, Hq]), dither and dequantized
K/V bitwise the reference, logits / softmax / output / certificate in float64 inside C.
``decode_attention_full`` also returns lse and vbound (the rest of
``witcert.ref.attention.DecodeOut``; ``witcert.runtime.dispatch`` uses it on CPU).
Both take an optional exact overlay (``exact=``: ``witcert.runtime.exact.ExactCopy``, see
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
from witcert.ref import arith
from witcert.ref.philox import seed_to_key
from witcert.ref.pool import LayerKV
from witcert.ref.validate import check_attention_dtypes, check_sm_scale
from witcert.native.support import (EXACT_DTYPES, exact_unsupported, group_and_bits,  # noqa: F401
                                    outlier_idx32, philox_rounds, positions_ptr, unsupported)

RADIUS_CODES = {"det": 0, "prob": 1, "min": 2}
ERRORS = {-1: "a slot outside [0, num_slots) (block table or seq_lens wrong)",
          -2: "an epoch or slot outside [0, 2^32)", -3: "an argument out of range",
          -4: "out of memory", -5: "pthread_create failed",
          -6: "a position outside [0, 2^32) (LayerKV.positions, the position-keyed dither)"}


@functools.lru_cache(maxsize=None)
def native_model(head_dim: int) -> arith.LogitModel:
    """``witcert.ref.arith.native_model`` (the constants C receives), built once per D."""
    return arith.native_model(head_dim)


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
                ("positions", c_void_p), ("block_table", c_void_p), ("seq_lens", c_void_p), ("delta_loc", c_void_p),
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
                ("xw_rel", c_double), ("xw_abs", c_double), ("kv_sel", c_void_p),
                ("dbg_fired", c_int32), ("dbg_tau", c_double)]


def _exact_fields(exact, layer_kv: LayerKV) -> dict:
    if exact is None:
        return {}
    why = exact_unsupported(exact, layer_kv)
    if why:
        raise ValueError(f"witcert native decode: {why}")
    consts = getattr(exact, "witness_constants", None)
    rel, abs_ = consts() if consts is not None else (0.0, 0.0)
    return dict(xk=exact.k.data_ptr(), xv=exact.v.data_ptr(), xflag=exact.exact.data_ptr(),
                xepoch=exact.exact_epoch.data_ptr(), xslot_epochs=exact.epochs.data_ptr(),
                xdtype=EXACT_DTYPES[exact.k.dtype], xw_rel=rel, xw_abs=abs_)


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
    gat.argtypes = [ctypes.POINTER(_Side), c_void_p, c_void_p, c_int64, c_void_p, c_int64, c_int32, c_int32,
                    c_int32, c_int32, c_int32, c_int32, c_uint32, c_uint32, c_void_p, c_int32]
    gat.restype = c_int32
    phx = lib.wc_philox_block
    phx.argtypes = [c_void_p, c_void_p, c_int64, c_int32, c_void_p]
    phx.restype = c_int32
    lanes = lib.wc_philox_lanes
    lanes.argtypes = [c_int32, c_void_p, c_uint32, c_uint32, c_int64, c_int32, c_void_p]
    lanes.restype = c_int32
    return dec, dit, gat, phx, lanes


def _check(rc: int, what: str) -> None:
    if rc:
        raise ValueError(f"witcert native {what}: {ERRORS.get(rc, f'error {rc}')}")


def _side(store: dict[str, torch.Tensor], idx: torch.Tensor | None = None,
          keep: list | None = None) -> _Side:
    """The C view of one side. idx: the side's outlier_idx (None: no bypass); keep: a list
    that receives the int32 index copy, to be held alive for the C call."""
    c, s, w = store["codes"], store["scales"], store["wit"]
    sd = _Side(codes=c.data_ptr(), scales=s.data_ptr(), wit=w.data_ptr(),
               codes_s0=c.stride(0), codes_s1=c.stride(1), scales_s0=s.stride(0),
               scales_s1=s.stride(1), wit_s0=w.stride(0), wit_s1=w.stride(1), m2=0)
    if idx is not None and idx.shape[-1]:
        i32, why = outlier_idx32(idx, num_kv_heads=c.shape[1], head_dim=c.shape[2])
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
                          debug: dict | None = None, kv_heads: torch.Tensor | None = None,
                          debug_tau: float | None = None, _extra_flags: tuple[str, ...] = ()):
    """``decode_attention`` with the rest of ``witcert.ref.attention.DecodeOut``.

    Returns (out f32 [B, Hq, D], lse f32 [B, Hq] | None, cert f32 [B, Hq] | None,
    vbound f32 [B, Hq] | None). lse = log sum_t exp(z^_t) (natural log); vbound is the
    reference's value bound (docs/MATH.md §5) computed in float64 and rounded up to f32, +inf on a
    non-finite query head. with_cert=False skips the radii (cert and vbound None, radius
    and delta_loc unused); with_lse_vbound=False skips lse and vbound. exact: the overlay
    of ``decode_attention`` (a live exact V has witness norm 0 in vbound).
    debug: a dict that receives ``logits`` f64 [B, Hq, Nmax] (the logits the C code used) and,
    with the certificate, ``radius`` f32 [B, Hq, Nmax] (whole radii, rounded up); entries
    past each seq_len are NaN (written by C). For the soundness tests and the gate.
    debug_tau: None (every query head's debug rows), or a threshold: only the rows of query
    heads whose certificate (the f32 value returned) is >= debug_tau are written, the others
    are left unset (uninitialized memory): the gate's first pass, whose repair reads the fired
    heads' rows only (a head fires when its certificate exceeds tau; pass a value <= tau and
    <= float32(tau), ``debug_threshold``). Needs the certificate.
    kv_heads: None, or bool [B, Hkv]: only the (sequence, KV head) pairs set are decoded (their
    query heads' out, lse, cert, vbound and debug entries, the same bits as a full call); the
    other entries of the outputs (debug included) are left unset (the gate's re-decode of a
    row whose repair changed some KV heads only).
    """
    check_sm_scale(sm_scale)
    check_attention_dtypes(q=q)
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
    dbg = {}
    if debug is not None:
        lens = sl.tolist()
        nmax = max(lens, default=1)
        # C writes every entry of a decoded row, NaN past its seq_len
        alloc = torch.empty
        dbg = dict(dbg_n=nmax, dbg_logits=None, dbg_radius=None)
        debug["logits"] = alloc(B, Hq, nmax, dtype=torch.float64)
        dbg["dbg_logits"] = debug["logits"].data_ptr()
        if with_cert:
            debug["radius"] = alloc(B, Hq, nmax, dtype=torch.float32)
            dbg["dbg_radius"] = debug["radius"].data_ptr()
    sel = None
    if kv_heads is not None:
        assert kv_heads.dtype == torch.bool and tuple(kv_heads.shape) == (B, layer_kv.num_kv_heads), \
            "kv_heads: bool [B, Hkv]"
        sel = kv_heads.to(torch.uint8).contiguous()
    keep: list = []
    assert debug_tau is None or (with_cert and debug is not None), "debug_tau needs the certificate and debug"
    args = decode_args(q32, layer_kv, block_table, sl, page_size=page_size, sm_scale=sm_scale,
                       radius=radius if with_cert else "det", delta_ptr=dl_ptr,
                       num_threads=num_threads, exact_fields=xf, out=out, cert=cert, lse=lse,
                       vbound=vbound, keep=keep, kv_sel=sel, dbg_tau=debug_tau, **dbg)
    _check(_fns(tuple(_extra_flags))[0](ctypes.byref(args)), "decode")
    return out, lse, cert, vbound


def decode_args(q32: torch.Tensor, layer_kv: LayerKV, block_table: torch.Tensor,
                seq_lens: torch.Tensor, *, page_size: int, sm_scale: float, radius: str,
                delta_ptr: int | None, num_threads: int, exact_fields: dict, out: torch.Tensor,
                cert: torch.Tensor | None, lse: torch.Tensor | None,
                vbound: torch.Tensor | None, keep: list, kv_sel: torch.Tensor | None = None,
                dbg_n: int = 0, dbg_logits: int | None = None,
                dbg_radius: int | None = None, dbg_tau: float | None = None) -> _DecodeArgs:
    """The ``wc_decode_args`` of a batch (``decode_attention_full`` checks the tensors first):
    q32 f32 [B, Hq, D] contiguous, block_table int32 [B, pages], seq_lens int32 [B]
    contiguous; delta_ptr: the f64 [B] budgets' address (prob / min radius) or None;
    exact_fields: ``_exact_fields`` of the overlay; out / cert / lse / vbound: the output
    tensors (None: not computed); keep: a list that receives what must stay alive for the
    call; kv_sel: None or uint8 [B, Hkv] contiguous; dbg_*: the debug outputs (dbg_tau: None,
    every query head's; else only those of heads whose f32 certificate is >= dbg_tau)."""
    B, Hq, D = q32.shape
    G, bits = group_and_bits(layer_kv)
    k0, k1 = seed_to_key(layer_kv.seed)
    model = native_model(D)
    ks, vs = layer_sides(layer_kv, keep)
    return _DecodeArgs(
        q=q32.data_ptr(), k=ks, v=vs,
        epochs=layer_kv.epochs.data_ptr(), positions=positions_ptr(layer_kv),
        block_table=block_table.data_ptr(), seq_lens=seq_lens.data_ptr(), delta_loc=delta_ptr,
        out=out.data_ptr(), cert=None if cert is None else cert.data_ptr(),
        num_slots=layer_kv.num_slots, bt_s0=block_table.stride(0), pages=block_table.shape[1],
        sm_scale=float(sm_scale), key0=k0, key1=k1, B=B, Hq=Hq, Hkv=layer_kv.num_kv_heads, D=D,
        G=G, page_size=page_size, layer=layer_kv.layer, bits=bits,
        radius=RADIUS_CODES[radius], num_threads=num_threads,
        lse=None if lse is None else lse.data_ptr(),
        vbound=None if vbound is None else vbound.data_ptr(), **exact_fields,
        arith_rel_s=model.rel_s, arith_abs=model.abs_err, softmax_slack=model.softmax,
        tail_gap=model.tail_gap, sum_rel=model.sum_rel, rounds=philox_rounds(layer_kv),
        kv_sel=None if kv_sel is None else kv_sel.data_ptr(), dbg_n=dbg_n,
        dbg_logits=dbg_logits, dbg_radius=dbg_radius, dbg_fired=int(dbg_tau is not None),
        dbg_tau=0.0 if dbg_tau is None else float(dbg_tau))


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


PHILOX_IMPLS = ("portable", "avx2", "avx512", "dispatch")
PHILOX_MAX_LANES = 1024  # common.h WC_MAX_LANES: the lanes of the largest tile


def philox_lanes(ctr: torch.Tensor, key: tuple[int, int], *, rounds: int = 10,
                 impl: str = "dispatch") -> torch.Tensor | None:
    """Philox4x32 from C of n lanes with one key, through one implementation (``PHILOX_IMPLS``:
    the portable C, the AVX2 or AVX-512 path with their interleaved vectors, or the dispatcher
    the kernels call), for the tests that compare every path with the reference.
    ctr: int [n, 4] (values < 2^32, n <= ``PHILOX_MAX_LANES``); key: (k0, k1). Returns int64
    [n, 4], or None when this build or CPU lacks ``impl``."""
    c32 = ctr.to(torch.int64).reshape(-1, 4).to(torch.uint32).contiguous()
    n = c32.shape[0]
    if n > PHILOX_MAX_LANES or rounds not in (7, 10):
        raise ValueError(f"philox_lanes: n={n} lanes (at most {PHILOX_MAX_LANES}), "
                         f"rounds={rounds} (7 or 10)")
    out = torch.empty_like(c32)
    rc = _fns()[4](PHILOX_IMPLS.index(impl), c32.data_ptr(), int(key[0]), int(key[1]), n,
                   rounds, out.data_ptr())
    if rc and impl in ("avx2", "avx512"):  # the arguments are valid: the path is missing
        return None
    _check(rc, "philox lanes")
    return out.to(torch.int64)


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
    G, bits = group_and_bits(layer_kv)
    k0, k1 = seed_to_key(layer_kv.seed)
    out = torch.empty(s.shape[0], layer_kv.num_kv_heads, layer_kv.head_dim, dtype=torch.float32)
    keep: list = []
    sd = _side(layer_kv.storage(side), layer_kv.outlier_idx(side), keep)
    _check(_fns(extra_flags)[2](ctypes.byref(sd), layer_kv.epochs.data_ptr(),
                                positions_ptr(layer_kv), layer_kv.num_slots,
                                s.data_ptr(), s.shape[0], layer_kv.num_kv_heads, layer_kv.head_dim,
                                G, layer_kv.layer, side, bits, k0, k1, out.data_ptr(),
                                philox_rounds(layer_kv)), "gather")
    return out


@functools.lru_cache(maxsize=64)
def debug_threshold(tau: float) -> float:
    """A ``debug_tau`` that keeps every head the gate fires: at most tau and at most tau rounded
    to float32 (the certificates are f32; a head fires on ``cert > tau`` compared in either
    precision), so any such head's certificate is >= it. Cached: the gate asks once per call with
    its one tau."""
    import math

    t32 = float(torch.tensor(tau, dtype=torch.float32))
    return math.nextafter(min(tau, t32), -math.inf)
