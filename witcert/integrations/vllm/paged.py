"""witcert's packed KV inside vLLM's paged cache: the page record and the slot views.

vLLM gives each attention layer one tensor ``[N, Hkv, P, C]`` (logical block, KV head,
token in block, content) whose content bytes the backend chooses through
``AttentionBackend.customize_spec``. witcert stores, per (slot, KV head), one record of
``C`` bytes: the K fields then the V fields of ``storage_spec`` (dither8: int8 codes [D],
fp16 scales [D/G], fp16 witnesses [D/G]), so ``C = 2 * bytes_per_token_head(D)`` and vLLM's
block accounting follows witcert's byte account exactly.

With the ``LBNHC`` layout (which the backend requests) a block is physically
``[P, Hkv, C]``, so ``slot = block * P + token`` is a single stride and every field is a
strided ``[num_slots, Hkv, n]`` view of the page tensor: exactly the pool layout of
``witcert.ref.pool.LayerKV`` (DESIGN "Pool layout"). Writes and reads then go through the
reference ``pool.write_`` / ``pool.gather``, the dither keyed by vLLM's slot id and a
per-slot epoch that is bumped on every write (a reused slot never reuses a dither).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from witcert.config import QuantConfig
from witcert.ref.compressors import get_compressor
from witcert.ref.pool import LayerKV
from witcert.ref.types import K_SIDE, V_SIDE


@dataclass(frozen=True)
class Field:
    side: int
    name: str
    offset: int  # bytes into the record
    numel: int
    dtype: torch.dtype


@dataclass(frozen=True)
class RecordLayout:
    """Byte layout of one (slot, KV head) record; ``size`` is vLLM's ``state_content_bytes``."""

    fields: tuple[Field, ...]
    size: int

    @staticmethod
    def build(quant: QuantConfig, head_dim: int) -> "RecordLayout":
        comp = get_compressor(quant)
        if comp.granularity != "token":
            raise ValueError(f"{quant.method!r} is block-granular; vLLM pages need a token method")
        spec = comp.storage_spec(1, head_dim)
        fields, off = [], 0
        for side in (K_SIDE, V_SIDE):
            for name, (tail, dtype) in spec.items():
                if len(tail) != 1:
                    raise ValueError(f"field {name!r}: tail shape {tail} must be 1-D")
                size = dtype.itemsize
                off = -(-off // size) * size  # natural alignment of the field
                fields.append(Field(side, name, off, tail[0], dtype))
                off += tail[0] * size
        size = -(-off // 8) * 8
        expected = 2 * comp.bytes_per_token_head(head_dim)
        if size != expected:
            # Padding would make vLLM's accounting differ from witcert's byte account.
            raise ValueError(f"record of {size} bytes != 2 * bytes_per_token_head = {expected} "
                             f"for head_dim={head_dim}, {quant}")
        return RecordLayout(tuple(fields), size)


def slot_major(kv_cache: torch.Tensor) -> torch.Tensor:
    """``[N, Hkv, P, C]`` int8 page tensor -> ``[N * P, Hkv, C]`` view (no copy).

    Raises ``ValueError`` if the pages are not token-major inside a block (vLLM layout
    other than LBNHC), since a copy would silently drop every write.
    """
    if kv_cache.dim() != 4 or kv_cache.dtype != torch.int8:
        raise ValueError(f"kv_cache must be int8 [N, Hkv, P, C], got {kv_cache.dtype} "
                         f"{tuple(kv_cache.shape)}")
    n, h, p, c = kv_cache.shape
    t = kv_cache.permute(0, 2, 1, 3)
    if t.stride(3) != 1 or t.stride(2) != c or (n > 1 and t.stride(0) != p * t.stride(1)) \
            or (p > 1 and t.stride(1) != h * c):
        raise ValueError(f"kv_cache strides {kv_cache.stride()} are not token-major (LBNHC); "
                         "set VLLM_KV_CACHE_LAYOUT=LBNHC or leave it unset")
    return t.reshape(n * p, h, c)


def token_positions(query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                    num_tokens: int) -> torch.Tensor:
    """0-based position in its sequence of each of the step's first ``num_tokens`` tokens,
    int64 [num_tokens], from vLLM's attention metadata: row ``query_start_loc[b] + j`` is
    token ``seq_lens[b] - query_len[b] + j`` of request b (seq_lens count the step's new
    tokens). Rows past ``query_start_loc[-1]`` (padding, slot -1) get 0."""
    qsl = query_start_loc.to(device="cpu", dtype=torch.int64)
    sl = seq_lens.to(device="cpu", dtype=torch.int64)
    B = sl.shape[0]
    rows = torch.arange(num_tokens, dtype=torch.int64)
    if B == 0:
        return torch.zeros(num_tokens, dtype=torch.int64)
    if qsl.shape != (B + 1,):
        raise ValueError(f"query_start_loc {tuple(qsl.shape)} does not fit seq_lens [{B}]")
    req = torch.searchsorted(qsl[1:], rows, right=True).clamp(max=B - 1)
    start = qsl[req]
    pos = sl[req] - (qsl[req + 1] - start) + (rows - start)
    return torch.where(rows < qsl[-1], pos, torch.zeros((), dtype=torch.int64))


def layer_kv_view(kv_cache: torch.Tensor, *, layout: RecordLayout, quant: QuantConfig,
                  layer: int, seed: int, epochs: torch.Tensor, head_dim: int,
                  positions: torch.Tensor | None = None) -> LayerKV:
    """A ``LayerKV`` whose storage tensors are views into vLLM's page tensor, with the
    compressor ``get_compressor(quant)`` (the one dither: the reference's torch Philox on
    the torch path; the native C path computes the same words itself). positions: None
    (slot-keyed dither), or int64 [num_slots] shared by every layer
    (``WITCERT_VLLM_DITHER_KEY=position``)."""
    flat = slot_major(kv_cache)
    if flat.shape[-1] != layout.size:
        raise ValueError(f"page record is {flat.shape[-1]} bytes, witcert expects {layout.size}")
    if epochs.shape != (flat.shape[0],):
        raise ValueError(f"epochs {tuple(epochs.shape)} != num_slots {flat.shape[0]}")
    sides: dict[int, dict[str, torch.Tensor]] = {K_SIDE: {}, V_SIDE: {}}
    for f in layout.fields:
        raw = flat[..., f.offset:f.offset + f.numel * f.dtype.itemsize]
        sides[f.side][f.name] = raw.view(f.dtype)
    return LayerKV(k=sides[K_SIDE], v=sides[V_SIDE], k_outlier_idx=None, v_outlier_idx=None,
                   epochs=epochs, layer=layer, seed=seed, quant=quant,
                   compressor=get_compressor(quant), num_kv_heads=flat.shape[1],
                   head_dim=head_dim, positions=positions)
