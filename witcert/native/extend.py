"""Thin ctypes launcher of ``extend.c``: the extend (chunked prefill) of a batch of
sequences over the compressed pool, with a certificate per (new token, query head).

``extend_attention`` is ``witcert.ref.extend.extend_attention_cert`` for B sequences in one C
call: the new tokens of sequence b are rows ``q_start[b] .. q_start[b] + q_len[b] - 1`` of
``q`` / ``k_new`` / ``v_new`` (and of the outputs), its ``prefix_len[b]`` prefix tokens sit in
the pool at the slots of its block-table row. Dither and dequantized K/V are bitwise the
reference; the logits' dots and the value pass in fp32, softmax and certificate in float64,
with the rounding model ``witcert.ref.arith.native_f32_model`` (``arith="f64"``: float64
throughout, ``native_model``; docs/PROOFS.md 5.3).
``extend_one`` serves ``witcert.runtime.dispatch.extend_attention`` (one sequence, a slot list).
Only ``dither8`` without outliers on CPU tensors (``unsupported`` says why not otherwise).
"""

from __future__ import annotations

import ctypes
import functools
from ctypes import c_double, c_int32, c_int64, c_uint32, c_void_p

import torch

from witcert import native, settings
from witcert.native import support
from witcert.native.decode import ERRORS, RADIUS_CODES, _Side, _side, philox_rounds
from witcert.ref.arith import native_bf16_model, native_f32_model, native_model
from witcert.ref.philox import seed_to_key
from witcert.ref.pool import LayerKV
from witcert.ref.validate import check_attention_dtypes, check_delta_loc, check_sm_scale

__all__ = ["extend_attention", "extend_one", "unsupported"]


def unsupported(layer_kv: LayerKV, q: torch.Tensor | None = None) -> str | None:
    """Why the native extend cannot serve this pool (and query), or None if it can: the
    decode's conditions (``witcert.native.support.unsupported``) and no outlier bypass."""
    why = support.unsupported(layer_kv, q)
    if why is None and (layer_kv.k_outlier_idx is not None or layer_kv.v_outlier_idx is not None):
        why = "outlier bypass (the native extend serves dither8 without outliers)"
    return why


class _ExtendArgs(ctypes.Structure):
    """``wc_extend_args`` (field order = the C struct)."""

    _fields_ = [("q", c_void_p), ("k_new", c_void_p), ("v_new", c_void_p), ("k", _Side),
                ("v", _Side), ("epochs", c_void_p), ("positions", c_void_p),
                ("block_table", c_void_p),
                ("q_start", c_void_p), ("q_len", c_void_p), ("prefix_len", c_void_p),
                ("delta_loc", c_void_p), ("out", c_void_p), ("lse", c_void_p),
                ("cert", c_void_p), ("num_slots", c_int64), ("bt_s0", c_int64),
                ("pages", c_int64), ("rows", c_int64), ("sm_scale", c_double),
                ("key0", c_uint32), ("key1", c_uint32), ("B", c_int32), ("Hq", c_int32),
                ("Hkv", c_int32), ("D", c_int32), ("G", c_int32), ("page_size", c_int32),
                ("layer", c_int32), ("bits", c_int32), ("radius", c_int32),
                ("num_threads", c_int32), ("causal", c_int32), ("rounds", c_int32),
                ("pool_read", c_int32),
                ("arith_rel_s", c_double), ("arith_abs", c_double), ("softmax_slack", c_double),
                ("tail_gap", c_double), ("sum_rel", c_double), ("dbg_n", c_int64),
                ("dbg_radius", c_void_p), ("dbg_logits", c_void_p), ("arith32", c_int32),
                ("bf16_dots", c_int32), ("arith_rel_s_bf16", c_double)]


@functools.lru_cache(maxsize=None)
def _fn(extra_flags: tuple[str, ...] = ()):
    f = native.lib(extra_flags=extra_flags).wc_extend
    f.argtypes, f.restype = [ctypes.POINTER(_ExtendArgs)], c_int32
    return f


def probe(which: str, x: torch.Tensor, *, extra_flags: tuple[str, ...] = ()) -> torch.Tensor:
    """The extend's own ``exp`` (which="exp", x in [-700, 0]) or its upper bound of ``expm1``
    (which="expm1_up", x in [0, 8): the softmax's fast path), elementwise from C, f64 -> f64.
    For the tests.
    "exp_n": the softmax's interleaved exp (16 values a step); "exp_wide": its AVX-512
    instantiation (``ValueError`` where the build or the CPU has none)."""
    f = native.lib(extra_flags=extra_flags).wc_extend_probe
    f.argtypes, f.restype = [c_int32, c_void_p, c_void_p, c_int64], c_int32
    xs = x.to(torch.float64).contiguous()
    out = torch.empty_like(xs)
    rc = f({"exp": 0, "expm1_up": 1, "exp_n": 2, "exp_wide": 3}[which], xs.data_ptr(),
           out.data_ptr(), xs.numel())
    if rc:
        raise ValueError(f"witcert native probe: {ERRORS.get(rc, f'error {rc}')}")
    return out


