"""The ``"witcert"`` attention implementation for transformers 5.x, registered explicitly.

Transformers looks attention up by ``config._attn_implementation`` in two registries:
``AttentionInterface`` (the function each attention layer calls after ``cache.update``)
and ``AttentionMaskInterface`` (the function ``create_causal_mask`` calls once per forward
to turn the 2D padding mask into whatever the attention function wants). ``register()``
adds ``"witcert"`` to both; nothing happens at import.

How the attention function finds the cache: Llama/Mistral/Qwen2 attention calls
``cache.update(k, v, layer_idx)`` and passes the returned key tensor straight to the
attention function. ``WitCertCache.update`` returns the new exact ``k, v`` and records
``(layer_idx, k)`` as a hand-off; the attention function accepts the hand-off only if
``module.layer_idx`` matches and ``key`` is that very tensor object, then lets the cache
do the attention (prefill: exact; decode: compressed pool with certificates; chunked
prefill: compressed prefix + exact chunk). Without a WitCert cache (e.g. a DynamicCache
or ``use_cache=False``) the function computes plain exact attention over what it got.

The mask function returns the 2D boolean padding mask ``[B, kv_len]`` (True = real
token) or ``None``: the cache needs to know which new tokens are padding (never stored,
never attended); causality is implied by token order.
"""

from __future__ import annotations

import contextvars
import weakref

import torch
import torch.nn.functional as F

ATTN_NAME = "witcert"

# The cache whose update() ran last in this context (weak: the context must not keep a
# finished cache's pool alive).
_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("witcert_active_cache", default=None)


def set_active_cache(cache) -> None:
    _ACTIVE.set(weakref.ref(cache))


def _active_cache():
    ref = _ACTIVE.get()
    return None if ref is None else ref()


def exact_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                    key_real: torch.Tensor | None, scaling: float) -> torch.Tensor:
    """Causal GQA attention over exact keys, padding excluded.

    query: [B, Hq, T, D]; key, value: [B, Hkv, N, D] with N >= T (the queries are the last T
    of the N positions); key_real: bool [B, N] (False = padding) or None.
    Returns [B, T, Hq, D] in the query dtype; rows of padding queries are 0.
    Non-finite key/value entries are replaced by 0, as the pool's decode does for a flagged
    token, so one bad activation cannot turn every later position into NaN.
    """
    B, Hq, T, D = query.shape
    N = key.shape[2]
    key = torch.where(torch.isfinite(key), key, torch.zeros((), dtype=key.dtype, device=key.device))
    value = torch.where(torch.isfinite(value), value,
                        torch.zeros((), dtype=value.dtype, device=value.device))
    q_pos = torch.arange(N - T, N, device=query.device)
    k_pos = torch.arange(N, device=query.device)
    allowed = (k_pos[None, :] <= q_pos[:, None])[None, None]  # [1, 1, T, N]
    q_real = None
    if key_real is not None:
        allowed = allowed & key_real[:, None, None, :]
        q_real = key_real[:, N - T:]
        # A padding query would attend to nothing (NaN): let it see itself, zero it after.
        allowed = allowed | (k_pos[None, :] == q_pos[:, None])[None, None]
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=scaling,
                                         enable_gqa=key.shape[1] != Hq)
    out = out.transpose(1, 2)
    if q_real is not None:
        out = out * q_real[:, :, None, None].to(out.dtype)
    return out


def witcert_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                              value: torch.Tensor, attention_mask, scaling: float | None = None,
                              dropout: float = 0.0, **kwargs):
    """``AttentionInterface`` entry: ``(attn_output [B, T, Hq, D], None)``.

    query: post-RoPE ``[B, Hq, T, D]``; key/value: what the cache's ``update`` returned
    ``[B, Hkv, T, D]``; attention_mask: the output of ``witcert_mask`` (bool ``[B, kv_len]``
    or None).
    """
    if dropout:
        raise ValueError("witcert attention is inference-only (dropout must be 0; call model.eval())")
    if attention_mask is not None and (not isinstance(attention_mask, torch.Tensor)
                                       or attention_mask.dim() != 2):
        raise ValueError("witcert attention expects the 2D padding mask produced by its own mask "
                         f"function, got {type(attention_mask).__name__} "
                         f"{getattr(attention_mask, 'shape', '')}; do not pass 4D masks")
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    cache = _active_cache()
    window = kwargs.get("sliding_window")
    if window is not None:  # only harmless if it never cuts anything (check_supported)
        seen = cache.get_seq_length() if cache is not None else 0
        if window < max(key.shape[2], seen + query.shape[2]):
            raise ValueError(f"witcert attention does not support sliding-window layers "
                             f"(sliding_window={window})")
    if cache is not None and cache.take_handoff(module.layer_idx, key):
        return cache.attend(module.layer_idx, query, key, value, attention_mask, scaling=scaling), None
    key_real = None if attention_mask is None else attention_mask[:, -key.shape[2]:]
    return exact_attention(query, key, value, key_real=key_real, scaling=scaling), None


def witcert_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0,
                 kv_offset: int = 0, mask_function=None, attention_mask: torch.Tensor | None = None,
                 **kwargs) -> torch.Tensor | None:
    """``AttentionMaskInterface`` entry: the 2D padding mask, bool ``[B, kv_length]``, or None.

    Columns are aligned on the right (the last ``q_length`` columns are the new tokens). A
    mask shorter than ``kv_length`` is padded on the left with True (tokens whose padding
    status the caller did not restate were real when they were stored).
    """
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2:
        raise ValueError(f"witcert expects a 2D padding mask, got shape {tuple(attention_mask.shape)}")
    mask = attention_mask.to(torch.bool)
    if mask.shape[1] < q_length:
        raise ValueError(f"attention_mask has {mask.shape[1]} columns, fewer than the "
                         f"{q_length} new tokens")
    if mask.shape[1] < kv_length:
        mask = F.pad(mask, (kv_length - mask.shape[1], 0), value=True)
    return mask[:, -kv_length:]


def register() -> None:
    """Register ``"witcert"`` in transformers' ``AttentionInterface`` and
    ``AttentionMaskInterface`` (idempotent). Then load a model with
    ``attn_implementation="witcert"`` or call ``model.set_attn_implementation("witcert")``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_NAME, witcert_attention_forward)
    AttentionMaskInterface.register(ATTN_NAME, witcert_mask)


def is_registered() -> bool:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    return (AttentionInterface._global_mapping.get(ATTN_NAME) is witcert_attention_forward
            and AttentionMaskInterface._global_mapping.get(ATTN_NAME) is witcert_mask)
