"""ctypes launcher of ``repair.c``: the gate's repair of every fired row of one gated decode call
in one C call (the steps of ``witcert.runtime.repair_rows.RowCtx.repair_row``, which specifies
it and serves when this does not; tests/test_repair_rows_native.py checks the two on shared
cases)."""

from __future__ import annotations

import ctypes
import functools
from ctypes import c_double, c_int32, c_int64, c_void_p

import torch

from witcert import native
from witcert.native.decode import _DecodeArgs, _check, _exact_fields, decode_args, native_model


class _RepairArgs(ctypes.Structure):
    """``wc_repair_args`` (field order = the C struct)."""

    _fields_ = [("nrows", c_int32), ("rows", c_void_p), ("fired", c_void_p), ("f_out", c_void_p),
                ("f_cert", c_void_p), ("f_logits", c_void_p), ("f_radius", c_void_p),
                ("f_n", c_int64), ("tau", c_double), ("slack", c_double),
                ("block_tokens", c_int64), ("whole", c_int32), ("xflag", c_void_p),
                ("xepoch", c_void_p), ("have", c_void_p), ("rel_s", c_double),
                ("rel_l", c_double), ("abs_err", c_double), ("softmax", c_double),
                ("out", c_void_p), ("cert", c_void_p), ("row_stats", c_void_p)]


@functools.lru_cache(maxsize=None)
def _fn():
    f = native.lib().wc_repair_rows
    f.argtypes = [ctypes.POINTER(_DecodeArgs), ctypes.POINTER(_RepairArgs)]
    f.restype = c_int32
    return f


def unsupported(copy, q: torch.Tensor, *, mode: str) -> str | None:
    """Why ``repair_rows`` cannot serve a gate over ``copy`` (``ExactCopy``) with queries ``q``
    [B, Hq, D] and policy ``mode`` (None: it can)."""
    if mode not in ("block", "head"):
        return f"policy {mode!r}"
    if copy.rounds:
        return "a rounding copy (its witness is computed in torch)"
    if q.shape[-1] % 4 or q.shape[1] > 1024:
        return "head_dim not a multiple of 4 or more than 1024 query heads"
    flags = (copy.exact, copy.exact_epoch, copy.epochs)
    if any(t.device.type != "cpu" or not t.is_contiguous() for t in flags) or \
            copy.exact_epoch.dtype != torch.int64 or (copy.have is not None and (
                copy.have.device.type != "cpu" or not copy.have.is_contiguous())):
        return "the copy's flags are not contiguous CPU tensors"
    return None


def repair_rows(q32: torch.Tensor, layer_kv, block_table: torch.Tensor, seq_lens: torch.Tensor, *,
                page_size: int, sm_scale: float, radius: str, delta_loc: torch.Tensor | None,
                num_threads: int, copy, rows: list[int], fired: torch.Tensor, first=None,
                terms: dict | None = None, tau: float, block_tokens: int, whole: bool,
                slack: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Repair the fired heads of ``rows`` (in this order) in one C call, marking ``copy``.

    q32: f32 [B, Hq, D]; block_table int32 [B, pages]; seq_lens int32 [B]; delta_loc f64 [B]
    (prob / min radius) or None; fired: bool [B, Hq] the heads to repair (finite query heads);
    first, terms: the batch's first pass (a DecodeOut) and its ``logits`` / ``radius``, or
    None (every row decoded again). Returns (out f32 [B, Hq, D], cert f32 [B, Hq]: the rows'
    outputs after the repair, the other rows unset; stats int64 [len(rows), 3]: entries made
    exact, fallbacks, (block, KV head) pairs with a new entry). ``ValueError`` on a C error."""
    B, Hq, D = q32.shape
    q32 = q32.contiguous()
    bt = block_table if block_table.shape[1] <= 1 or block_table.stride(1) == 1 \
        else block_table.contiguous()
    sl = seq_lens.contiguous()
    dl = delta_loc.to(torch.float64).contiguous() if radius != "det" else None
    out = torch.empty(B, Hq, D, dtype=torch.float32)
    cert = torch.empty(B, Hq, dtype=torch.float32)
    keep: list = []
    a = decode_args(q32, layer_kv, bt, sl, page_size=page_size, sm_scale=sm_scale, radius=radius,
                    delta_ptr=None if dl is None else dl.data_ptr(), num_threads=num_threads,
                    exact_fields=_exact_fields(copy, layer_kv), out=out, cert=cert, lse=None,
                    vbound=None, keep=keep)  # (C decodes each row into its own buffers)
    rows_t = torch.tensor(rows, dtype=torch.int32)
    fired8 = fired.to(torch.uint8).contiguous()
    stats = torch.zeros(len(rows), 3, dtype=torch.int64)
    f = {}
    if first is not None and terms and "radius" in terms:
        fo, fc = first.out.contiguous(), first.cert.contiguous()
        fl, fr = terms["logits"].contiguous(), terms["radius"].contiguous()
        keep += [fo, fc, fl, fr]
        f = dict(f_out=fo.data_ptr(), f_cert=fc.data_ptr(), f_logits=fl.data_ptr(),
                 f_radius=fr.data_ptr(), f_n=fl.shape[-1])
    m = native_model(D)
    r = _RepairArgs(nrows=len(rows), rows=rows_t.data_ptr(), fired=fired8.data_ptr(), **f,
                    tau=float(tau), slack=float(slack), block_tokens=int(block_tokens),
                    whole=int(bool(whole)), xflag=copy.exact.data_ptr(),
                    xepoch=copy.exact_epoch.data_ptr(),
                    have=None if copy.have is None else copy.have.data_ptr(), rel_s=m.rel_s,
                    rel_l=m.rel_l, abs_err=m.abs_err, softmax=m.softmax, out=out.data_ptr(),
                    cert=cert.data_ptr(), row_stats=stats.data_ptr())
    _check(_fn()(ctypes.byref(a), ctypes.byref(r)), "repair")
    return out, cert, stats
