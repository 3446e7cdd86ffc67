"""``WitcertTritonAttnBackend``: SGLang's Triton attention backend over the witcert pool.

A subclass of ``TritonAttnBackend`` registered as ``--attention-backend witcert``. SGLang's
``__init__`` (buffers, split count, runner wiring) is kept; the per-step plan and both
forward paths are witcert's:

- ``init_forward_metadata`` (plan, once per forward, outside any graph): physical KV ids
  from SGLang's ``kv_index_translator.pack_read_stream`` (as the Triton backend does), then
  a block table ``[B, pages]`` (``slot = block_table[b, t // P] * P + t % P``), int32
  lengths and the per-request risk budget ``delta_loc`` (anytime allocation indexed by
  the attended length). Also closes the previous decode step of the certificate log.
- ``forward_decode``: writes the new token's K/V through the pool (witcert write kernel),
  then ``witcert.runtime.dispatch.decode_attention`` (through the gate with ``WITCERT_SGLANG_GATE``:
  ``witcert.runtime.repair.Gate``, the HF / vLLM gate, repairs every certificate above tau from
  the exact host copy; CPU pools only): stage 1 split-KV partials ``(m, l, acc, a,
  vmax, vw)`` per (request, head, split), stage 2 merge with log-sum-exp weights, the
  certificate partial sums ``a`` merged with the same weights. The split count is SGLang's
  ``max_kv_splits`` (``--triton-attention-num-kv-splits``) unless
  ``WITCERT_SGLANG_SPLITS`` says otherwise. Certificates go to the telemetry every step.
- ``forward_extend``: writes the new tokens, then per request
  ``witcert.runtime.dispatch.extend_attention``: the new (exact) tokens attend causally to each
  other and to the dequantized prefix, with a certificate per (new token, query head)
  (budget: the anytime allocation at the token's position, as a decode query's) that the
  telemetry counts as prefill records, apart from the decode certificates.

Refused at construction or first use (clear error, never a silent wrong answer):
MLA, speculative decoding, sliding window, logit soft-capping, attention sinks, cross
attention, DCP, CUDA graphs and a pool that is not ``WitcertMHATokenToKVPool``.
"""

from __future__ import annotations

import math

import torch
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

from witcert.runtime import dispatch as wbackend
from witcert.integrations.sglang import settings as _settings
from witcert.integrations.sglang.accounting import stock_cell_size
from witcert.integrations.sglang.pool import WitcertMHATokenToKVPool
from witcert.integrations.sglang.telemetry import SchedulerTelemetry


