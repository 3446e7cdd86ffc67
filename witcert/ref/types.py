"""Shared types of the reference: the encode context and the compressor protocol."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

K_SIDE = 0
V_SIDE = 1


@dataclass(frozen=True)
class EncodeCtx:
    """Everything a compressor needs to place a batch of tokens in the dither stream.

    seed: 64-bit Philox key.
    layer: layer index (< 2^16).
    kv_heads: int64 [H], the KV head index of each head row of the input.
    side: ``K_SIDE`` (0) or ``V_SIDE`` (1).
    slots: int64 [T], the first counter word of each token: its cache slot, or its position in
        its sequence when the pool uses the position-keyed dither (``LayerKV.positions``).
    epochs: int64 [T], epoch of each slot at write time (a reused slot gets a new epoch).
    outlier_idx: int64 [H, 2m] channels kept exact per head, or None (m = 0).
    """

    seed: int
    layer: int
    kv_heads: torch.Tensor
    side: int
    slots: torch.Tensor
    epochs: torch.Tensor
    outlier_idx: torch.Tensor | None = None

    @staticmethod
    def simple(*, num_tokens: int, num_heads: int, seed: int = 0, layer: int = 0,
               side: int = K_SIDE, outlier_idx: torch.Tensor | None = None,
               device: torch.device | str = "cpu") -> "EncodeCtx":
        """Context for tokens in slots 0..T-1, epoch 0, heads 0..H-1 (tests, offline eval)."""
        return EncodeCtx(
            seed=seed, layer=layer,
            kv_heads=torch.arange(num_heads, dtype=torch.int64, device=device),
            side=side,
            slots=torch.arange(num_tokens, dtype=torch.int64, device=device),
            epochs=torch.zeros(num_tokens, dtype=torch.int64, device=device),
            outlier_idx=outlier_idx,
        )


class Compressor(Protocol):
    """A KV compressor behind one interface (see docs/DESIGN.md, Compressor interface)."""

    name: str
    granularity: str  # "token" or "block"
    has_prob_radius: bool

    def storage_spec(self, num_kv_heads: int, head_dim: int) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        ...

    def encode(self, x: torch.Tensor, *, ctx: EncodeCtx) -> dict[str, torch.Tensor]:
        ...

    def decode(self, packed: dict[str, torch.Tensor], *, ctx: EncodeCtx) -> torch.Tensor:
        ...

    def bytes_per_token_head(self, head_dim: int) -> int:
        ...
