"""vLLM attention backend that stores K/V as witcert dithered INT8 and certifies decode.

Registered (by ``witcert.integrations.vllm.register``) over vLLM's ``CPU_ATTN`` slot, and
a subclass of ``CPUAttentionBackend`` so vLLM's CPU platform checks hold. What it changes:

- ``customize_spec``: the page holds int8 records of ``2 * bytes_per_token_head(D)`` bytes
  per (token, KV head), so vLLM sizes its block pool from witcert's byte account;
- ``supported_kv_cache_layouts``: token-major blocks (LBNHC), so a slot is one stride;
- ``do_kv_cache_update``: encodes K/V into the pages (``witcert.ref.pool.write_``);
- ``forward``: attention read back through the witcert reference path, one certificate
  per (layer, query head, decode token), accumulated in the worker's ``WorkerStats``.

With ``WITCERT_VLLM_GATE`` on, the worker also keeps per layer a ``gate.ExactCopy`` (K and
V in the model dtype, in a ``copystore.CopyStore``: every slot, or within the
``WITCERT_VLLM_GATE_COPY`` bound; written right after the pages with the bumped epoch) and
decode rows go through ``attend.decode_gated``: a certificate above ``tau`` repairs its KV
head from the copy, and the entries stay exact until their slot is rewritten.

The native CPU path (``witcert.native``, ``WITCERT_VLLM_NATIVE``, default ``auto``) is
built when the runtime starts (model construction, before any timed step): the write of
new tokens and the ungated decode then run in C, bitwise the reference dither, codes and
scales. If it cannot build, ``auto`` logs one warning and keeps the torch reference path.

Unsupported configurations fail while vLLM builds the model, with a message that starts
with ``witcert:``.
"""

from __future__ import annotations

import secrets
from dataclasses import replace

import torch
from vllm.config import get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.models.utils import extract_layer_index
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.backends.cpu_attn import (CPUAttentionBackend, CPUAttentionBackendImpl,
                                                 CPUAttentionMetadata,
                                                 CPUAttentionMetadataBuilder)
from vllm.v1.kv_cache_interface import AttentionSpec, KVQuantMode
from vllm.v1.kv_cache_layout import KVCacheLayout

from witcert import native
from witcert.integrations.vllm import settings as _settings
from witcert.integrations.vllm.attend import attend_batch
from witcert.integrations.vllm.capacity import capacity_info, copy_geometry
from witcert.integrations.vllm.copystore import CopyStore
from witcert.integrations.vllm.gate import ExactCopy
from witcert.integrations.vllm.lifecycle import Instance
from witcert.integrations.vllm.paged import RecordLayout, layer_kv_view, token_positions
from witcert.integrations.vllm.stats import WorkerStats
from witcert.native import support as native_support
from witcert.native import write as native_write
from witcert.ref.pool import write_

MODEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _unsupported(msg: str) -> ValueError:
    return ValueError(f"witcert: {msg} (the witcert vLLM plugin is on: {_settings.ENV_ENABLE}="
                      f"{_settings.load().preset}; unset it to serve this model without witcert)")


class WitcertCPUAttentionBackend(CPUAttentionBackend):
    @classmethod
    def customize_spec(cls, spec: AttentionSpec) -> AttentionSpec:
        if spec.kv_quant_mode != KVQuantMode.NONE or spec.state_content_bytes is not None:
            raise _unsupported(f"--kv-cache-dtype must be 'auto' (witcert stores its own INT8); "
                               f"got quant mode {spec.kv_quant_mode.name}")
        if spec.head_size_v != spec.head_size:
            raise _unsupported(f"K and V head sizes differ ({spec.head_size}, {spec.head_size_v})")
        layout = RecordLayout.build(_settings.load().quant, spec.head_size)
        return replace(spec, dtype=torch.int8, state_content_bytes=layout.size)

    @classmethod
    def supported_kv_cache_layouts(cls) -> tuple[KVCacheLayout, ...]:
        return (KVCacheLayout.LBNHC,)

    @staticmethod
    def get_impl_cls() -> type["WitcertAttentionImpl"]:
        return WitcertAttentionImpl

    @staticmethod
    def get_builder_cls() -> type["WitcertMetadataBuilder"]:
        return WitcertMetadataBuilder


class WitcertMetadataBuilder(CPUAttentionMetadataBuilder):
    """The CPU builder without the C++ scheduler metadata (witcert does not use it)."""

    def build(self, common_prefix_len, common_attn_metadata, fast_build: bool = False):
        m = common_attn_metadata
        return CPUAttentionMetadata(
            num_actual_tokens=m.num_actual_tokens, max_query_len=m.max_query_len,
            query_start_loc=m.query_start_loc, max_seq_len=m.max_seq_len, seq_lens=m.seq_lens,
            block_table=m.block_table_tensor, slot_mapping=m.slot_mapping,
            scheduler_metadata=None, causal=m.causal)


