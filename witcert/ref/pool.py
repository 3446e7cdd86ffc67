"""One layer's paged KV storage (DESIGN, Pool layout) with write and gather helpers.

Slot-major like vLLM: every stored tensor is ``[num_slots, Hkv, ...]`` and token ``t``
of sequence ``b`` lives in slot ``block_table[b, t // P] * P + t % P``. The dither of a
stored element is keyed by (seed, layer, kv head, side, slot, epoch), so gather must
see the same ``epochs[slot]`` the write saw (the cache bumps it only on slot reuse).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch

from witcert.config import QuantConfig
from witcert.ref.compressors import get_compressor
from witcert.ref.types import K_SIDE, V_SIDE, Compressor, EncodeCtx
from witcert.ref.validate import check_attention_dtypes

SIDES = (K_SIDE, V_SIDE)


@dataclass
class LayerKV:
    """Storage of one layer: ``k`` and ``v`` map a name of ``storage_spec`` to a tensor
    ``[num_slots, Hkv, *tail]``; ``k_outlier_idx``/``v_outlier_idx`` int64 [Hkv, 2m] or None;
    ``epochs`` int64 [num_slots], shared by every layer of the pool (passed in).
    The storage only: a gate's exact entries are runtime state and are never attached here
    (the runtime passes them down per call, ``witcert.runtime.dispatch``'s ``exact_copy=``).
    ``positions``: None (the dither counter's first word is the slot), or int64 [num_slots]
    shared by the pool: the word is ``positions[slot]`` (the token's position in its
    sequence) and ``epochs[slot]`` holds the request's nonce, so the dither of a token does
    not depend on where it was placed (docs/MATH.md §6, position-keyed dither)."""

    k: dict[str, torch.Tensor]
    v: dict[str, torch.Tensor]
    k_outlier_idx: torch.Tensor | None
    v_outlier_idx: torch.Tensor | None
    epochs: torch.Tensor
    layer: int
    seed: int
    quant: QuantConfig
    compressor: Compressor
    num_kv_heads: int
    head_dim: int
    positions: torch.Tensor | None = None

    @staticmethod
    def allocate(*, num_slots: int, num_kv_heads: int, head_dim: int, quant: QuantConfig,
                 layer: int, seed: int | None, epochs: torch.Tensor,
                 device: torch.device | str = "cpu",
                 k_outlier_idx: torch.Tensor | None = None,
                 v_outlier_idx: torch.Tensor | None = None,
                 positions: torch.Tensor | None = None) -> "LayerKV":
        """Zero-filled storage from ``get_compressor(quant).storage_spec``.

        seed None: ``quant.seed`` if set, else a fresh secret 64-bit seed.
        Outlier indices are required iff ``quant.outliers > 0`` (chosen by calibration).
        """
        comp = get_compressor(quant)
        if comp.granularity != "token":
            raise ValueError(f"quant.method {quant.method!r} is block-granular; the paged pool "
                             "stores token-granular methods only (encode whole sequences offline)")
        if num_slots < 1 or num_kv_heads < 1 or head_dim < 1:
            raise ValueError("num_slots, num_kv_heads and head_dim must be >= 1")
        if epochs.shape != (num_slots,) or epochs.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"epochs must be int32/int64 [{num_slots}], got {epochs.dtype} "
                             f"{tuple(epochs.shape)}")
        m2 = 2 * quant.outliers
        for name, idx in (("k_outlier_idx", k_outlier_idx), ("v_outlier_idx", v_outlier_idx)):
            if (idx is None) != (m2 == 0):
                raise ValueError(f"{name}: required iff quant.outliers > 0 (outliers={quant.outliers})")
            if idx is not None and (idx.shape != (num_kv_heads, m2) or idx.dtype != torch.int64):
                raise ValueError(f"{name} must be int64 [{num_kv_heads}, {m2}], got "
                                 f"{idx.dtype} {tuple(idx.shape)}")
        if positions is not None and (positions.shape != (num_slots,) or positions.dtype != torch.int64):
            raise ValueError(f"positions must be int64 [{num_slots}], got {positions.dtype} "
                             f"{tuple(positions.shape)}")
        if seed is None:
            seed = quant.seed if quant.seed is not None else secrets.randbits(64)
        spec = comp.storage_spec(num_kv_heads, head_dim)

        def side() -> dict[str, torch.Tensor]:
            return {name: torch.zeros((num_slots, num_kv_heads, *tail), dtype=dt, device=device)
                    for name, (tail, dt) in spec.items()}

        return LayerKV(k=side(), v=side(), k_outlier_idx=k_outlier_idx, v_outlier_idx=v_outlier_idx,
                       epochs=epochs, layer=layer, seed=seed, quant=quant, compressor=comp,
                       num_kv_heads=num_kv_heads, head_dim=head_dim, positions=positions)

    @property
    def num_slots(self) -> int:
        return self.epochs.shape[0]

    def storage(self, side: int) -> dict[str, torch.Tensor]:
        if side not in SIDES:
            raise ValueError(f"side {side} must be K_SIDE (0) or V_SIDE (1)")
        return self.k if side == K_SIDE else self.v

    def outlier_idx(self, side: int) -> torch.Tensor | None:
        return self.k_outlier_idx if side == K_SIDE else self.v_outlier_idx

    def bypass_mask(self, side: int) -> torch.Tensor | None:
        """bool [Hkv, D], True on channels stored exactly (outliers), or None."""
        idx = self.outlier_idx(side)
        if idx is None:
            return None
        mask = torch.zeros(self.num_kv_heads, self.head_dim, dtype=torch.bool, device=idx.device)
        return mask.scatter_(1, idx, True)

    def ctx(self, side: int, slots: torch.Tensor) -> EncodeCtx:
        """The EncodeCtx of tokens in ``slots`` (int64 [T]) at their current epochs."""
        dev = self.epochs.device
        word0 = slots if self.positions is None else self.positions[slots]
        return EncodeCtx(seed=self.seed, layer=self.layer,
                         kv_heads=torch.arange(self.num_kv_heads, dtype=torch.int64, device=dev),
                         side=side, slots=word0, epochs=self.epochs[slots].to(torch.int64),
                         outlier_idx=self.outlier_idx(side))


def _check_slots(layer_kv: LayerKV, slots: torch.Tensor, name: str = "slots") -> None:
    if slots.dtype != torch.int64 or slots.dim() != 1:
        raise ValueError(f"{name} must be int64 [T], got {slots.dtype} {tuple(slots.shape)}")
    if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= layer_kv.num_slots):
        raise ValueError(f"{name} out of range [0, {layer_kv.num_slots})")


def write_(layer_kv: LayerKV, k: torch.Tensor, v: torch.Tensor, *, slots: torch.Tensor) -> None:
    """Encode exact ``k``, ``v`` (float [T, Hkv, D]) and store them in ``slots`` (int64 [T])."""
    shape = (slots.shape[0], layer_kv.num_kv_heads, layer_kv.head_dim)
    for name, x in (("k", k), ("v", v)):
        if tuple(x.shape) != shape or not x.is_floating_point():
            raise ValueError(f"{name} must be float {list(shape)}, got {x.dtype} {tuple(x.shape)}")
    # every compressor: a float64 row's witness would be computed from an fp32 rounding (dither8
    # refused it already; the baselines' float64 error squares could underflow to a 0 witness)
    check_attention_dtypes(k=k, v=v)
    _check_slots(layer_kv, slots)
    if torch.unique(slots).numel() != slots.numel():
        raise ValueError("slots must be distinct within one write")
    for side, x in ((K_SIDE, k), (V_SIDE, v)):
        packed = layer_kv.compressor.encode(x, ctx=layer_kv.ctx(side, slots))
        store = layer_kv.storage(side)
        for name, t in packed.items():
            store[name][slots] = t.to(store[name].dtype)


def gather(layer_kv: LayerKV, side: int, slots: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Read tokens back: ``(xhat f32 [T, Hkv, D], packed {name: [T, Hkv, ...]})``."""
    _check_slots(layer_kv, slots)
    packed = {name: t[slots] for name, t in layer_kv.storage(side).items()}
    xhat = layer_kv.compressor.decode(packed, ctx=layer_kv.ctx(side, slots))
    return xhat.to(torch.float32), packed


def bytes_allocated(layer_kv: LayerKV) -> int:
    """Bytes of this layer's storage tensors (both sides, outlier indices included;
    the pool-wide ``epochs`` tensor is not counted per layer)."""
    tensors = list(layer_kv.k.values()) + list(layer_kv.v.values())
    tensors += [t for t in (layer_kv.k_outlier_idx, layer_kv.v_outlier_idx) if t is not None]
    return sum(t.numel() * t.element_size() for t in tensors)
