"""Backend dispatch: Triton kernels for CUDA tensors when triton imports, else the reference.

``WITCERT_BACKEND`` (read here and nowhere else): ``ref`` forces the pure-torch reference,
``triton`` forces the kernels (CPU tensors then need ``TRITON_INTERPRET=1``), unset or
``auto`` picks Triton for CUDA tensors of a ``dither8`` pool. Both backends honour the
same contract (tests/test_kernels_*.py), so callers never branch on the backend.
"""

from __future__ import annotations

import functools
import os

import torch

BACKENDS = ("auto", "ref", "triton")


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def backend_for(t: torch.Tensor, layer_kv) -> str:
    """``"triton"`` or ``"ref"`` for an op on tensor ``t`` over ``layer_kv``."""
    choice = os.environ.get("WITCERT_BACKEND", "auto").strip().lower() or "auto"
    if choice not in BACKENDS:
        raise ValueError(f"WITCERT_BACKEND={choice!r} must be one of {BACKENDS}")
    if choice == "ref":
        return "ref"
    if choice == "triton":
        if not triton_available():
            raise RuntimeError("WITCERT_BACKEND=triton but triton does not import")
        return "triton"
    ok = t.is_cuda and layer_kv.quant.method == "dither8" and triton_available()
    return "triton" if ok else "ref"


def write_kv_(layer_kv, k: torch.Tensor, v: torch.Tensor, *, slots: torch.Tensor) -> None:
    """Store T new tokens (k, v float [T, Hkv, D]) in ``slots`` (int64 [T]) of ``layer_kv``."""
    if backend_for(k, layer_kv) == "triton":
        from witcert.kernels.write import write_kv_ as impl
    else:
        from witcert.ref.pool import write_ as impl
    impl(layer_kv, k, v, slots=slots)


def decode_attention(q: torch.Tensor, layer_kv, block_table: torch.Tensor, seq_lens: torch.Tensor, *,
                     page_size: int, sm_scale: float, cert, delta_loc, num_splits: int | None = None,
                     return_radius: bool = False):
    """One decode step (see ``witcert.ref.attention.decode_attention``) -> ``DecodeOut``.

    num_splits None: the kernel plans splits per request from its own length
    (``witcert.kernels.decode.plan_splits``); the reference then uses one split.
    """
    kw = dict(page_size=page_size, sm_scale=sm_scale, cert=cert, delta_loc=delta_loc,
              return_radius=return_radius)
    if backend_for(q, layer_kv) == "triton":
        from witcert.kernels.decode import decode_attention as impl
        return impl(q, layer_kv, block_table, seq_lens, num_splits=num_splits, **kw)
    from witcert.ref.attention import decode_attention as impl
    return impl(q, layer_kv, block_table, seq_lens, num_splits=num_splits or 1, **kw)


def extend_attention(q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, layer_kv,
                     prefix_slots: torch.Tensor, *, sm_scale: float, causal: bool = True) -> torch.Tensor:
    """Prefill/extend of one sequence over its compressed prefix -> f32 [T, Hq, D]."""
    if backend_for(q, layer_kv) == "triton":
        from witcert.kernels.extend import extend_attention as impl
    else:
        from witcert.ref.attention import extend_attention as impl
    return impl(q, k_new, v_new, layer_kv, prefix_slots, sm_scale=sm_scale, causal=causal)