class _Runtime:
    """Worker-wide state: seed, slot epochs, the page views of every layer, the stats, and
    with the gate on the exact copy of every layer. With ``WITCERT_VLLM_DITHER_KEY=position``
    also ``positions`` int64 [num_slots] (each slot's token position, shared by every
    layer's view) and the epochs all hold ``settings.POSITION_NONCE`` (never bumped)."""

    def __init__(self, vllm_config) -> None:
        s = _settings.load()
        mc, pc = vllm_config.model_config, vllm_config.parallel_config
        if pc.pipeline_parallel_size != 1 or pc.tensor_parallel_size != 1:
            raise _unsupported("only tensor_parallel_size=1, pipeline_parallel_size=1 is proven")
        self.settings = s
        self.num_layers = mc.get_num_layers(pc)
        self.num_q_heads = mc.get_num_attention_heads(pc)
        self.num_kv_heads = mc.get_num_kv_heads(pc)
        self.head_dim = mc.get_head_size()
        self.model_dtype = mc.dtype
        self.layout = RecordLayout.build(s.quant, self.head_dim)
        self.seed = s.quant.seed if s.quant.seed is not None else secrets.randbits(64)
        self.epochs: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None
        self.views: dict[int, tuple[tuple, object]] = {}
        self.exact: dict[int, ExactCopy] = {}
        # gate: layers whose last gated decode fired (their next first pass returns the
        # logits / radii the repair reads: attend.decode_gated's terms_first, a cost hint)
        self.fired_last: set[int] = set()
        self.copies: CopyStore | None = None
        self.stats: WorkerStats | None = None
        self.native = self._native_ready()

    def _native_ready(self) -> bool:
        """Build the native library now (``WITCERT_VLLM_NATIVE`` auto / on), so the compile
        is not inside the first forward. False: use the torch reference path."""
        mode = self.settings.native
        if mode == "off":
            return False
        why = native.reason() or native_support.unsupported_shape(
            head_dim=self.head_dim, group_size=self.settings.quant.group_size,
            num_q_heads=self.num_q_heads, num_kv_heads=self.num_kv_heads)
        if why is None:
            return True
        if mode == "on":
            raise _unsupported(f"{_settings.ENV_NATIVE}=on but the native CPU path cannot run: {why}")
        native.warn_unavailable(why)
        return False

    def layer_kv(self, layer: int, kv_cache: torch.Tensor):
        key = (kv_cache.data_ptr(), tuple(kv_cache.shape))
        hit = self.views.get(layer)
        if hit is not None and hit[0] == key:
            return hit[1]
        n, h, p, c = kv_cache.shape
        if self.epochs is None or self.epochs.shape[0] != n * p:
            self.epochs = torch.zeros(n * p, dtype=torch.int64)
            if self.settings.dither_key == "position":
                self.epochs.fill_(_settings.POSITION_NONCE)
                self.positions = torch.zeros(n * p, dtype=torch.int64)
            self._start_stats(num_blocks=n, block_size=p)
            if self.settings.gate:
                # new pages: a fresh copy (whatever the old one held is not these pages' content)
                geom = copy_geometry(self.settings, num_layers=self.num_layers,
                                     num_kv_heads=h, head_dim=self.head_dim,
                                     itemsize=self.model_dtype.itemsize, num_blocks=n,
                                     block_size=p)
                self.copies = CopyStore(geom, dtype=self.model_dtype, epochs=self.epochs)
                self.exact = {}
        view = layer_kv_view(kv_cache, layout=self.layout, quant=self.settings.quant, layer=layer,
                             seed=self.seed, epochs=self.epochs, head_dim=self.head_dim,
                             positions=self.positions)
        self.views[layer] = (key, view)
        if self.settings.gate:
            self.exact[layer] = self.copies.layer(layer)
        return view

    def _start_stats(self, *, num_blocks: int, block_size: int) -> None:
        s = self.settings
        info = capacity_info(s, num_layers=self.num_layers, num_kv_heads=self.num_kv_heads,
                             head_dim=self.head_dim,
                             model_dtype=str(self.model_dtype).removeprefix("torch."),
                             itemsize=self.model_dtype.itemsize, num_blocks=num_blocks,
                             block_size=block_size)
        inst = Instance.decode(s.instance) if s.instance else None
        self.stats = WorkerStats(num_layers=self.num_layers, num_q_heads=self.num_q_heads,
                                 tau=s.cert.tau, stats_dir=s.stats_dir, info=info, gate=s.gate,
                                 instance=None if inst is None else inst.token)
        self.stats.flush()


_RUNTIME: _Runtime | None = None


def _runtime() -> _Runtime:
    global _RUNTIME
    if _RUNTIME is None:
        _RUNTIME = _Runtime(get_current_vllm_config())
    return _RUNTIME


def _step_metadata(layer):
    """This step's attention metadata of ``layer`` (block tables and sequence lengths), or
    None outside a forward pass."""
    try:
        md = get_forward_context().attn_metadata
    except AssertionError:  # no forward context
        return None
    if isinstance(md, list):
        md = md[0] if md else None
    if isinstance(md, dict):
        md = md.get(layer.layer_name)
    return md


