"""Gating and repair: when ``cert > tau``, make exact K/V entries of the host backup live.

Policies (``RepairPolicy.mode``):
- ``block``: for a gated (layer, sequence, query head), make exact the ``block_tokens``-token
  blocks of its KV head in decreasing order of their contribution
  ``sum_{t in block} p^_t (e^{u_t} - 1)`` (docs/MATH.md §1, block decomposition), as few as
  the one-pass plan (``witcert.runtime.repair_plan``) says bring ``cert <= tau``; the row is then
  recomputed and planned again while a head is still above tau.
- ``head``: whole-head fallback, every token of the KV head at once (the baseline).
- ``off``: observe only (the gate counts, nothing is made exact).

Persistence: a repaired (slot, KV head) entry stays exact for the rest of the request. The
entries live in ``witcert.runtime.exact.ExactCopy`` per layer, the one layout the HF gate, the vLLM
gate and the native C decode share; here its values ARE the pool's exact host backup (so
making an entry exact copies nothing) and only the flags, epochs and, for a backup that
rounds the model's K/V, the rounding witnesses are the gate's (its radius is that witness,
0 when the backup holds the model's K/V dtype exactly). An entry is tied to the slot's
epoch, so a freed and reused slot never reads a stale exact value.

What runs where: the backend decode is handed the layer's copy per call
(``Gate.exact_copy(layer)``, the dispatch's ``exact_copy=``; the pool never carries it). The
native C decode reads it, and the reference is handed its live entries as plain data
(``witcert.runtime.dispatch.exact_entries``, ``exact=``): exact logit and value, the witness
radius; the Triton kernels do not, so behind them the gate recomputes the rows that own
exact entries with the reference every step. ``Gate.decode_attention`` then runs eagerly,
outside any graph: (1) that recomputation, behind the kernels only; (2) the gate check
``(cert > tau).any()``; (3) only when it fires, the repair of the fired rows
(``witcert.runtime.repair_rows``: on the native path one C decode of the row with its logits and
radii, the plan, the entries marked, one C decode of the repaired row). Cost when nothing
fires: one elementwise compare and one ``any`` per layer. On a CPU pool that is free; on a
GPU pool the ``bool(...)`` of (2) is one device-to-host sync per layer (the repair must
finish before the next layer reads this layer's output). See docs/GATING.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from witcert.config import CertConfig, RepairPolicy
from witcert.runtime.exact import ExactCopy, copy_rounds, rounding_witness  # noqa: F401  (re-export)
from witcert.ref import attention as _ref_attention
from witcert.ref.attention import DecodeOut
from witcert.runtime.repair_rows import RowCtx, RowRepair

INF = float("inf")


def _finite(x: float) -> float:
    return x if x == x and abs(x) != INF else 0.0


class ExactStore:
    """The exact entries of every layer of one pool: ``copies[layer]`` is an ``ExactCopy``
    whose K/V are the pool's exact host backup of that layer (shared, not copied), with the
    flags and epochs on the pool's device; when the backup may round the model's K/V
    (``kv_dtype``) live entries carry their rows' rounding witnesses. ``rows``: entries
    made exact so far. ``capacity`` is accepted for compatibility and unused."""

    def __init__(self, pool, *, kv_dtype: torch.dtype | None = None, capacity: int | None = None):
        if pool.backup is None:
            raise ValueError("repair needs the exact host backup (CacheConfig.exact_backup=True)")
        self.pool, self.kv_dtype = pool, kv_dtype
        dt = pool.backup.k[0].dtype
        rounds = copy_rounds(dt, kv_dtype=kv_dtype)
        self.copies = [ExactCopy(num_slots=pool.num_slots, num_kv_heads=pool.num_kv_heads,
                                 head_dim=pool.head_dim, dtype=dt, epochs=pool.epochs,
                                 k=pool.backup.k[i], v=pool.backup.v[i], rounds=rounds,
                                 kv_dtype=kv_dtype)
                       for i in range(pool.num_layers)]
        self.rows = 0

    def live(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(slots int64 [n, Hkv] (the entries' rows in the copy), live bool [n, Hkv]) for
        ``slots`` int64 [n]."""
        cp = self.copies[layer]
        s = slots.to(cp.exact.device)
        return s[:, None].expand(-1, cp.exact.shape[1]), cp.live(s)

    def page_in_(self, layer: int, slots: torch.Tensor, kv_head: int) -> int:
        """Make the entries (``slots`` int64 [n], ``kv_head``) exact. Entries already live
        are skipped (made exact at most once); so are entries whose backup is not finite
        (they stay flagged). Returns the number of entries added."""
        cp = self.copies[layer]
        s = slots.to(cp.exact.device)
        new = s[~cp.live(s)[:, kv_head]]
        if new.numel() == 0:
            return 0
        new = new[cp.finite(new, kv_head).to(new.device)]
        n = new.numel()
        if n:
            cp.mark_(new, kv_head)
            self.rows += n
        return n

    def mark_(self, layer: int, slots: torch.Tensor, kv_head: int) -> int:
        """``page_in_`` for entries the caller knows to be neither live nor non-finite in the
        backup (the repair planner checked both): marks them without checking again."""
        n = slots.numel()
        if n:
            self.copies[layer].mark_(slots, kv_head)
            self.rows += n
        return n

    def entry_bytes(self) -> int:
        """Bytes one exact (slot, KV head) entry stands for: K and V rows at the backup's
        precision, flag and epoch."""
        return self.copies[0].entry_bytes()

    def bytes_used(self) -> int:
        """Bytes the exact entries stand for (``rows * entry_bytes``)."""
        return self.rows * self.entry_bytes()

    def bytes_allocated(self) -> int:
        """Bytes the gate allocated: flags and epochs of every layer (the values are the
        pool's host backup, counted in ``PagedPool.backup_bytes``)."""
        return sum(cp.flag_bytes() for cp in self.copies)