class _Plan:
    """Per-forward metadata. Decode: block_table int32 [B, pages], seq_lens int32 [B],
    delta_loc f32 [B]. Extend: prefix_ids int64 [sum prefix], prefix/extend lens (host),
    delta_loc f64 [sum extend] (per new token)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


class WitcertTritonAttnBackend(TritonAttnBackend):
    def __init__(self, model_runner, *args, **kwargs):
        pool = model_runner.token_to_kv_pool
        if not isinstance(pool, WitcertMHATokenToKVPool):
            raise TypeError(f"--attention-backend {_settings.BACKEND_NAME} needs the witcert KV "
                            f"pool, got {type(pool).__name__} (is the witcert plugin loaded? "
                            "set SGLANG_PLUGINS to include 'witcert')")
        super().__init__(model_runner, *args, **kwargs)
        if self.use_mla or self.dcp_size > 1 or self.topk or self.num_draft_tokens:
            raise NotImplementedError("witcert backend: MLA, DCP and speculative decoding are "
                                      "not supported")
        s = _settings.load()
        self.witcert_settings = s
        self.witcert_cert = s.cert
        self.witcert_splits = {"sglang": self.max_kv_splits, "auto": None}.get(s.splits, s.splits)
        mc = model_runner.model_config
        self.witcert_num_layers = int(getattr(mc, "num_hidden_layers", 0) or pool.layer_num)
        self.witcert_num_q_heads = int(mc.num_attention_heads)
        rows = pool.witcert.num_slots
        stock = stock_cell_size(num_layers=pool.layer_num, num_kv_heads=pool.head_num,
                                head_dim=pool.head_dim, itemsize=pool.dtype.itemsize)
        budget = rows * pool.witcert_cell_size
        self.telemetry = SchedulerTelemetry(
            num_layers=pool.layer_num, num_q_heads=self.num_head, tau=s.cert.tau,
            device=pool.witcert.epochs.device, export_every=s.export_every,
            capacity=(rows, budget // stock), bytes_saved=rows * stock - budget,
            port=None if s.metrics_port is None else s.metrics_port + _tp_rank())
        # the gate (WITCERT_SGLANG_GATE): the HF / vLLM gate over this pool, around the decode
        self.gate, self.witcert_ops, self._gate_path_ok = None, wbackend, False
        if s.repair.mode != "off":
            if pool.witcert.device.type != "cpu":
                raise NotImplementedError(f"{_settings.ENV_GATE}={s.repair.mode}: the gate needs "
                                          "a CPU pool (the GPU kernels do not read exact "
                                          "entries yet)")
            from witcert.runtime.repair import Gate

            self.gate = Gate(pool.witcert, s.repair, tau=s.cert.tau, kv_dtype=pool.dtype,
                             check="layer")
            self.witcert_ops = self.gate.wrap(wbackend)
            self.telemetry.gate = self.gate
        self.forward_metadata = None

    # ---- plan ----------------------------------------------------------------------------
    def init_forward_metadata(self, forward_batch):
        self.telemetry.end_step()
        self.token_to_kv_pool.witcert.flush_backup_(wait=False)
        mode = forward_batch.forward_mode
        if mode.is_idle():
            self.forward_metadata = None
            return
        if forward_batch.spec_info is not None or not (mode.is_decode() or mode.is_extend()):
            raise NotImplementedError(f"witcert backend: forward mode {mode} is not supported")
        if mode.is_decode():
            self.forward_metadata = self._plan_decode(forward_batch)
        else:
            self.forward_metadata = self._plan_extend(forward_batch)

    def _physical_ids(self, forward_batch, lens: torch.Tensor, total: int):
        bs = lens.shape[0]
        indptr = torch.zeros(bs + 1, dtype=torch.int32, device=self.device)
        indptr[1:] = torch.cumsum(lens, dim=0)
        ids = torch.empty(max(total, 1), dtype=torch.int64, device=self.device)
        # the ids SGLang's own Triton decode reads with: physical, or virtual ids of a pool
        # that never moves slots (they coincide there; no DCP here)
        self.kv_index_translator.pack_read_stream(
            forward_batch.kv_loc_plan, req_pool_indices=forward_batch.req_pool_indices[:bs],
            seq_lens=lens, indptr=indptr, out=ids)
        return indptr, ids

    def _plan_decode(self, forward_batch) -> _Plan:
        bs = forward_batch.batch_size
        seq_lens = forward_batch.seq_lens[:bs].to(torch.int32)
        lens_cpu = forward_batch.seq_lens_cpu
        max_len = int(lens_cpu[:bs].max()) if lens_cpu is not None else self.max_context_len
        total = int(lens_cpu[:bs].sum()) if lens_cpu is not None else bs * self.max_context_len
        indptr, ids = self._physical_ids(forward_batch, seq_lens, total)
        P = self.page_size
        pos = torch.arange(-(-max_len // P), device=self.device, dtype=torch.int64) * P
        pos = torch.minimum(pos[None, :], (seq_lens.to(torch.int64) - 1)[:, None])
        block_table = (ids[indptr[:-1].to(torch.int64)[:, None] + pos] // P).to(torch.int32)
        # anytime allocation (docs/MATH.md §4): step index = attended length, distinct at every step
        n = seq_lens.to(torch.float64)
        lh = self.witcert_num_layers * self.witcert_num_q_heads
        delta_loc = (6.0 * self.witcert_cert.delta / (math.pi ** 2) / lh / (n * n)).to(torch.float32)
        return _Plan(decode=True, block_table=block_table, seq_lens=seq_lens, delta_loc=delta_loc)

    def _plan_extend(self, forward_batch) -> _Plan:
        bs = forward_batch.batch_size
        prefix_cpu = [int(x) for x in forward_batch.extend_prefix_lens_cpu[:bs]]
        extend_cpu = [int(x) for x in forward_batch.extend_seq_lens_cpu[:bs]]
        prefix = forward_batch.extend_prefix_lens[:bs].to(torch.int32)
        _, ids = self._physical_ids(forward_batch, prefix, sum(prefix_cpu))
        # anytime allocation (docs/MATH.md §4): step index = the new token's 1-based position
        n = torch.tensor([p + j + 1 for p, t in zip(prefix_cpu, extend_cpu) for j in range(t)],
                         dtype=torch.float64)
        lh = self.witcert_num_layers * self.witcert_num_q_heads
        delta_loc = (6.0 * self.witcert_cert.delta / (math.pi ** 2) / lh / (n * n)).to(self.device)
        return _Plan(decode=False, prefix_ids=ids, prefix_cpu=prefix_cpu, extend_cpu=extend_cpu,
                     delta_loc=delta_loc)

    # ---- run -----------------------------------------------------------------------------
    def _check_layer(self, layer, kwargs) -> None:
        if any(kwargs.get(k) is not None for k in ("sinks", "score_mod", "aux_tensors")):
            raise NotImplementedError("witcert backend: attention sinks / score mods are not supported")
        if getattr(layer, "logit_cap", 0) or (getattr(layer, "sliding_window_size", -1) or -1) > 0 \
                or getattr(layer, "is_cross_attention", False):
            raise NotImplementedError("witcert backend: logit cap, sliding window and cross "
                                      "attention are not supported")
        if layer.qk_head_dim != layer.v_head_dim:
            raise NotImplementedError("witcert backend: qk_head_dim must equal v_head_dim")

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        self._check_layer(layer, kwargs)
        plan = self.forward_metadata
        pool = self.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)
        hq, d = layer.tp_q_head_num, layer.qk_head_dim
        q3 = q.reshape(-1, hq, d)
        lkv = pool.layer_kv(layer.layer_id)
        if self.gate is not None and not self._gate_path_ok:
            # checked once: the path (device, WITCERT_BACKEND, pool) stays the same
            if not wbackend.reads_exact(q3, lkv):
                raise NotImplementedError(f"{_settings.ENV_GATE}: the gate needs a decode path "
                                          "that reads exact entries (native C or the "
                                          "reference; WITCERT_BACKEND="
                                          f"{wbackend.backend_for(q3, lkv)!r})")
            self._gate_path_ok = True
        res = self.witcert_ops.decode_attention(
            q3, lkv, plan.block_table, plan.seq_lens,
            page_size=self.page_size, sm_scale=layer.scaling, cert=self.witcert_cert,
            delta_loc=plan.delta_loc, num_splits=self.witcert_splits)
        self.telemetry.record(layer.layer_id - pool.start_layer, res.cert)
        self.last_decode = res  # for tests and debugging: the last layer's DecodeOut
        return res.out.to(q.dtype).reshape(-1, hq * d)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        self._check_layer(layer, kwargs)
        if k is None or v is None:
            raise NotImplementedError("witcert backend: extend without new K/V is not supported")
        plan = self.forward_metadata
        pool = self.token_to_kv_pool
        if save_kv_cache:
            pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)
        hq, hkv, d = layer.tp_q_head_num, layer.tp_k_head_num, layer.qk_head_dim
        q3, k3, v3 = q.reshape(-1, hq, d), k.reshape(-1, hkv, d), v.reshape(-1, hkv, d)
        lkv = pool.layer_kv(layer.layer_id)
        o = q.new_empty(q3.shape)
        certs = []
        tok = pre = 0
        for np_, nt in zip(plan.prefix_cpu, plan.extend_cpu):
            if nt:
                res = wbackend.extend_attention(
                    q3[tok:tok + nt], k3[tok:tok + nt], v3[tok:tok + nt], lkv,
                    plan.prefix_ids[pre:pre + np_], sm_scale=layer.scaling, causal=True,
                    cert=self.witcert_cert, delta_loc=plan.delta_loc[tok:tok + nt])
                o[tok:tok + nt] = res.out
                if res.cert is not None:
                    certs.append(res.cert)
            tok, pre = tok + nt, pre + np_
        if certs:
            self.telemetry.record_prefill(layer.layer_id - pool.start_layer, torch.cat(certs))
        self.last_extend_cert = torch.cat(certs) if certs else None  # for tests and debugging
        return o.reshape(-1, hq * d)

    def init_cuda_graph_state(self, *args, **kwargs):
        raise NotImplementedError("witcert backend: run SGLang with --disable-cuda-graph "
                                  "(witcert plans its metadata per step)")


def _tp_rank() -> int:
    try:
        from sglang.srt.runtime_context import get_parallel

        return int(get_parallel().attn_tp_rank)
    except Exception:  # noqa: BLE001 - no parallel context (unit tests): rank 0
        return 0
