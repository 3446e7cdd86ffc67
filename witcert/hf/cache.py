"""``WitCertCache``: a transformers 5.x ``Cache`` backed by the compressed paged pool.

Per forward pass the cache makes one host-side plan (at layer 0: which new tokens are
real, their slots, block table, risk budget) and then, per layer, the ``"witcert"``
attention function (``witcert.hf.attention``) hands the layer's post-RoPE q/k/v back to
``attend``:

- prefill (empty cache): exact attention over the exact new K/V (padding excluded); the
  real tokens are written compressed (and to the exact host backup).
- decode (one new token per sequence): the token is written first, then attention runs
  over the compressed pool with the real query through the backend ``decode_attention``,
  which returns ``cert [B, Hq]`` for this layer and step (docs/MATH.md §1-2). No dequantised copy
  of the cache is ever materialised here.
- chunked prefill (cache not empty, several new tokens): ``extend_attention`` over the
  compressed prefix plus the chunk's exact tokens, with a certificate per (new token,
  layer, query head) (prefill records of the ``CertLog``; every column of the chunk takes
  one step index of the risk allocation, docs/MATH.md §4), then the chunk is written.

Padding tokens (0 in the 2D attention mask) are never stored and never attended, so a
left-padded batch stores exactly what each prompt alone would store. HF still sees a
rectangular ``[B, seen]`` history (``get_seq_length`` counts padding columns).
Certificates go to a ``CertLog`` (device-side, no host sync); ``observer.on_decode`` sees
every layer's decode output.

Static decode (``begin_static_decode_``, ``witcert.hf.static``): for CUDA graphs the
per-step metadata lives in preallocated device tensors (block table as wide as a fixed
capacity) that ``static_step_`` updates in place before each one-token forward; the
forward itself then does no host work, and ``finish_static_step_`` does the host
bookkeeping after it (``witcert.hf.graph.CapturedDecoder`` drives this).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from witcert.runtime import dispatch as _backend
from witcert.config import CertConfig
from witcert.hf import attention as _attn
from witcert.hf.geometry import AttentionGeometry
from witcert.hf.model import check_supported
from witcert.hf.static import StaticDecodeMixin
from witcert.runtime.pool import PagedPool
from witcert.ref.cert import delta_local
from witcert.runtime.slots import to_device


@dataclass
class _Plan:
    """Host-made metadata of one forward pass (shared by every layer)."""

    kind: str                             # "prefill" | "decode" | "extend"
    B: int
    T: int
    counts: list[int]                     # real new tokens per sequence
    slots: torch.Tensor                   # int64 [n] device, sequence-major token order
    slots_host: torch.Tensor              # the same on the CPU
    real: torch.Tensor | None = None      # bool [B, T] device (prefill/extend), None = all real
    write_idx: torch.Tensor | None = None  # int64 [n] into the flattened [B*T] new tokens
    real_pos: list[torch.Tensor] = field(default_factory=list)   # extend: int64 [n_b] per seq
    prefix_slots: list[torch.Tensor] = field(default_factory=list)  # extend: int64 [N_b]
    block_table: torch.Tensor | None = None  # decode: int32 [B, pages]
    seq_lens: torch.Tensor | None = None     # decode: int32 [B]
    cert: CertConfig | None = None           # decode / certified extend: the config used
    delta_loc: torch.Tensor | None = None    # decode: f32 [B]; extend: f64 [T] per column
    step: int = 0                            # decode: 1, 2, ...; extend: its last column's
    slots_per_seq: list[torch.Tensor] | None = None  # for the observer, built lazily


class _PoolLayer(CacheLayerMixin):
    """Per-layer view transformers expects; all state lives in the owning cache."""

    is_sliding = False
    is_compileable = False
    is_croppable = False
    supports_early_init = False

    def __init__(self, cache: "WitCertCache", layer_idx: int):
        super().__init__()
        self._cache, self.layer_idx = cache, layer_idx

    def lazy_initialization(self, key_states, value_states) -> None:
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        return self._cache.update(key_states, value_states, self.layer_idx)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._cache._seen + query_length, 0

    def get_seq_length(self) -> int:
        return self._cache._seen

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        pass

    def reorder_cache(self, beam_idx) -> None:
        raise NotImplementedError("WitCertCache does not support beam search (reorder_cache)")


class WitCertCache(StaticDecodeMixin, Cache):
    """Compressed, certified KV cache for ``model.generate(..., past_key_values=cache)``.

    pool: the ``PagedPool`` (its geometry must match the model).
    cert: certificate settings; ``radius`` ``prob``/``min`` need a dither method.
    config: the model config (``model.config``); checked with ``check_supported`` and
        for ``attn_implementation == "witcert"``.
    telemetry: True for a fresh ``CertLog`` (``self.cert_log``), a ``CertLog`` to reuse,
        or False for none.
    stride: ``CertLog`` sampling stride for whole-step buffers.
    observer: None or an object with ``on_decode(*, layer_idx, q, out, slots_per_seq,
        pool)`` and optionally ``wants_radius = True``.
    num_splits: split-KV factor passed to ``decode_attention`` (None: the backend plans it
        from the sequence length; the reference then uses one split).
    repair: None (no gate) or a ``RepairPolicy``: a ``witcert.runtime.repair.Gate`` (``self.gate``)
        checks every decode certificate against ``cert.tau`` and repairs from the exact
        backup (docs/GATING.md); the ``CertLog`` then records the delivered certificates.
    kv_dtype: dtype of the model's K/V (decides whether the backup is exact for repair).
    gate_check: ``auto`` (per layer on CPU, once per step on GPU), ``layer`` or ``step``.
    """

    def __init__(self, *, pool: PagedPool, cert: CertConfig, config, telemetry=True,
                 stride: int = 1, observer=None, num_splits: int | None = None,
                 repair=None, kv_dtype: torch.dtype | None = None, gate_check: str = "auto"):
        text = config.get_text_config(decoder=True)
        check_supported(text)
        impl = getattr(config, "_attn_implementation", None)
        if impl != _attn.ATTN_NAME:
            raise ValueError(
                f"the model uses attn_implementation={impl!r}; WitCertCache needs "
                f"{_attn.ATTN_NAME!r}: call witcert.hf.register() and then "
                f"model.set_attn_implementation({_attn.ATTN_NAME!r}) (or load with it)")
        if not _attn.is_registered():
            raise ValueError("witcert attention is not registered: call witcert.hf.register() first")
        geo = AttentionGeometry.of(text)
        geometry = (geo.num_layers, geo.num_kv_heads, geo.head_dim)
        if geometry != (pool.num_layers, pool.num_kv_heads, pool.head_dim):
            raise ValueError(f"pool geometry (layers, kv heads, head dim) = "
                             f"{(pool.num_layers, pool.num_kv_heads, pool.head_dim)} does not "
                             f"match the model's {geometry}")
        _check_cert(cert, pool)
        if num_splits is not None and num_splits < 1:
            raise ValueError(f"num_splits: {num_splits} must be None (backend plans) or >= 1")
        super().__init__(layers=[_PoolLayer(self, i) for i in range(pool.num_layers)])
        self.pool, self.cert, self.num_splits = pool, cert, num_splits
        self.num_q_heads = text.num_attention_heads
        self.observer = observer
        self.cert_log = None
        if telemetry is True and cert.enabled:
            from witcert.runtime.telemetry import CertLog

            self.cert_log = CertLog(num_layers=pool.num_layers, num_q_heads=self.num_q_heads,
                                    tau=cert.tau, stride=stride, device=pool.device)
        elif telemetry not in (True, False, None):
            self.cert_log = telemetry
        self.gate = None
        if repair is not None:
            if not cert.enabled:
                raise ValueError("repair: the gate needs certificates (cert.enabled=True)")
            if pool.allocator.dither_key != "slot":
                raise ValueError("repair: the gate tracks exact entries by slot epoch; use "
                                 "CacheConfig(dither_key='slot') with gating")
            from witcert.runtime.repair import Gate

            self.gate = Gate(pool, repair, tau=cert.tau, kv_dtype=kv_dtype, check=gate_check)
        self.decode_steps = 0
        self.budget_steps = 0  # step indices of the risk allocation taken (decode + extend)
        self.det_fallback_steps = 0
        self._seen = 0
        self._seq_ids: list[int] | None = None
        self._plan: _Plan | None = None
        self._handoff: tuple[int, torch.Tensor] | None = None
        self._nonfinite = torch.zeros((), dtype=torch.int64, device=pool.device)
        self._decode_pad = torch.zeros((), dtype=torch.int64, device=pool.device)
        self._static = None  # witcert.hf.static.StaticDecode while in static decode mode

    @classmethod
    def from_model(cls, model, *, quant, cache, cert: CertConfig, outlier_idx=None,
                   backup_dtype: torch.dtype = torch.float16, **kwargs):
        """Build the pool from ``model``'s geometry and device, then the cache (``kwargs`` go
        to ``__init__``; ``backup_dtype``: dtype of the exact host backup; ``kv_dtype``
        defaults to the model's dtype)."""
        kwargs.setdefault("kv_dtype", model.dtype)
        text = model.config.get_text_config(decoder=True)
        check_supported(text)
        geo = AttentionGeometry.of(text)
        pool = PagedPool(num_layers=geo.num_layers, num_kv_heads=geo.num_kv_heads,
                         head_dim=geo.head_dim, quant=quant, cache=cache, device=model.device,
                         outlier_idx=outlier_idx, backup_dtype=backup_dtype)
        return cls(pool=pool, cert=cert, config=model.config, **kwargs)

    # ---- transformers Cache API ----------------------------------------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Record the hand-off for the witcert attention function; returns the new exact K/V."""
        if self._handoff is not None:
            self._handoff = None
            raise RuntimeError(
                "the previous layer's attention did not go through WitCertCache: the model must "
                f"run with attn_implementation={_attn.ATTN_NAME!r} (witcert.hf.register())")
        B, H, T, D = key_states.shape
        if (H, D) != (self.pool.num_kv_heads, self.pool.head_dim) or value_states.shape != key_states.shape:
            raise ValueError(f"key/value [B, Hkv, T, D] = {tuple(key_states.shape)} / "
                             f"{tuple(value_states.shape)} do not match the pool "
                             f"(Hkv={self.pool.num_kv_heads}, D={self.pool.head_dim})")
        if key_states.device != self.pool.device:
            raise ValueError(f"key/value on {key_states.device}, pool on {self.pool.device}")
        if layer_idx == 0:
            self._plan = None
        self._handoff = (layer_idx, key_states)
        _attn.set_active_cache(self)
        return key_states, value_states

    def take_handoff(self, layer_idx: int, key: torch.Tensor) -> bool:
        """True (and consumed) iff ``key`` is the tensor ``update`` just returned for ``layer_idx``."""
        h = self._handoff
        if h is None or h[0] != layer_idx or h[1] is not key:
            return False
        self._handoff = None
        return True

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._seen

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self._seen + query_length, 0

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1

    def reset(self) -> None:
        """Free every sequence's pages (their slot epochs are bumped) and start empty."""
        for sid in self._seq_ids or []:
            self.pool.allocator.free(sid)
        self._seq_ids, self._seen, self._plan, self._handoff = None, 0, None, None
        self._static = None
        if self.gate is not None:
            self.gate.new_request()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("WitCertCache cannot be cropped (assisted decoding is not supported)")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("WitCertCache does not support expanding a filled cache")

    def batch_select_indices(self, indices) -> None:
        raise NotImplementedError("WitCertCache does not support selecting batch rows")

    # ---- planning (host side, once per forward) ------------------------------------------
    def _make_plan(self, B: int, T: int, mask2d: torch.Tensor | None) -> _Plan:
        alloc = self.pool.allocator
        if self._seq_ids is None:
            self._seq_ids = [alloc.new_seq_id() for _ in range(B)]
        elif len(self._seq_ids) != B:
            raise ValueError(f"batch size changed from {len(self._seq_ids)} to {B}; use a new cache")
        kind = "prefill" if self._seen == 0 else ("decode" if T == 1 else "extend")
        self.pool.flush_backup_(wait=False)
        if kind == "decode":
            if mask2d is not None:  # generate never pads a decode token; count it if a caller does
                self._decode_pad += (~mask2d[:, -1]).sum()
            slots, slots_host = alloc.allocate_flat(self._seq_ids, [1] * B)
            plan = _Plan(kind=kind, B=B, T=T, counts=[1] * B, slots=slots, slots_host=slots_host)
            plan.block_table = alloc.block_table(self._seq_ids)
            plan.seq_lens = alloc.seq_lens(self._seq_ids)
            self._plan_budget(plan)
        else:
            real = None if mask2d is None else mask2d[:, -T:]
            real_host = torch.ones(B, T, dtype=torch.bool) if real is None else real.cpu()
            counts = real_host.sum(1).tolist()
            prefix = [alloc.slots(s) for s in self._seq_ids] if kind == "extend" else []
            slots, slots_host = alloc.allocate_flat(self._seq_ids, counts)
            dev = self.pool.device
            plan = _Plan(kind=kind, B=B, T=T, counts=counts, slots=slots, slots_host=slots_host,
                         real=real, prefix_slots=prefix,
                         write_idx=None if real is None else
                         to_device(real_host.flatten().nonzero().squeeze(1), dev))
            if kind == "extend":
                plan.real_pos = [to_device(real_host[b].nonzero().squeeze(1), dev) for b in range(B)]
                if self.cert.enabled:
                    plan.step, plan.cert, dls = self._take_budget(T)
                    plan.delta_loc = to_device(torch.tensor(dls, dtype=torch.float64), dev)
        self._seen += T
        return plan

    def _plan_budget(self, plan: _Plan) -> None:
        """Risk budget of this decode step into ``plan`` (see ``_step_budget``)."""
        plan.step, plan.cert, dl = self._step_budget()
        plan.delta_loc = to_device(torch.full((plan.B,), dl, dtype=torch.float32), self.pool.device)

    def _step_budget(self) -> tuple[int, CertConfig, float]:
        """Count one decode step; its ``(step, cert config, delta_loc)`` (docs/MATH.md §4),
        host-only. Past a fixed horizon the budget is spent: the step falls back to the
        deterministic radius, valid with no budget."""
        self.decode_steps += 1
        step, cert, dls = self._take_budget(1)
        return step, cert, dls[0]

    def _take_budget(self, n: int) -> tuple[int, CertConfig, list[float]]:
        """Take the next ``n`` step indices of the risk allocation (a decode step takes one, a
        certified extend chunk one per column, docs/MATH.md §4): ``(last index, cert config,
        delta_loc per index)``. When the last index is past a fixed horizon the whole group
        uses the deterministic radius (counted in ``det_fallback_steps``)."""
        first, cert = self.budget_steps + 1, self.cert
        self.budget_steps += n
        if cert.allocation == "fixed" and self.budget_steps > cert.horizon and cert.radius != "det":
            cert = cert.replace(radius="det")
            self.det_fallback_steps += n
        dls = []
        for step in range(first, self.budget_steps + 1):
            budget_step = step if cert.allocation == "anytime" else min(step, cert.horizon)
            dls.append(delta_local(delta=cert.delta, num_layers=self.pool.num_layers,
                                   num_q_heads=self.num_q_heads, allocation=cert.allocation,
                                   horizon=cert.horizon, step=budget_step))
        return self.budget_steps, cert, dls

    def set_cert(self, cert: CertConfig) -> None:
        """Use ``cert`` for the following decode steps (e.g. certificates off, then on again,
        on one filled cache in a benchmark). The step count of the risk budget carries on;
        the ``CertLog`` made at construction (if any) keeps collecting."""
        _check_cert(cert, self.pool)
        if self.gate is not None and not cert.enabled:
            raise ValueError("set_cert: the repair gate needs certificates (cert.enabled=True)")
        self.cert = cert

    # ---- per-layer work ------------------------------------------------------------------
    def attend(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               mask2d: torch.Tensor | None, *, scaling: float) -> torch.Tensor:
        """Attention of one layer; query ``[B, Hq, T, D]`` post-RoPE, key/value
        ``[B, Hkv, T, D]`` exact. Returns ``[B, T, Hq, D]`` in the query dtype."""
        if self._static is not None:
            plan = self._static_plan(layer_idx, query, mask2d)
        elif layer_idx == 0 or self._plan is None:
            self._plan = plan = self._make_plan(query.shape[0], query.shape[2], mask2d)
        else:
            plan = self._plan
        if plan.kind == "decode":
            self._write(layer_idx, key, value, plan)
            return self._decode(layer_idx, query, plan, scaling)
        if plan.kind == "prefill":
            out = _prefill_attention(query, key, value, real=plan.real, scaling=scaling)
        else:
            out = self._extend(layer_idx, query, key, value, plan, scaling)
        self._write(layer_idx, key, value, plan)
        return out

    def _write(self, layer_idx: int, key: torch.Tensor, value: torch.Tensor, plan: _Plan) -> None:
        B, H, T, D = key.shape
        k = key.transpose(1, 2).reshape(B * T, H, D)
        v = value.transpose(1, 2).reshape(B * T, H, D)
        if plan.write_idx is not None:
            k, v = k.index_select(0, plan.write_idx), v.index_select(0, plan.write_idx)
        if k.shape[0] == 0:
            return
        self._nonfinite += (~torch.isfinite(k)).any(-1).sum() + (~torch.isfinite(v)).any(-1).sum()
        _backend.write_kv_(self.pool.layers[layer_idx], k, v, slots=plan.slots)
        st = self._static
        if st is None:
            self.pool.backup_write_(layer_idx, k, v, slots_host=plan.slots_host)
        elif st.k_stage is not None:  # device copies now, the host backup after the step
            st.k_stage[layer_idx].copy_(k)
            st.v_stage[layer_idx].copy_(v)

    def _decode(self, layer_idx: int, query: torch.Tensor, plan: _Plan, scaling: float) -> torch.Tensor:
        q = query[:, :, 0, :].to(torch.float32)
        obs = self.observer
        layer = self.pool.layers[layer_idx]
        gate = self.gate
        if gate is not None:  # deferred repairs (check="step") land before layer 0 reads
            gate.before_decode(layer)
        terms = {} if gate is not None and self._static is None else None
        out = _backend.decode_attention(
            q, layer, plan.block_table, plan.seq_lens,
            page_size=self.pool.page_size, sm_scale=scaling, cert=plan.cert,
            delta_loc=plan.delta_loc, num_splits=self.num_splits,
            return_radius=bool(getattr(obs, "wants_radius", False)), terms=terms,
            exact_copy=None if gate is None else gate.exact_copy(layer_idx))
        if gate is not None:  # eager, outside any captured graph (docs/GATING.md)
            gate.recompute_rows = terms.get("backend") not in ("ref", "native") if terms \
                is not None else not _backend.reads_exact(q, layer)
            out = gate.after_decode(out, q, layer, plan.block_table, plan.seq_lens,
                                    page_size=self.pool.page_size, sm_scale=scaling,
                                    cert=plan.cert, delta_loc=plan.delta_loc, terms=terms)
        st = self._static
        if st is not None:  # device-only: this may be a CUDA graph being captured
            if st.certs is not None and out.cert is not None:
                st.certs[layer_idx].copy_(out.cert)
                if layer_idx == self.pool.num_layers - 1:
                    self.cert_log.fold_step_(st.certs)
        elif self.cert_log is not None and out.cert is not None:
            self.cert_log.record_(layer_idx, out.cert)
            if layer_idx == self.pool.num_layers - 1:
                self.cert_log.end_step_()
        if obs is not None:
            if plan.slots_per_seq is None:
                plan.slots_per_seq = [self.pool.allocator.slots(s) for s in self._seq_ids]
            obs.on_decode(layer_idx=layer_idx, q=q, out=out, slots_per_seq=plan.slots_per_seq,
                          pool=self.pool)
        return out.out[:, None].to(query.dtype)

    def _extend(self, layer_idx: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                plan: _Plan, scaling: float) -> torch.Tensor:
        """Extend of every sequence's real new tokens. Certified (``plan.cert``): a non-finite
        K/V row is read as 0 with radius +inf (its certificate says so) and the certificates
        ``[n, Hq]`` go to the ``CertLog`` as prefill records; uncertified: non-finite entries
        read as 0."""
        B, Hq, T, D = query.shape
        out = query.new_zeros(B, T, Hq, D)
        zero = torch.zeros((), dtype=key.dtype, device=key.device)
        layer = self.pool.layers[layer_idx]
        for b in range(B):
            if plan.counts[b] == 0:
                continue
            pos = plan.real_pos[b]
            q = query[b].index_select(1, pos).transpose(0, 1)  # [n, Hq, D]
            k = key[b].index_select(1, pos).transpose(0, 1)  # [n, Hkv, D]
            v = value[b].index_select(1, pos).transpose(0, 1)
            if plan.cert is not None:
                res = _backend.extend_attention(q, k, v, layer, plan.prefix_slots[b], sm_scale=scaling,
                                                cert=plan.cert, delta_loc=plan.delta_loc.index_select(0, pos))
                o = res.out
                if self.cert_log is not None:
                    self.cert_log.record_prefill_(layer_idx, res.cert)
            else:
                k = torch.where(torch.isfinite(k), k, zero)
                v = torch.where(torch.isfinite(v), v, zero)
                o = _backend.extend_attention(q, k, v, layer, plan.prefix_slots[b], sm_scale=scaling)
            out[b].index_copy_(0, pos, o.to(out.dtype))
        return out

    # ---- reporting -----------------------------------------------------------------------
    def stats(self) -> dict:
        """Host-side counters (one sync): steps, fallbacks, non-finite writes, pool usage."""
        alloc = self.pool.allocator
        return {
            "decode_steps": self.decode_steps,
            "budget_steps": self.budget_steps,
            "radius": self.cert.radius,
            "allocation": self.cert.allocation,
            "horizon": self.cert.horizon if self.cert.allocation == "fixed" else None,
            "det_fallback_steps": self.det_fallback_steps,
            "nonfinite_token_heads": int(self._nonfinite),
            "decode_pad_tokens": int(self._decode_pad),
            "tokens_stored": sum(alloc.seq_len(s) for s in self._seq_ids or []),
            "pages_used": alloc.num_pages - alloc.num_free_pages,
            "gate": None if self.gate is None else self.gate.summary(),
        }