@dataclass
class GateStats:
    """Host counters; touched only when the gate fires (no sync on the common path)."""

    steps: int = 0
    steps_gated: int = 0
    heads_gated: int = 0          # (layer, seq, query head) records with cert > tau
    heads_repaired: int = 0       # of those, cert <= tau after repair
    blocks_paged: int = 0
    entries_paged: int = 0        # (slot, KV head) entries made exact from the backup
    bytes_paged: int = 0          # their K and V rows at the backup's precision
    cert_before_sum: float = 0.0  # finite certs only
    cert_after_sum: float = 0.0
    cert_before_max: float = 0.0
    cert_after_max: float = 0.0
    events: list = field(default_factory=list)  # (step, layer, b, h, before, after, [blocks paged])

    def summary(self) -> dict:
        g = self.heads_gated
        return {"steps": self.steps, "steps_gated": self.steps_gated,
                "gated_step_fraction": self.steps_gated / self.steps if self.steps else None,
                "heads_gated": g, "heads_repaired": self.heads_repaired,
                "blocks_paged": self.blocks_paged, "entries_paged": self.entries_paged,
                "bytes_paged": self.bytes_paged,
                "cert_before_mean": self.cert_before_sum / g if g else None,
                "cert_after_mean": self.cert_after_sum / g if g else None,
                "cert_before_max": self.cert_before_max, "cert_after_max": self.cert_after_max}


