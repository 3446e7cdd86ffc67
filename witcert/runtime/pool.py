"""The paged KV pool of a whole model: one ``LayerKV`` per layer, one slot allocator.

Every layer shares the allocator (a token has the same slot in every layer) and the
``epochs`` tensor; the dither seed is one secret 64-bit value per pool (``quant.seed``
overrides it for reproducible runs). Byte accounting is exact: it is computed from the
compressor's ``storage_spec`` and tested against the tensors actually allocated.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch

from witcert.config import CacheConfig, QuantConfig
from witcert.ref import pool as _ref_pool
from witcert.ref.compressors import get_compressor
from witcert.ref.types import K_SIDE, V_SIDE
from witcert.runtime.slots import SlotAllocator

FP16_BYTES = 2


@dataclass
class ExactBackup:
    """Exact K/V of every slot on the host (repair pages blocks back in from here).

    k, v: ``dtype [num_slots, Hkv, D]`` per layer, on the CPU (pinned when CUDA is
    available so device-to-host copies can be asynchronous).
    """

    k: list[torch.Tensor]
    v: list[torch.Tensor]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)


class PagedPool:
    """KV storage of ``num_layers`` layers in pages of ``cache.page_size`` tokens.

    num_layers, num_kv_heads, head_dim: model geometry (``L``, ``Hkv``, ``D``).
    quant: compressor (token-granular methods only).
    cache: page geometry and whether to keep the exact host backup.
    device: where the compressed pool lives.
    outlier_idx: per layer ``(k_idx, v_idx)`` int64 ``[Hkv, 2m]`` channels kept exact;
        required iff ``quant.outliers > 0`` (choose them with ``witcert calibrate``).
    backup_dtype: dtype of the exact host backup (fp16 by default).
    outlier_profile: an ``OutlierProfile`` (``witcert calibrate``) instead of ``outlier_idx``:
        its top ``quant.outliers`` pairs per (layer, KV head), geometry checked.
    """

    def __init__(self, *, num_layers: int, num_kv_heads: int, head_dim: int, quant: QuantConfig,
                 cache: CacheConfig, device: torch.device | str = "cpu",
                 outlier_idx: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
                 backup_dtype: torch.dtype = torch.float16, outlier_profile=None):
        if outlier_profile is not None:
            if outlier_idx is not None:
                raise ValueError("outlier_profile: give outlier_idx or outlier_profile, not both")
            outlier_profile.check_geometry(num_layers=num_layers, num_kv_heads=num_kv_heads,
                                           head_dim=head_dim)
            outlier_idx = outlier_profile.outlier_idx(quant.outliers)
        if num_layers < 1 or num_layers >= 2**16:
            raise ValueError(f"num_layers: {num_layers} must be in [1, 2^16)")
        if num_kv_heads < 1 or num_kv_heads >= 2**16:
            raise ValueError(f"num_kv_heads: {num_kv_heads} must be in [1, 2^16)")
        if head_dim < 1 or head_dim % quant.group_size:
            raise ValueError(f"head_dim: {head_dim} must be a positive multiple of "
                             f"quant.group_size={quant.group_size}")
        if quant.is_block:
            raise ValueError(f"quant.method: {quant.method!r} is block-granular; the paged pool "
                             "needs a token-granular method (e.g. dither8)")
        if quant.outliers and 2 * quant.outliers > head_dim:
            raise ValueError(f"quant.outliers: {quant.outliers} RoPE pairs exceed head_dim={head_dim}")
        if (outlier_idx is None) != (quant.outliers == 0):
            raise ValueError(f"outlier_idx: required iff quant.outliers > 0 (outliers={quant.outliers}); "
                             "choose the pairs with `witcert calibrate`")
        if outlier_idx is not None and len(outlier_idx) != num_layers:
            raise ValueError(f"outlier_idx: {len(outlier_idx)} entries for {num_layers} layers")
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.quant, self.cache_config = quant, cache
        self.device = torch.device(device)
        self.page_size = cache.page_size
        self.compressor = get_compressor(quant)
        self.seed = quant.seed if quant.seed is not None else secrets.randbits(64)
        self.allocator = SlotAllocator(num_pages=cache.num_pages, page_size=cache.page_size,
                                       device=self.device, dither_key=cache.dither_key)
        self.layers = [
            _ref_pool.LayerKV.allocate(
                num_slots=cache.num_slots, num_kv_heads=num_kv_heads, head_dim=head_dim,
                quant=quant, layer=i, seed=self.seed, epochs=self.allocator.epochs,
                device=self.device, positions=self.allocator.positions,
                k_outlier_idx=None if outlier_idx is None else outlier_idx[i][0].to(self.device),
                v_outlier_idx=None if outlier_idx is None else outlier_idx[i][1].to(self.device))
            for i in range(num_layers)]
        self.exact_store = None  # the gate's witcert.runtime.repair.ExactStore while one is attached
        self.backup: ExactBackup | None = None
        self._pending_backup: list = []
        if cache.exact_backup:
            pin = torch.cuda.is_available()
            shape = (cache.num_slots, num_kv_heads, head_dim)

            def host() -> torch.Tensor:
                return torch.zeros(shape, dtype=backup_dtype, device="cpu", pin_memory=pin)

            self.backup = ExactBackup(k=[host() for _ in range(num_layers)],
                                      v=[host() for _ in range(num_layers)])

    @property
    def epochs(self) -> torch.Tensor:
        """int64 ``[num_slots]``, shared by every layer."""
        return self.allocator.epochs

    @property
    def num_slots(self) -> int:
        return self.allocator.num_slots

    # ---- writes --------------------------------------------------------------------------
    def backup_write_(self, layer: int, k: torch.Tensor, v: torch.Tensor, *,
                      slots_host: torch.Tensor) -> None:
        """Copy exact ``k``, ``v`` (``[T, Hkv, D]``) into the host backup at ``slots_host``
        (int64 ``[T]`` on the CPU). A no-op without a backup.

        On a CUDA pool the copy goes to a pinned staging buffer asynchronously and is
        scattered into the backup by ``flush_backup_`` (finished copies at each planning step;
        readers of the backup call it to get everything),
        so the decode loop never waits for it.
        """
        if self.backup is None:
            return
        dt = self.backup.k[layer].dtype
        if k.device.type == "cpu":
            self.backup.k[layer].index_copy_(0, slots_host, k.to(dt))
            self.backup.v[layer].index_copy_(0, slots_host, v.to(dt))
            return
        staged = []
        for x in (k, v):
            h = torch.empty(x.shape, dtype=dt, device="cpu", pin_memory=True)
            h.copy_(x.to(dt), non_blocking=True)
            staged.append(h)
        event = torch.cuda.Event()
        event.record()
        self._pending_backup.append((layer, slots_host, staged[0], staged[1], event))

    def flush_backup_(self, *, wait: bool = True) -> None:
        """Scatter staged asynchronous backup copies into the backup (CUDA pools).

        wait=True (readers of the backup): every staged copy, waiting for it if needed.
        wait=False (the per-step planner): only copies already finished, so planning never
        waits on the device.
        """
        keep = []
        for item in self._pending_backup:
            layer, slots_host, kh, vh, event = item
            if keep or (not wait and not event.query()):
                keep.append(item)  # in order: a later copy never lands before an earlier one
                continue
            event.synchronize()
            self.backup.k[layer].index_copy_(0, slots_host, kh)
            self.backup.v[layer].index_copy_(0, slots_host, vh)
        self._pending_backup = keep

    # ---- byte accounting -----------------------------------------------------------------
    def bytes_per_token_head(self, side: int = K_SIDE) -> int:
        """Stored bytes per (token, KV head) of one side (K or V): the compressor's
        ``storage_spec`` summed; the same for both sides (one spec per pool)."""
        if side not in (K_SIDE, V_SIDE):
            raise ValueError(f"side {side} must be K_SIDE (0) or V_SIDE (1)")
        return self.compressor.bytes_per_token_head(self.head_dim)

    def bytes_per_token_layer(self) -> int:
        """Stored bytes per token in one layer, K and V, all KV heads."""
        return self.num_kv_heads * (self.bytes_per_token_head(K_SIDE) + self.bytes_per_token_head(V_SIDE))

    def fp16_bytes_per_token_layer(self) -> int:
        """The same token in an fp16 KV cache: ``2 * Hkv * D * 2`` bytes."""
        return 2 * self.num_kv_heads * self.head_dim * FP16_BYTES

    def bytes_per_slot(self) -> int:
        """Device bytes one slot costs: every layer's storage plus its epoch counter."""
        return self.num_layers * self.bytes_per_token_layer() + self.epochs.element_size()

    def fixed_bytes(self) -> int:
        """Device bytes independent of the slot count (outlier channel indices)."""
        return sum(_ref_pool.bytes_allocated(lkv) for lkv in self.layers) \
            - self.num_slots * self.num_layers * self.bytes_per_token_layer()

    def bytes_total(self) -> int:
        """Device bytes of the compressed pool: all layers' storage tensors and outlier
        indices, plus the shared epochs tensor (the host backup is not device memory)."""
        return sum(_ref_pool.bytes_allocated(lkv) for lkv in self.layers) \
            + self.epochs.numel() * self.epochs.element_size()

    def backup_bytes(self) -> int:
        """Host bytes of the exact backup (0 without one)."""
        return 0 if self.backup is None else self.backup.nbytes()

    def capacity_tokens(self, memory_bytes: int) -> int:
        """Tokens (whole pages) a pool with this geometry can hold in ``memory_bytes`` of
        device memory, counting everything ``bytes_total`` counts."""
        per_page = self.page_size * self.bytes_per_slot()
        pages = max(0, (memory_bytes - self.fixed_bytes()) // per_page)
        return pages * self.page_size

    def fp16_capacity_tokens(self, memory_bytes: int) -> int:
        """Tokens an fp16 KV cache of the same model holds in ``memory_bytes``."""
        return max(0, memory_bytes // (self.num_layers * self.fp16_bytes_per_token_layer()))

    def bytes_report(self) -> dict:
        """Per-token and total figures for reports (all integers, bytes)."""
        per_tok = self.num_layers * self.bytes_per_token_layer()
        fp16 = self.num_layers * self.fp16_bytes_per_token_layer()
        return {
            "method": self.quant.method,
            "bytes_per_token_head_side": self.bytes_per_token_head(K_SIDE),
            "fp16_bytes_per_token_head_side": self.head_dim * FP16_BYTES,
            "bytes_per_token": per_tok,
            "fp16_bytes_per_token": fp16,
            "saved_fraction": 1.0 - per_tok / fp16,
            "pool_bytes_total": self.bytes_total(),
            "pool_slots": self.num_slots,
            "backup_host_bytes": self.backup_bytes(),
            "exact_store_bytes": self.exact_store_bytes(),
        }

    def exact_store_bytes(self) -> int:
        """Bytes the repaired entries stand for in the exact store (0 without a gate)."""
        return 0 if self.exact_store is None else self.exact_store.bytes_used()