def _check_cert(cert: CertConfig, pool: PagedPool) -> None:
    if cert.enabled and cert.radius != "det" and not pool.compressor.has_prob_radius:
        raise ValueError(f"cert.radius={cert.radius!r} needs a dither method (the probabilistic "
                         f"radius, docs/MATH.md §2b); {pool.quant.method!r} supports radius='det' only")


def _prefill_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *,
                       real: torch.Tensor | None, scaling: float) -> torch.Tensor:
    """Exact causal attention of a prefill (``exact_attention``'s contract, [B, T, Hq, D]).

    On CUDA without padding the causal mask is left to SDPA (``is_causal``: flash
    attention, GQA without repeating K/V) instead of a materialised [T, T] mask, which at
    128k tokens would take 16 GiB and push SDPA to its O(T^2) math kernel. Elsewhere, and
    with padding, ``exact_attention`` (unchanged CPU behaviour).
    """
    if real is not None or not query.is_cuda or query.shape[2] != key.shape[2]:
        return _attn.exact_attention(query, key, value, key_real=real, scaling=scaling)
    zero = torch.zeros((), dtype=key.dtype, device=key.device)
    key = torch.where(torch.isfinite(key), key, zero)
    value = torch.where(torch.isfinite(value), value, zero)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, is_causal=True, scale=scaling, enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2)
