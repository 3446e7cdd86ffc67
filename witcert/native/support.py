"""What the native C path can serve: pool, query and exact-overlay checks (no C calls).

``unsupported`` (pool and query), ``unsupported_shape`` (head geometry) and
``exact_unsupported`` (an exact overlay, ``witcert.runtime.exact.ExactCopy``) return a one-line
reason or None; ``witcert.runtime.dispatch`` and the engine plugins fall back to the torch
reference when there is a reason. The answers for a pool and an overlay are cached on the
object while it holds the same tensors, since a decode step asks several times per layer.
``outlier_idx32`` gives the int32 copy of a side's bypassed channels that C reads.
"""

from __future__ import annotations

import torch

from witcert.ref.pool import LayerKV

MAX_HEAD_DIM, MAX_GROUPS, MAX_GQA = 256, 32, 16


EXACT_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def exact_unsupported(exact, layer_kv: LayerKV) -> str | None:
    """Why the native decode cannot read this exact overlay, or None if it can.

    exact: an object with ``k``, ``v`` (f32 / f16 / bf16 [num_slots, Hkv, D], contiguous,
    same dtype), ``exact`` (bool or uint8 [num_slots, Hkv]), ``exact_epoch`` (int64
    [num_slots, Hkv]) and ``epochs`` (int64 [num_slots]), all contiguous CPU tensors, and
    optionally ``witness_constants()`` (the rows' rounding witness, ``witcert.runtime.exact.ExactCopy``)."""
    S, H, D = layer_kv.num_slots, layer_kv.num_kv_heads, layer_kv.head_dim
    try:
        k, v, flag, xep, ep = exact.k, exact.v, exact.exact, exact.exact_epoch, exact.epochs
    except AttributeError as e:
        return f"exact overlay lacks a field ({e})"
    # cached on the overlay object while it holds the same tensors (asked once per layer
    # and step); the cache keeps them alive, so their ids cannot be reused
    key = (k, v, flag, xep, ep, S, H, D)
    ids = tuple(map(id, key[:5])) + key[5:]
    hit = getattr(exact, "__dict__", {}).get(_EXACT_ATTR)
    if hit is not None and hit[1] == ids:
        return hit[2]
    why = _exact_check(k, v, flag, xep, ep, S, H, D)
    if hasattr(exact, "__dict__"):
        exact.__dict__[_EXACT_ATTR] = (key, ids, why)
    return why


_EXACT_ATTR = "_witcert_native_exact_check"


def _exact_check(k, v, flag, xep, ep, S, H, D) -> str | None:
    want = (("k", k, tuple(EXACT_DTYPES), (S, H, D)), ("v", v, (k.dtype,), (S, H, D)),
            ("exact", flag, (torch.bool, torch.uint8), (S, H)),
            ("exact_epoch", xep, (torch.int64,), (S, H)), ("epochs", ep, (torch.int64,), (S,)))
    for name, t, dts, shape in want:
        if not isinstance(t, torch.Tensor) or t.dtype not in dts or t.device.type != "cpu" \
                or tuple(t.shape) != shape or not t.is_contiguous():
            got = (f"{t.dtype} {list(t.shape)} on {t.device}" if isinstance(t, torch.Tensor)
                   else type(t).__name__)
            return (f"exact overlay field {name!r}: need a contiguous CPU tensor {list(shape)} of "
                    f"{' / '.join(str(d) for d in dts)}, got {got}")
    return None


# the attribute of an outlier_idx tensor that caches (its version, int32 copy for C, why not)
_OIDX_ATTR = "_witcert_native_oidx"


def outlier_idx32(idx: torch.Tensor, *, num_kv_heads: int, head_dim: int) -> tuple:
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


def philox_rounds(layer_kv: LayerKV) -> int:
    """Philox rounds of the pool's dither (``QuantConfig.philox_rounds``: 10 or 7)."""
    return int(getattr(layer_kv.quant, "philox_rounds", 10))


def group_and_bits(layer_kv: LayerKV) -> tuple[int, int]:
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
        why = unsupported_shape(head_dim=layer_kv.head_dim, group_size=group_and_bits(layer_kv)[0],
                                num_q_heads=q.shape[1], num_kv_heads=layer_kv.num_kv_heads)
        if why:
            return why
    idx = (layer_kv.k_outlier_idx, layer_kv.v_outlier_idx)
    key = (layer_kv.compressor, layer_kv.epochs, layer_kv.positions, *layer_kv.k.values(),
           *layer_kv.v.values(), *idx, *(None if i is None else i._version for i in idx))
    ids = tuple(map(id, key))  # the cache holds the objects: their ids cannot be reused
    hit = layer_kv.__dict__.get(_POOL_ATTR)
    if hit is not None and hit[1] == ids:
        return hit[2]
    why = _unsupported_pool(layer_kv)
    layer_kv.__dict__[_POOL_ATTR] = (key, ids, why)
    return why


def _unsupported_pool(layer_kv: LayerKV) -> str | None:
    comp = layer_kv.compressor
    if comp.name != "dither8":
        return f"method {comp.name!r} (native: dither8 only)"
    m2 = 2 * getattr(comp, "outliers", 0)
    G, _ = group_and_bits(layer_kv)
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
            why = outlier_idx32(idx, num_kv_heads=H, head_dim=D)[1]
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
    pos = layer_kv.positions
    if pos is not None and (pos.dtype != torch.int64 or pos.device.type != "cpu"
                            or tuple(pos.shape) != (S,) or not pos.is_contiguous()):
        return f"positions are not a contiguous CPU int64 [{S}] tensor"
    return None


def positions_ptr(layer_kv: LayerKV) -> int | None:
    """The C pointer of the pool's positions (int64 [num_slots]; the position-keyed dither,
    docs/MATH.md §6), or None (NULL: the slot keys the dither). C reads positions[slot] as
    the Philox counter's word 0 and refuses one outside [0, 2^32) (WC_ERR_POS, a ValueError
    from the launchers; ``witcert.runtime.slots.SlotAllocator`` never stores one)."""
    pos = layer_kv.positions
    return None if pos is None else pos.data_ptr()