class WitcertAttentionImpl(CPUAttentionBackendImpl):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes: list[float] | None, sliding_window: int | None,
                 kv_cache_dtype: str, logits_soft_cap: float | None = None,
                 attn_type: str = AttentionType.DECODER,
                 kv_sharing_target_layer_name: str | None = None,
                 sinks: torch.Tensor | None = None) -> None:
        checks = (
            (attn_type == AttentionType.DECODER, f"attention type {attn_type!r} (decoder only)"),
            (sliding_window is None, f"sliding-window attention (window {sliding_window})"),
            (alibi_slopes is None, "ALiBi"),
            (not logits_soft_cap, f"logits soft cap {logits_soft_cap}"),
            (sinks is None, "attention sinks"),
            (kv_sharing_target_layer_name is None, "cross-layer KV sharing"),
            (kv_cache_dtype == "auto", f"--kv-cache-dtype {kv_cache_dtype} (use auto)"),
        )
        for ok, what in checks:
            if not ok:
                raise _unsupported(f"unsupported model feature: {what}")
        rt = _runtime()
        if rt.model_dtype not in MODEL_DTYPES:
            raise _unsupported(f"model dtype {rt.model_dtype} (supported: {MODEL_DTYPES})")
        if head_size % rt.settings.quant.group_size:
            raise _unsupported(f"head_size {head_size} is not a multiple of the witcert group "
                               f"size {rt.settings.quant.group_size}")
        super().__init__(num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window,
                         kv_cache_dtype, logits_soft_cap, attn_type, kv_sharing_target_layer_name,
                         sinks)
        self._layer: int | None = None

    def _layer_index(self, layer) -> int:
        if self._layer is None:
            self._layer = extract_layer_index(layer.layer_name)
        return self._layer

    def do_kv_cache_update(self, layer, key: torch.Tensor, value: torch.Tensor,
                           kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        if kv_cache.numel() == 0:
            return
        rt, li = _runtime(), self._layer_index(layer)
        lkv = rt.layer_kv(li, kv_cache)
        n = slot_mapping.shape[0]
        slots = slot_mapping.to(torch.int64)
        k, v = key[:n], value[:n]
        keep = None
        if n and int(slots.min()) < 0:  # vLLM pads with slot -1
            keep = slots >= 0
            slots, k, v = slots[keep], k[keep], v[keep]
        if li == 0 and rt.positions is not None:
            # Position key: once per forward pass, each slot takes its token's position (every
            # layer of this step encodes with it); the epochs keep the server nonce.
            md = _step_metadata(layer)
            if md is None:
                raise RuntimeError("witcert: WITCERT_VLLM_DITHER_KEY=position needs the step's "
                                   "attention metadata at the K/V write")
            pos = token_positions(md.query_start_loc, md.seq_lens, n)
            rt.positions[slots] = pos if keep is None else pos[keep]
        elif li == 0:
            # One bump per forward pass: every layer of this step encodes with the new epoch.
            rt.epochs[slots] += 1
            if rt.copies is not None and rt.copies.have is not None:
                md = _step_metadata(layer)
                rt.copies.begin_step(slots, block_table=getattr(md, "block_table", None),
                                     seq_lens=getattr(md, "seq_lens", None))
        if rt.native:
            native_write.write_(lkv, k, v, slots=slots)
        else:
            write_(lkv, k, v, slots=slots)
        exact = rt.exact.get(li)
        if exact is not None:  # after the epoch bump: a rewritten slot is no longer exact
            exact.write_(slots, k, v)

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata, output: torch.Tensor,
                output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("witcert: fused output quantization is not supported")
        if attn_metadata is None:  # warm-up
            return output
        rt, li = _runtime(), self._layer_index(layer)
        T = attn_metadata.num_actual_tokens
        res = attend_batch(query[:T], key[:T], value[:T], rt.layer_kv(li, kv_cache),
                           query_start_loc=attn_metadata.query_start_loc,
                           seq_lens=attn_metadata.seq_lens, block_table=attn_metadata.block_table,
                           page_size=kv_cache.shape[2], sm_scale=self.scale,
                           cert=rt.settings.cert, num_layers=rt.num_layers, out=output[:T],
                           exact=rt.exact.get(li), repair=rt.settings.repair,
                           native=rt.settings.native if rt.native else "off",
                           # position key: extend rows read the step's tokens back from the
                           # pool (written by do_kv_cache_update before this forward), as decode
                           pool_read=rt.settings.dither_key == "position",
                           terms_first=li in rt.fired_last)
        rt.stats.record(li, res.cert, decode_tokens=int(res.decode_rows.numel()),
                        prefill_tokens=res.prefill_tokens, prefill_cert=res.prefill_cert)
        if res.gate is not None:
            rt.stats.record_gate(res.gate)
            if res.gate.fired:
                rt.fired_last.add(li)
            else:
                rt.fired_last.discard(li)
        if li == rt.num_layers - 1:
            if rt.copies is not None:
                rt.stats.record_copy(rt.copies)
            rt.stats.end_step()
        return output