class Gate:
    """The certificate gate of one pool and one request batch.

    pool: the ``PagedPool`` (needs its exact backup); policy: ``RepairPolicy``;
    tau: threshold (``CertConfig.tau``); kv_dtype: dtype of the K/V the model writes
    (decides whether the backup is exact, see ``rounding_witness``).
    ``wrap(ops)`` returns a backend whose ``decode_attention`` is gated.
    """

    CHECKS = ("auto", "layer", "step")

    def __init__(self, pool, policy: RepairPolicy, *, tau: float, kv_dtype: torch.dtype | None = None,
                 check: str = "auto", max_events: int = 10000):
        if not (tau > 0 and math.isfinite(tau)):
            raise ValueError(f"tau: {tau} must be finite and > 0")
        if check not in self.CHECKS:
            raise ValueError(f"check: {check!r} not in {self.CHECKS}")
        if check == "auto":  # a per-layer read is free on the CPU, a sync per layer on a GPU
            check = "layer" if pool.device.type == "cpu" else "step"
        self.pool, self.policy, self.tau, self.check = pool, policy, float(tau), check
        self._deferred: list | None = None  # check="step": this step's (layer, cert, args)
        self._pending = None                # check="step": (host flag, event, deferred) of the last step
        self._flag_host = self._flag_event = None
        self.store = ExactStore(pool, kv_dtype=kv_dtype) if policy.mode != "off" else None
        if self.store is not None:  # the pool's byte accounting counts the store
            pool.exact_store = self.store
        self.stats = GateStats()
        self.max_events = max_events
        self.recompute_rows = False  # set per call by wrap(): True behind the kernels
        self._exact_rows: list[set[int]] = [set() for _ in range(pool.num_layers)]
        self._step_fired = False

    def wrap(self, ops):
        """A backend object like ``ops`` whose ``decode_attention`` goes through the gate.
        Behind anything but the reference or the native decode (``witcert.runtime.dispatch``), rows
        holding exact entries are recomputed every step (the kernels do not read the store)."""
        return _GatedOps(ops, self)

    def new_request(self) -> None:
        """Forget per-request state (batch rows, pending deferred repairs); counters stay.
        The store's entries of freed sequences are already dead (slot epochs moved on)."""
        self._exact_rows = [set() for _ in range(self.pool.num_layers)]
        self._pending = self._deferred = None

    def exact_copy(self, layer: int) -> ExactCopy | None:
        """The ``ExactCopy`` of ``layer`` that decodes behind this gate read (the dispatch's
        ``exact_copy=``), or None (policy ``off``: nothing is ever made exact)."""
        return None if self.store is None else self.store.copies[layer]

    def close(self) -> None:
        """Detach the store from the pool's byte accounting (decodes that are no longer
        handed ``exact_copy(layer)`` read the pool as if never repaired)."""
        if self.store is not None and getattr(self.pool, "exact_store", None) is self.store:
            self.pool.exact_store = None

    # ---- per layer ---------------------------------------------------------------------
    def after_decode(self, out: DecodeOut, q: torch.Tensor, layer_kv, block_table: torch.Tensor,
                     seq_lens: torch.Tensor, *, page_size: int, sm_scale: float, cert: CertConfig,
                     delta_loc, terms: dict | None = None) -> DecodeOut:
        """Apply persistence and the gate to one layer's backend output (see module doc).
        terms: what ``witcert.runtime.dispatch.decode_attention(..., terms=)`` filled for this ``out``
        (the native path's logits and radii): the repair then starts from them instead of
        decoding the fired rows once more."""
        layer = layer_kv.layer
        if layer == 0:
            self.before_decode(layer_kv)
            self.stats.steps += 1
            self._step_fired = False
        if out.cert is None:
            raise ValueError("gating needs the certificate (CertConfig.enabled=True)")
        args = (q, layer_kv, block_table, seq_lens, page_size, sm_scale, cert, delta_loc)
        rows = sorted(self._exact_rows[layer]) if self.recompute_rows else []
        if rows:
            ctx = self._ctx(args)
            out = ctx.replace_rows(out, {b: ctx.row_decode(b) for b in rows})
        if self.check == "step":
            self._defer(layer, out.cert, args)
            return out
        fired = out.cert > self.tau
        if not bool(fired.any()):  # the one check on the common path
            return out
        ctx = self._ctx(args, first=out, terms=terms)
        return ctx.replace_rows(out, self._repair(ctx, out.cert, fired))

    def _ctx(self, args, **kw) -> RowCtx:
        """The layer's ``RowCtx`` (args: q, layer_kv, block_table, seq_lens, page_size,
        sm_scale, cert, delta_loc) with this gate's copy, tau and policy; entries are
        marked through the store (which counts them)."""
        layer = args[1].layer
        mark = None if self.store is None else \
            (lambda slots, kvh: self.store.mark_(layer, slots, kvh))
        return RowCtx(*args, copy=self.exact_copy(layer), tau=self.tau, policy=self.policy,
                      mark=mark, **kw)

    def _repair(self, ctx: RowCtx, cert: torch.Tensor, fired: torch.Tensor) -> dict:
        """Repair the fired (row, head) pairs of one layer; returns {row: recomputed outputs}."""
        if not self._step_fired:
            self.stats.steps_gated += 1
            self._step_fired = True
        if self.policy.mode != "off":
            self.pool.flush_backup_()  # the step's own token may still be staged (CUDA pools)
        new = {}
        for b in fired.any(-1).nonzero().flatten().tolist():
            heads = fired[b].nonzero().flatten().tolist()
            rep = ctx.repair_row(b, heads, cert[b])
            self._account(ctx, b, rep)
            new[b] = rep.outputs
            if self.policy.mode != "off":
                self._exact_rows[ctx.layer].add(b)
        return new

    def _account(self, ctx: RowCtx, b: int, rep: RowRepair) -> None:
        """The gate's counters (and events) of one repaired row."""
        st = self.stats
        st.entries_paged += rep.entries
        if ctx.copy is not None:
            st.bytes_paged += rep.entries * 2 * ctx.copy.k.shape[-1] * ctx.copy.k.element_size()
        for h, blocks in rep.blocks.items():
            before, after = rep.before[h], rep.after[h]
            st.blocks_paged += len(blocks)
            st.heads_gated += 1
            st.heads_repaired += after <= self.tau
            st.cert_before_sum += _finite(before)
            st.cert_after_sum += _finite(after)
            st.cert_before_max = max(st.cert_before_max, before)
            st.cert_after_max = max(st.cert_after_max, after)
            if len(st.events) < self.max_events:
                st.events.append((st.steps, ctx.layer, b, h, before, after, blocks))

    # ---- check="step": one flag per step, read at the next step (no sync in the step) ----
    def before_decode(self, layer_kv) -> None:
        """Called before the backend decodes ``layer_kv``: at layer 0, apply the repairs
        deferred from the previous step so that this step already reads them."""
        if layer_kv.layer == 0 and self._pending is not None:
            self._repair_deferred()

    def _defer(self, layer: int, cert: torch.Tensor, args) -> None:
        """Keep a reference to this layer's cert (no kernel); after the last layer, one
        max over all layers and one non-blocking copy of the flag to pinned memory."""
        if layer == 0 or self._deferred is None:
            self._deferred = []
        self._deferred.append((layer, cert, args))
        if layer != self.pool.num_layers - 1:
            return
        flag = torch.cat([c.reshape(-1) for _, c, _ in self._deferred]).amax() > self.tau
        if flag.is_cuda:
            if self._flag_host is None:
                self._flag_host = torch.empty((), dtype=torch.bool, pin_memory=True)
                self._flag_event = torch.cuda.Event()
            self._flag_host.copy_(flag, non_blocking=True)
            self._flag_event.record()
            self._pending = (self._flag_host, self._flag_event, self._deferred)
        else:
            self._pending = (flag, None, self._deferred)
        self._deferred = None

    def _repair_deferred(self) -> None:
        """Repair what fired on the previous step, with that step's queries (its outputs
        stand as reported); from this step on the repaired entries are in the store."""
        host, event, deferred = self._pending
        self._pending = None
        if event is not None:
            event.synchronize()  # normally already done: generate syncs once per step
        if not bool(host):
            return
        for layer, cert, args in deferred:
            fired = cert > self.tau
            if bool(fired.any()):
                ctx = self._ctx(args)
                cert = torch.stack([ctx.row_decode(b)[2] for b in range(fired.shape[0])])
                now = fired & (cert > self.tau)  # earlier layers' repairs may have covered it
                if bool(now.any()):
                    self._repair(ctx, cert, now)
        self._step_fired = False

    def flush(self) -> None:
        """check="step": apply the repairs pending from the last step now (end of request)."""
        if self._pending is not None:
            self._repair_deferred()

    def bytes_exact(self) -> int:
        return 0 if self.store is None else self.store.bytes_used()

    def summary(self) -> dict:
        s = self.stats.summary()
        s.update(mode=self.policy.mode, block_tokens=self.policy.block_tokens, tau=self.tau,
                 exact_entries=0 if self.store is None else self.store.rows,
                 exact_store_bytes=self.bytes_exact())
        return s


