"""``WitcertMHATokenToKVPool``: SGLang's MHA token pool storing witcert-packed K/V.

A subclass of SGLang's ``MHATokenToKVPool`` (the platform's ``get_kv_pool_cls`` hands it to
SGLang's configurator, which builds it with the in-tree keyword arguments). Only the
storage changes: ``_create_buffers`` carves one ``witcert.runtime.pool.PagedPool`` whose slot rows
are SGLang's slots (``size + page_size`` rows, the padding page included), so SGLang's
allocator, radix cache and ``req_to_token`` tables keep addressing the pool unchanged.

- Writes (``set_kv_buffer``) quantize with witcert's write kernel; the dither counter is
  keyed by SGLang's slot and the slot's epoch. The epoch of a slot is bumped when the
  first layer of the pool writes it, so a slot SGLang frees and hands out again never
  reuses a dither, and every layer of one forward sees the same epoch.
- The exact K/V go to the host backup (``PagedPool.backup_write_``: asynchronous from a
  CUDA pool) for repair.
- ``k_buffer``/``v_buffer`` are the int8 code tensors (``store_dtype`` int8): a stock
  backend handed this pool reads int8 and fails on the dtype instead of reading garbage.
  Only ``WitcertTritonAttnBackend`` reads it, through ``layer_kv(layer_id)``.

Unsupported here (refused with a message, never silently wrong): HND / vectorized layouts,
quantized KV recipes, post-capture VA backing, ``head_dim != v_head_dim``, DCP masked
writes, per-layer k/v scales, CPU offload copies and PD-disaggregation transfer.
"""

from __future__ import annotations

import logging

import torch
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, unwrap_write_loc

from witcert.runtime import dispatch as wbackend
from witcert.config import CacheConfig
from witcert.integrations.sglang import settings as _settings
from witcert.integrations.sglang.accounting import witcert_cell_size
from witcert.runtime.pool import PagedPool

logger = logging.getLogger(__name__)