def probe_bf16_values(z: torch.Tensor, last: torch.Tensor, v: torch.Tensor, acc: torch.Tensor,
                      *, extra_flags: tuple[str, ...] = ()) -> torch.Tensor:
    """The bf16 value pass of the exact new tokens (``accumulatebf_rows``) alone, for the tests:
    returns ``acc`` (f64 [rows, D], a copy) plus the pass over the weights z (f64 [rows, n];
    row r reads its first ``last[r]`` of them) and the values v (f32 [ceil(n / 16) * 16, D],
    bf16 numbers). ``ValueError`` where the build or the CPU has no bf16 route, or for bad
    input."""
    f = native.lib(extra_flags=extra_flags).wc_extend_probe_bfv
    f.argtypes = [c_void_p, c_int64, c_void_p, c_void_p, c_int32, c_int32, c_int32, c_void_p]
    f.restype = c_int32
    zz = z.to(torch.float64).contiguous()
    ll = last.to(torch.int32).contiguous()
    vv = v.to(torch.float32).contiguous()
    out = acc.to(torch.float64).clone().contiguous()
    rows, n = zz.shape
    if tuple(ll.shape) != (rows,) or tuple(out.shape) != (rows, vv.shape[1]) or \
            vv.shape[0] != -(-n // 16) * 16:
        raise ValueError("witcert native probe: z [rows, n], last [rows], v [ceil(n/16)*16, D], "
                         "acc [rows, D]")
    rc = f(zz.data_ptr(), n, ll.data_ptr(), vv.data_ptr(), rows, n, vv.shape[1], out.data_ptr())
    if rc:
        raise ValueError(f"witcert native probe: {ERRORS.get(rc, f'error {rc}')}")
    return out


def bf16_route(*, extra_flags: tuple[str, ...] = ()) -> bool:
    """Whether this build on this CPU can take the bf16-pair dots (``extend_attention``'s
    ``bf16_dots``; a call also needs the fp32 arithmetic, ``sm_scale <= 2^16`` and bf16
    operands). For the tests and benchmarks."""
    f = native.lib(extra_flags=extra_flags).wc_extend_bf16_route
    f.argtypes, f.restype = [], c_int32
    return bool(f())


def _i32(x, name: str, B: int) -> torch.Tensor:
    t = torch.as_tensor(x).to(device="cpu", dtype=torch.int32).contiguous()
    if tuple(t.shape) != (B,):
        raise ValueError(f"{name}: need int [B={B}], got {tuple(t.shape)}")
    return t


def extend_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                     layer_kv: LayerKV, *, q_start, q_len, prefix_len,
                     block_table: torch.Tensor, page_size: int, sm_scale: float, radius: str,
                     delta_loc: torch.Tensor | None, with_cert: bool = True, causal: bool = True,
                     num_threads: int = 1, debug: dict | None = None, pool_read: bool = False,
                     arith: str | None = None, bf16_dots: bool | None = None,
                     _extra_flags: tuple[str, ...] = ()):
    """Extend of B sequences in one C call -> (out f32 [rows, Hq, D], lse f32 [rows, Hq],
    cert f32 [rows, Hq] | None). Rows of no sequence are left uninitialised.

    q: float [rows, Hq, D]; k_new, v_new: float [rows, Hkv, D] (CPU, any float dtype: the
    new tokens' exact K/V; a row holding a non-finite value reads 0 and gets radius +inf).
    q_start, q_len, prefix_len: int [B] (rows ``q_start[b] ..`` are sequence b's new tokens,
    ``prefix_len[b]`` its tokens already in the pool). block_table: int32 [B, pages] (unit
    last stride; prefix token t at slot ``block_table[b, t // P] * P + t % P``).
    delta_loc: f64 [rows], per new token, in (0, 1) (read for the prob / min radius only).
    radius: ``det`` | ``prob`` | ``min``. with_cert=False skips the radii (cert None).
    causal: new token i sees new tokens j <= i (else all of them). num_threads: pthreads over
    (sequence, KV head, chunk of new tokens), same bits for any count. Call ``unsupported``
    first. debug: a dict that receives ``logits`` f64 [rows, Hq, Nmax] (keys: the prefix, then
    the new tokens; the logits the C code used) and with the certificate ``radius`` f32
    (whole radii, rounded up); entries a row does not attend stay NaN.
    pool_read: the pool-read extend (``extend_attention_cert(new_from_pool=True)``): the new
    tokens are already in the pool, ``prefix_len[b]`` counts them (its last ``q_len[b]``
    tokens), new token j sees pool tokens ``t < prefix_len[b] - q_len[b] + j + 1``, all read
    compressed; k_new / v_new may be None (not read); needs causal. debug ``Nmax`` is then
    the largest ``prefix_len``.
    arith: ``f32``: the logits' dots and the value pass in fp32, the radii with
    ``witcert.ref.arith.native_f32_model`` (docs/PROOFS.md 5.3: a larger arithmetic slack,
    ``gamma_{D/8+5}(2^-24)`` ~1e-6 relative to ``sm * S``, for about half the work of the
    dots); ``f64``: float64 throughout with ``native_model``; None (the default):
    ``WITCERT_NATIVE_EXTEND_ARITH`` (``witcert.settings.native_extend_arith``, default f32).
    bf16_dots (f32 only): the exact new tokens' dots may run as bf16 pairs on AVX512-BF16
    (``witcert.ref.arith.native_bf16_model``: ``gamma_{D/4+3}(2^-24)`` instead of
    ``gamma_{D/8+5}``) where the CPU has it, ``sm_scale <= 2^16`` and the queries of a work item
    and the keys of a 16-token tile are all bf16 numbers without subnormals (bf16 model
    activations); elsewhere the fp32 dots. Such an item's value pass over the exact new tokens
    then runs as bf16 weights times bf16 values too, where every value it reads is a bf16
    number (the output's float tier of bf16 weights, docs/PROOFS.md 5.3; the certificate and
    lse unchanged). None (the default): ``WITCERT_NATIVE_EXTEND_BF16``
    (``witcert.settings.native_extend_bf16``, default on).
    """
    if pool_read:
        if not causal:
            raise ValueError("pool_read: the pool-read extend is causal")
        if k_new is None or v_new is None:  # never read: placeholders of the checked shape
            k_new = v_new = torch.zeros(q.shape[0], layer_kv.num_kv_heads, q.shape[-1])
    check_sm_scale(sm_scale)
    check_attention_dtypes(q=q, k_new=k_new, v_new=v_new)
    if q.dim() != 3 or k_new.dim() != 3 or k_new.shape != v_new.shape \
            or k_new.shape[0] != q.shape[0]:
        raise ValueError(f"q [rows, Hq, D] {tuple(q.shape)}, k_new/v_new [rows, Hkv, D] "
                         f"{tuple(k_new.shape)}/{tuple(v_new.shape)} disagree")
    rows, Hq, D = q.shape
    Hkv = layer_kv.num_kv_heads
    if D != layer_kv.head_dim or tuple(k_new.shape[1:]) != (Hkv, D) or Hq % Hkv:
        raise ValueError("k_new must be [rows, Hkv, D] matching the pool; Hq % Hkv must be 0")
    B = block_table.shape[0] if block_table.dim() == 2 else -1
    if block_table.dtype != torch.int32 or B < 0 or (block_table.shape[1] > 1
                                                     and block_table.stride(1) != 1):
        raise ValueError("block_table: int32 [B, pages] with unit last stride")
    qs, ql, pl = _i32(q_start, "q_start", B), _i32(q_len, "q_len", B), _i32(prefix_len, "prefix_len", B)
    dl_ptr = None
    if with_cert and radius != "det":
        if delta_loc is None:
            raise ValueError(f"delta_loc: radius {radius!r} needs a budget per new token, f64 [rows]")
        dl = torch.as_tensor(delta_loc, dtype=torch.float64).cpu().contiguous()
        if tuple(dl.shape) != (rows,):
            raise ValueError(f"delta_loc: need f64 [rows={rows}], got {tuple(dl.shape)}")
        check_delta_loc(dl, batch=rows)
        dl_ptr = dl.data_ptr()
    q32 = q.to(device="cpu", dtype=torch.float32).contiguous()
    k32 = k_new.to(device="cpu", dtype=torch.float32).contiguous()
    v32 = v_new.to(device="cpu", dtype=torch.float32).contiguous()
    out = torch.empty(rows, Hq, D, dtype=torch.float32)
    lse = torch.empty(rows, Hq, dtype=torch.float32)
    cert = torch.empty(rows, Hq, dtype=torch.float32) if with_cert else None
    G, bits = support.group_and_bits(layer_kv)
    k0, k1 = seed_to_key(layer_kv.seed)
    if arith is None:
        arith = settings.native_extend_arith()
    if arith not in settings.NATIVE_EXTEND_ARITHS:
        raise ValueError(f"arith: {arith!r} must be one of {settings.NATIVE_EXTEND_ARITHS}")
    model = (native_f32_model if arith == "f32" else native_model)(D)
    bf16 = settings.native_extend_bf16() if bf16_dots is None else bool(bf16_dots)
    dbg = {}
    if debug is not None:
        nmax = max([1] + [int(a) + (0 if pool_read else int(b))
                          for a, b in zip(pl.tolist(), ql.tolist())])
        dbg["dbg_n"] = nmax
        debug["logits"] = torch.full((rows, Hq, nmax), float("nan"), dtype=torch.float64)
        dbg["dbg_logits"] = debug["logits"].data_ptr()
        if with_cert:
            debug["radius"] = torch.full((rows, Hq, nmax), float("nan"), dtype=torch.float32)
            dbg["dbg_radius"] = debug["radius"].data_ptr()
    args = _ExtendArgs(
        q=q32.data_ptr(), k_new=k32.data_ptr(), v_new=v32.data_ptr(), k=_side(layer_kv.k),
        v=_side(layer_kv.v), epochs=layer_kv.epochs.data_ptr(),
        positions=support.positions_ptr(layer_kv), block_table=block_table.data_ptr(),
        q_start=qs.data_ptr(), q_len=ql.data_ptr(), prefix_len=pl.data_ptr(), delta_loc=dl_ptr,
        out=out.data_ptr(), lse=lse.data_ptr(), cert=None if cert is None else cert.data_ptr(),
        num_slots=layer_kv.num_slots, bt_s0=block_table.stride(0),
        pages=block_table.shape[1], rows=rows, sm_scale=float(sm_scale), key0=k0, key1=k1, B=B,
        Hq=Hq, Hkv=Hkv, D=D, G=G, page_size=page_size, layer=layer_kv.layer, bits=bits,
        radius=RADIUS_CODES[radius if with_cert else "det"], num_threads=num_threads,
        causal=int(bool(causal)), rounds=philox_rounds(layer_kv), pool_read=int(bool(pool_read)),
        arith_rel_s=model.rel_s,
        arith_abs=model.abs_err, softmax_slack=model.softmax, tail_gap=model.tail_gap,
        sum_rel=model.sum_rel, arith32=int(arith == "f32"),
        bf16_dots=int(arith == "f32" and bf16),
        # at D = 8 the bf16 count (5 roundings) is below the fp32 one (6): the C code wants the
        # larger of the two for rows that mix routes
        arith_rel_s_bf16=max(native_bf16_model(D).rel_s, model.rel_s), **dbg)
    rc = _fn(tuple(_extra_flags))(ctypes.byref(args))
    if rc:
        raise ValueError(f"witcert native extend: {ERRORS.get(rc, f'error {rc}')}")
    return out, lse, cert