def attach_gate(cache, policy: RepairPolicy, *, kv_dtype: torch.dtype | None = None,
                tau: float | None = None, check: str = "auto") -> Gate:
    """Gate an existing ``WitCertCache`` (same as building it with ``repair=policy``):
    tau defaults to the cache's ``cert.tau``. Returns the gate, also ``cache.gate``."""
    if cache.gate is not None:
        cache.gate.close()
    gate = Gate(cache.pool, policy, tau=cache.cert.tau if tau is None else tau, kv_dtype=kv_dtype,
                check=check)
    cache.gate = gate
    return gate


class _GatedOps:
    """Backend proxy: ``write_kv_``/``extend_attention`` unchanged, decode gated."""

    def __init__(self, ops, gate: Gate):
        self._ops, self.gate = ops, gate

    def _reads_store(self, q, layer_kv) -> bool:
        """Whether this decode read the exact entries (the reference, handed them, or the
        native C path)."""
        if getattr(self._ops, "decode_attention", None) is _ref_attention.decode_attention:
            return True
        reads = getattr(self._ops, "reads_exact", None)  # witcert.runtime.dispatch
        return reads is not None and reads(q, layer_kv)

    def __getattr__(self, name):
        return getattr(self._ops, name)

    def decode_attention(self, q, layer_kv, block_table, seq_lens, *, page_size, sm_scale, cert,
                         delta_loc, num_splits=1, return_radius=False):
        self.gate.before_decode(layer_kv)
        copy = self.gate.exact_copy(layer_kv.layer)
        reads = getattr(self._ops, "reads_exact", None)  # witcert.runtime.dispatch takes terms=
        terms = {} if reads is not None else None
        extra = {} if terms is None else {"terms": terms, "exact_copy": copy}
        if getattr(self._ops, "decode_attention", None) is _ref_attention.decode_attention:
            from witcert.runtime.dispatch import exact_entries  # the bare spec: hand it the entries
            extra["exact"] = exact_entries(copy, block_table, seq_lens, page_size=page_size,
                                           device=q.device)
        out = self._ops.decode_attention(q, layer_kv, block_table, seq_lens, page_size=page_size,
                                         sm_scale=sm_scale, cert=cert, delta_loc=delta_loc,
                                         num_splits=num_splits, return_radius=return_radius,
                                         **extra)
        self.gate.recompute_rows = not self._reads_store(q, layer_kv)
        return self.gate.after_decode(out, q, layer_kv, block_table, seq_lens, page_size=page_size,
                                      sm_scale=sm_scale, cert=cert, delta_loc=delta_loc,
                                      terms=terms)
