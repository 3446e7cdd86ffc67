"""ctypes launcher of ``write.c``: ``witcert.ref.pool.write_`` for dither8 pools in C
(outlier bypass included: ``outl`` is bitwise the reference too).

One C call per side encodes the new tokens (scales, dithered INT8 codes, witnesses) and
stores them at their slots, straight into the pool's storage tensors (which may be strided
views of vLLM's pages). Codes and scales are bitwise the reference; the witness is too
except, with probability ~2^-40 per witness, a one-ulp fp16 difference in the round-up of
a float64 sum taken in another order (both values bound the error; see write.c).
"""

from __future__ import annotations

import ctypes
import functools
from ctypes import c_int32, c_int64, c_uint32, c_void_p

import torch

from witcert import native
from witcert.native.decode import _check, _Side, _side
from witcert.native.support import group_and_bits, philox_rounds, positions_ptr, unsupported
from witcert.ref.philox import seed_to_key
from witcert.ref.pool import LayerKV
from witcert.ref.types import K_SIDE, V_SIDE

X_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


class _EncodeArgs(ctypes.Structure):
    """``wc_encode_args`` (field order = the C struct)."""

    _fields_ = [("x", c_void_p), ("slots", c_void_p), ("epochs", c_void_p),
                ("positions", c_void_p), ("dst", _Side),
                ("x_s0", c_int64), ("x_s1", c_int64), ("T", c_int64), ("num_slots", c_int64),
                ("key0", c_uint32), ("key1", c_uint32), ("Hkv", c_int32), ("D", c_int32),
                ("G", c_int32), ("layer", c_int32), ("side", c_int32), ("bits", c_int32),
                ("dtype", c_int32), ("rounds", c_int32)]


@functools.lru_cache(maxsize=None)
def _fn():
    enc = native.lib().wc_encode
    enc.argtypes, enc.restype = [ctypes.POINTER(_EncodeArgs)], c_int32
    return enc


def write_(layer_kv: LayerKV, k: torch.Tensor, v: torch.Tensor, *, slots: torch.Tensor) -> None:
    """Encode exact ``k``, ``v`` (f32 / f16 / bf16 [T, Hkv, D], CPU) into ``slots`` (int64 [T],
    distinct) at their current epochs. ``ValueError`` on a pool the C path does not support
    (``unsupported``) or a slot out of range or repeated (nothing written then)."""
    why = unsupported(layer_kv)
    if why:
        raise ValueError(f"witcert native write: {why}")
    T = slots.shape[0]
    shape = (T, layer_kv.num_kv_heads, layer_kv.head_dim)
    s = slots.to(torch.int64).contiguous()
    G, bits = group_and_bits(layer_kv)
    k0, k1 = seed_to_key(layer_kv.seed)
    keep: list = []
    for side, x in ((K_SIDE, k), (V_SIDE, v)):
        assert tuple(x.shape) == shape and x.dtype in X_DTYPES and x.device.type == "cpu", \
            f"k/v must be CPU f32/f16/bf16 {list(shape)}, got {x.dtype} {tuple(x.shape)}"
        if x.stride(-1) != 1:
            x = x.contiguous()
        args = _EncodeArgs(
            x=x.data_ptr(), slots=s.data_ptr(), epochs=layer_kv.epochs.data_ptr(),
            positions=positions_ptr(layer_kv),
            dst=_side(layer_kv.storage(side), layer_kv.outlier_idx(side), keep), x_s0=x.stride(0), x_s1=x.stride(1), T=T,
            num_slots=layer_kv.num_slots, key0=k0, key1=k1, Hkv=shape[1], D=shape[2], G=G,
            layer=layer_kv.layer, side=side, bits=bits, dtype=X_DTYPES[x.dtype],
            rounds=philox_rounds(layer_kv))
        _check(_fn()(ctypes.byref(args)), "write (slots must be distinct and in range)")