class WitcertMHATokenToKVPool(MHATokenToKVPool):
    """Takes exactly the in-tree constructor's keyword arguments; the witcert settings
    come from ``settings.load()`` (the environment of the scheduler process)."""

    witcert_settings: _settings.Settings | None = None

    def _create_buffers(self):
        s = self.witcert_settings or _settings.load()
        self.witcert_settings = s
        if self.is_quantized_kv_cache or self.post_capture_active:
            raise NotImplementedError("witcert pool: quantized KV recipes and post-capture "
                                      "backing are not supported (witcert is the quantizer)")
        if self.kv_cache_layout != "nhd" or self.use_hnd:
            raise NotImplementedError(f"witcert pool: layout {self.kv_cache_layout!r}; only NHD slot rows")
        if self.head_dim != self.v_head_dim:
            raise NotImplementedError(f"witcert pool: head_dim {self.head_dim} != v_head_dim "
                                      f"{self.v_head_dim}")
        # slot rows: SGLang's size + the padding page, rounded to whole pages for the kernels
        rows = -(-(self.size + self.page_size) // self.page_size) * self.page_size
        self.witcert = PagedPool(
            num_layers=self.layer_num, num_kv_heads=self.head_num, head_dim=self.head_dim,
            quant=s.quant, cache=CacheConfig(page_size=1, num_pages=rows, exact_backup=s.exact_backup),
            device=self.device, backup_dtype=self.dtype)
        self.store_dtype = torch.int8
        self.k_buffer = [lkv.k["codes"] for lkv in self.witcert.layers]
        self.v_buffer = [lkv.v["codes"] for lkv in self.witcert.layers]
        self.k_scale_buffer = self.v_scale_buffer = None
        self.native_k_scale_buffer = self.native_v_scale_buffer = None
        self.dq_k_buffer = self.dq_v_buffer = None
        self._kv_buffer_descs = ()
        self._init_data_ptrs_and_strides()
        self.witcert_cell_size = witcert_cell_size(
            num_layers=self.layer_num, num_kv_heads=self.head_num, head_dim=self.head_dim,
            quant=s.quant)
        assert self.witcert.bytes_total() == rows * self.witcert_cell_size, "cell size drifted"

    # ---- reads ---------------------------------------------------------------------------
    def layer_kv(self, layer_id: int):
        """The ``witcert.ref.pool.LayerKV`` of global layer ``layer_id``."""
        return self.witcert.layers[layer_id - self.start_layer]

    def witcert_device_bytes(self) -> int:
        """Device bytes of the packed pool (all layers, both sides, epochs)."""
        return self.witcert.bytes_total()

    def get_kv_size_bytes(self):
        """(K bytes, V bytes) of every packed tensor; the epochs are counted with K."""
        k = sum(t.numel() * t.element_size() for lkv in self.witcert.layers for t in lkv.k.values())
        v = sum(t.numel() * t.element_size() for lkv in self.witcert.layers for t in lkv.v.values())
        return k + self.witcert.epochs.numel() * self.witcert.epochs.element_size(), v

    # ---- writes --------------------------------------------------------------------------
    def set_kv_buffer(self, layer, loc_info, cache_k: torch.Tensor, cache_v: torch.Tensor,
                      k_scale=None, v_scale=None, layer_id_override=None, dcp_kv_mask=None):
        """Quantize ``cache_k``/``cache_v`` (``[T, Hkv, D]`` or ``[T, Hkv * D]``) into slots
        ``loc`` (int64 ``[T]``) of the layer, and copy them exactly to the host backup."""
        loc, _, _ = unwrap_write_loc(loc_info)
        self._check_physical_write_loc(loc_info, "set_kv_buffer (witcert)")
        if dcp_kv_mask is not None:
            raise NotImplementedError("witcert pool: DCP masked writes are not supported")
        if (k_scale not in (None, 1.0)) or (v_scale not in (None, 1.0)):
            raise NotImplementedError("witcert pool: per-layer k/v scales are not supported")
        layer_id = layer_id_override if layer_id_override is not None else layer.layer_id
        idx = layer_id - self.start_layer
        T = loc.shape[0]
        k = cache_k.reshape(T, self.head_num, self.head_dim)
        v = cache_v.reshape(T, self.head_num, self.v_head_dim)
        slots = loc.to(torch.int64)
        if idx == 0:
            # a new write to a slot = a new dither stream (docs/MATH.md §6); all layers share it
            self.witcert.epochs[slots] = (self.witcert.epochs[slots] + 1) & 0xFFFFFFFF
        wbackend.write_kv_(self.witcert.layers[idx], k, v, slots=slots)
        if self.witcert.backup is not None:
            self.witcert.backup_write_(idx, k, v, slots_host=_host_slots(slots))

    def move_kv_cache(self, tgt_loc: torch.Tensor, src_loc: torch.Tensor):
        """Move tokens between slots. The dither is keyed by the slot, so the codes cannot
        be copied: each moved token is re-encoded at its new slot from the exact backup."""
        if tgt_loc.numel() == 0:
            return
        if self.witcert.backup is None:
            raise NotImplementedError("witcert pool: move_kv_cache needs the exact host backup "
                                      f"({_settings.ENV_EXACT_BACKUP}=1)")
        self.witcert.flush_backup_(wait=True)
        src_h, tgt = src_loc.to("cpu", torch.int64), tgt_loc.to(torch.int64)
        self.witcert.epochs[tgt] = (self.witcert.epochs[tgt] + 1) & 0xFFFFFFFF
        for idx, lkv in enumerate(self.witcert.layers):
            k = self.witcert.backup.k[idx][src_h].to(self.device)
            v = self.witcert.backup.v[idx][src_h].to(self.device)
            wbackend.write_kv_(lkv, k, v, slots=tgt)
            self.witcert.backup_write_(idx, k, v, slots_host=tgt.to("cpu"))

    # ---- refused -------------------------------------------------------------------------
    def get_cpu_copy(self, *args, **kwargs):
        raise NotImplementedError("witcert pool: CPU offload of packed KV is not supported")

    def load_cpu_copy(self, *args, **kwargs):
        raise NotImplementedError("witcert pool: CPU offload of packed KV is not supported")

    def get_contiguous_buf_infos(self):
        raise NotImplementedError("witcert pool: PD-disaggregation transfer is not supported")


def _host_slots(slots: torch.Tensor) -> torch.Tensor:
    """int64 [T] slots on the host without waiting for the device: a pinned buffer filled
    asynchronously on the current stream, before the backup copies that record the event
    ``PagedPool.flush_backup_`` waits on, so it holds the slots when the backup reads it."""
    if slots.device.type == "cpu":
        return slots
    host = torch.empty(slots.shape, dtype=torch.int64, pin_memory=True)
    host.copy_(slots, non_blocking=True)
    return host