def extend_one(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, layer_kv: LayerKV,
               prefix_slots: torch.Tensor, *, sm_scale: float, cert, delta_loc, causal: bool = True,
               num_threads: int = 1, new_from_pool: bool = False, arith: str | None = None,
               bf16_dots: bool | None = None, _extra_flags: tuple[str, ...] = ()):
    """``witcert.ref.extend.extend_attention_cert`` of one sequence on the C path ->
    ``ExtendOut``, or None when the C code does not serve this call (the caller then runs
    the reference). prefix_slots: int [Np] (a block table of page size 1); delta_loc: a
    float or f64 [T] (per new token). new_from_pool: the pool-read extend (prefix_slots
    then holds the T new tokens at its end; k_new / v_new unused). arith, bf16_dots,
    _extra_flags (a build for the tests and benchmarks): as ``extend_attention``."""
    from witcert.ref.extend import ExtendOut

    if q.device.type != "cpu" or unsupported(layer_kv, q) is not None or q.dim() != 3 \
            or prefix_slots.device.type != "cpu" or prefix_slots.dim() != 1:
        return None
    if int(prefix_slots.numel()) and (int(prefix_slots.min()) < 0
                                      or int(prefix_slots.max()) >= layer_kv.num_slots):
        return None  # the reference reports the bad slot
    T = q.shape[0]
    dl = None
    if cert.enabled and cert.radius != "det":
        check_delta_loc(delta_loc, batch=T)
        dl = torch.as_tensor(delta_loc, dtype=torch.float64).cpu().expand(T).contiguous()
    bt = prefix_slots.to(torch.int32).reshape(1, -1).contiguous()
    out, lse, c = extend_attention(
        q, k_new, v_new, layer_kv, q_start=[0], q_len=[T], prefix_len=[bt.shape[1]],
        block_table=bt, page_size=1, sm_scale=sm_scale, radius=cert.radius, delta_loc=dl,
        with_cert=cert.enabled, causal=causal, num_threads=num_threads, pool_read=new_from_pool,
        arith=arith, bf16_dots=bf16_dots, _extra_flags=_extra_flags)
    return ExtendOut(out=out, lse=lse, cert=c, radius_kind=cert.radius if cert.enabled else "none")
