"""Gating and repair: when ``cert > tau``, page exact K/V back in from the host backup.

Policies (``RepairPolicy.mode``):
- ``block``: for a gated (layer, sequence, query head), page in repair blocks of
  ``block_tokens`` tokens of its KV head in decreasing order of their contribution
  ``sum_{t in block} p^_t (e^{u_t} - 1)`` (docs/MATH.md §1, block decomposition), recomputing
  ``p^`` and the certificate after each block, and stop as soon as ``cert <= tau``.
- ``head``: whole-head fallback, every token of the KV head at once (the baseline).
- ``off``: observe only (the gate counts, nothing is paged).

Persistence: a paged-in (slot, KV head) entry lives in the pool's ``ExactStore`` for the
rest of the request: its radius is the backup's rounding witness (0 when the backup holds
the model's K/V dtype exactly) and it is never paged in twice. An entry is tied to the
slot's epoch, so a freed and reused slot never reads a stale exact value.

What runs where: the backend decode (Triton kernels or the reference, possibly inside a
captured graph) runs unchanged. ``Gate.decode_attention`` then runs eagerly, outside any
graph: (1) batch rows that already own exact entries in this layer are recomputed with
the reference over the repaired cache (the kernels do not read the store; the reference decode does, through
``LayerKV.exact``, and needs no recomputation); (2) the gate
check ``(cert > tau).any()``; (3) only when it fires, the reference repair loop. Cost when
nothing fires: one elementwise compare and one ``any`` per layer. On a CPU pool that is
free; on a GPU pool the ``bool(...)`` of (2) is one device-to-host sync per layer (the
repair must finish before the next layer reads this layer's output). See docs/GATING.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from witcert.config import CertConfig, RepairPolicy
from witcert.ref import attention as _ref_attention
from witcert.ref.attention import DecodeOut, Partials, token_slots
from witcert.ref.logits import exact_logits_and_radii
from witcert.ref.cert import block_contributions, certificate

INF = float("inf")
_ROUND_UP = 1.0 + 2.0**-20  # slack on the rounding witness (it is itself computed in fp32)


def rounding_witness(x: torch.Tensor, *, kv_dtype: torch.dtype | None) -> torch.Tensor:
    """``w >= ||x_true - x||_2`` per row for ``x`` [n, D] read from a backup that rounded
    ``x_true`` (of ``kv_dtype``) to ``x.dtype`` (round to nearest). 0 when no rounding
    happened: the backup is fp32, or it has the model's own K/V dtype.

    Per element ``|e| <= ur |x_true|`` (normal range) or ``<= sub/2`` (subnormal), with
    ``ur = eps/2``; ``|x_true| <= |x| / (1 - ur)``, so ``||e|| <= ur/(1-ur) ||x|| + sqrt(D) sub/2``.
    """
    if x.dtype == torch.float32 or x.dtype == torch.float64 or x.dtype == kv_dtype:
        return torch.zeros(x.shape[0], dtype=torch.float32, device=x.device)
    fi = torch.finfo(x.dtype)
    ur = fi.eps / 2
    sub = fi.tiny * fi.eps
    n = torch.linalg.vector_norm(x.float(), dim=-1)
    return (n * (ur / (1 - ur)) + math.sqrt(x.shape[-1]) * sub / 2) * _ROUND_UP


class ExactStore:
    """Exact K/V of repaired (slot, KV head) entries, all layers of one pool.

    index: int64 ``[L, num_slots, Hkv]``, row of the entry in ``k``/``v`` or -1.
    k, v: ``[cap, D]`` in the backup dtype; wk, wv: f32 ``[cap]`` rounding witnesses;
    epoch: int64 ``[cap]`` slot epoch at page-in (an entry is live only while it matches).
    Everything lives on the pool's device; rows grow by doubling.
    """

    def __init__(self, pool, *, kv_dtype: torch.dtype | None = None, capacity: int = 256):
        if pool.backup is None:
            raise ValueError("repair needs the exact host backup (CacheConfig.exact_backup=True)")
        self.pool, self.kv_dtype = pool, kv_dtype
        dev, D = pool.device, pool.head_dim
        self.index = torch.full((pool.num_layers, pool.num_slots, pool.num_kv_heads), -1,
                                dtype=torch.int64, device=dev)
        dt = pool.backup.k[0].dtype
        self.k = torch.zeros(capacity, D, dtype=dt, device=dev)
        self.v = torch.zeros(capacity, D, dtype=dt, device=dev)
        self.wk = torch.zeros(capacity, dtype=torch.float32, device=dev)
        self.wv = torch.zeros(capacity, dtype=torch.float32, device=dev)
        self.epoch = torch.full((capacity,), -1, dtype=torch.int64, device=dev)
        self.rows = 0

    def live(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows int64 [n, Hkv] clamped to >= 0, live bool [n, Hkv]) for ``slots`` int64 [n]."""
        r = self.index[layer][slots]
        ok = (r >= 0) & (self.epoch[r.clamp_min(0)] == self.pool.epochs[slots][:, None])
        return r.clamp_min(0), ok

    def _grow(self, need: int) -> None:
        cap = self.k.shape[0]
        if self.rows + need <= cap:
            return
        new = max(2 * cap, self.rows + need)
        for name in ("k", "v", "wk", "wv", "epoch"):
            t = getattr(self, name)
            pad = torch.full((new - cap, *t.shape[1:]), -1 if name == "epoch" else 0,
                             dtype=t.dtype, device=t.device)
            setattr(self, name, torch.cat([t, pad]))

    def page_in_(self, layer: int, slots: torch.Tensor, kv_head: int) -> int:
        """Copy the backup's K/V of (``slots`` int64 [n], ``kv_head``) into the store.
        Entries already live are skipped (paged in at most once); so are entries whose
        backup is not finite (they stay flagged). Returns the number of entries added."""
        _, ok = self.live(layer, slots)
        new = slots[~ok[:, kv_head]]
        if new.numel() == 0:
            return 0
        host = new.cpu()
        kb = self.pool.backup.k[layer][host, kv_head]
        vb = self.pool.backup.v[layer][host, kv_head]
        fin = (torch.isfinite(kb.float()).all(-1) & torch.isfinite(vb.float()).all(-1))
        host, kb, vb = host[fin], kb[fin], vb[fin]
        n = host.numel()
        if n == 0:
            return 0
        self._grow(n)
        dev = self.k.device
        rows = torch.arange(self.rows, self.rows + n, device=dev)
        slots_dev = host.to(dev)
        self.k[rows] = kb.to(dev, non_blocking=True)
        self.v[rows] = vb.to(dev, non_blocking=True)
        self.wk[rows] = rounding_witness(kb, kv_dtype=self.kv_dtype).to(dev)
        self.wv[rows] = rounding_witness(vb, kv_dtype=self.kv_dtype).to(dev)
        self.epoch[rows] = self.pool.epochs[slots_dev]
        self.index[layer, slots_dev, kv_head] = rows
        self.rows += n
        return n

    def entry_bytes(self) -> int:
        """Bytes of one exact (slot, KV head) entry: K and V rows, witnesses, epoch, index."""
        return 2 * self.k.shape[1] * self.k.element_size() + 2 * 4 + 8 + 8

    def bytes_used(self) -> int:
        """Bytes the exact entries take (``rows * entry_bytes``)."""
        return self.rows * self.entry_bytes()

    def bytes_allocated(self) -> int:
        """Device bytes actually allocated: the index plus every row's capacity."""
        ts = (self.index, self.k, self.v, self.wk, self.wv, self.epoch)
        return sum(t.numel() * t.element_size() for t in ts)

    def overlay(self, layer: int, q: torch.Tensor, slots: torch.Tensor, z, v, u, wv, *, sm_scale: float):
        """Replace the terms of live exact entries: one sequence, q f32 [Hq, D], slots [N];
        z, u, wv [Hq, N], v [Hq, N, D] as ``_sequence_terms`` returns them."""
        rows, ok = self.live(layer, slots)
        if not bool(ok.any()):
            return z, v, u, wv
        Hq, Hkv = q.shape[0], rows.shape[1]
        kvh = torch.arange(Hq, device=q.device) // (Hq // Hkv)
        r, m = rows[:, kvh].T, ok[:, kvh].T  # [Hq, N]
        ze, ue = exact_logits_and_radii(q, self.k[r].float(), self.wk[r], sm_scale=sm_scale)
        z = torch.where(m, ze, z)
        v = torch.where(m[..., None], self.v[r].float(), v)
        wv = torch.where(m, self.wv[r], wv)
        if u is not None:
            u = torch.where(m, ue, u)
        return z, v, u, wv


@dataclass
class GateStats:
    """Host counters; touched only when the gate fires (no sync on the common path)."""

    steps: int = 0
    steps_gated: int = 0
    heads_gated: int = 0          # (layer, seq, query head) records with cert > tau
    heads_repaired: int = 0       # of those, cert <= tau after repair
    blocks_paged: int = 0
    entries_paged: int = 0        # (slot, KV head) entries copied from the backup
    bytes_paged: int = 0          # host -> device bytes (K and V)
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


def _finite(x: float) -> float:
    return x if math.isfinite(x) else 0.0


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
        if self.store is not None:  # the reference decode now reads the repaired entries
            for lkv in pool.layers:
                lkv.exact = self.store
        self.stats = GateStats()
        self.max_events = max_events
        self.recompute_rows = False  # set per call by wrap(): True behind the kernels
        self._exact_rows: list[set[int]] = [set() for _ in range(pool.num_layers)]
        self._step_fired = False

    def wrap(self, ops):
        """A backend object like ``ops`` whose ``decode_attention`` goes through the gate.
        Behind anything but the reference decode, rows holding exact entries are
        recomputed with the reference every step (the kernels do not read the store)."""
        return _GatedOps(ops, self)

    def new_request(self) -> None:
        """Forget per-request state (batch rows, pending deferred repairs); counters stay.
        The store's entries of freed sequences are already dead (slot epochs moved on)."""
        self._exact_rows = [set() for _ in range(self.pool.num_layers)]
        self._pending = self._deferred = None

    def close(self) -> None:
        """Detach the store from the pool's layers (the pool decodes as if never repaired)."""
        for lkv in self.pool.layers:
            if lkv.exact is self.store:
                lkv.exact = None

    # ---- per layer ---------------------------------------------------------------------
    def after_decode(self, out: DecodeOut, q: torch.Tensor, layer_kv, block_table: torch.Tensor,
                     seq_lens: torch.Tensor, *, page_size: int, sm_scale: float, cert: CertConfig,
                     delta_loc) -> DecodeOut:
        """Apply persistence and the gate to one layer's backend output (see module doc)."""
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
            ctx = _RowCtx(self, *args)
            out = ctx.replace_rows(out, {b: ctx.row_decode(b) for b in rows})
        if self.check == "step":
            self._defer(layer, out.cert, args)
            return out
        fired = out.cert > self.tau
        if not bool(fired.any()):  # the one check on the common path
            return out
        ctx = _RowCtx(self, *args)
        return ctx.replace_rows(out, self._repair(ctx, out.cert, fired))

    def _repair(self, ctx: "_RowCtx", cert: torch.Tensor, fired: torch.Tensor) -> dict:
        """Repair the fired (row, head) pairs of one layer; returns {row: recomputed outputs}."""
        if not self._step_fired:
            self.stats.steps_gated += 1
            self._step_fired = True
        new = {}
        for b in fired.any(-1).nonzero().flatten().tolist():
            heads = fired[b].nonzero().flatten().tolist()
            new[b] = ctx.repair_row(b, heads, cert[b])
            if self.policy.mode != "off":
                self._exact_rows[ctx.layer].add(b)
        return new

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
                ctx = _RowCtx(self, *args)
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


class _RowCtx:
    """One layer's decode inputs, for recomputing and repairing batch rows (reference)."""

    def __init__(self, gate, q, layer_kv, block_table, seq_lens, page_size, sm_scale, cert, delta_loc):
        self.gate, self.layer_kv, self.layer = gate, layer_kv, layer_kv.layer
        q32 = q.to(torch.float32)
        self.qbad = ~torch.isfinite(q32).all(-1)  # [B, Hq]
        self.q = torch.where(torch.isfinite(q32), q32, torch.zeros((), device=q.device))
        self.block_table, self.seq_lens, self.page_size = block_table, seq_lens, page_size
        self.sm, self.cert = sm_scale, cert
        B = q.shape[0]
        self.delta = torch.as_tensor(delta_loc, dtype=torch.float64).expand(B) if B else None

    def slots(self, b: int) -> torch.Tensor:
        return token_slots(self.block_table[b], int(self.seq_lens[b]), page_size=self.page_size)

    def terms(self, b: int, slots: torch.Tensor):
        z, v, u, wv = _ref_attention._sequence_terms(self.q[b], self.layer_kv, slots, sm_scale=self.sm,
                                                     cert=self.cert, delta_loc=float(self.delta[b]))
        store = self.gate.store
        if store is None or self.layer_kv.exact is store:  # already overlaid by the reference
            return z, v, u, wv
        return store.overlay(self.layer, self.q[b], slots, z, v, u, wv, sm_scale=self.sm)

    def row_decode(self, b: int, terms=None):
        """(out [Hq, D], lse [Hq], cert [Hq], vbound [Hq]) of row b over the repaired cache."""
        z, v, u, wv = self.terms(b, self.slots(b)) if terms is None else terms
        st = _ref_attention._split_state(z, v, u, wv)
        p = Partials(*[t[None, :, None] for t in st[:2]], st[2][None, :, None], *[t[None, :, None] for t in st[3:]])
        out, lse, c, vb = _ref_attention.merge_partials(p)
        bad = self.qbad[b]
        return out[0], lse[0], torch.where(bad, INF, c[0]), torch.where(bad, INF, vb[0])

    def replace_rows(self, out: DecodeOut, rows: dict) -> DecodeOut:
        if not rows:
            return out
        o, lse, c, vb = out.out.clone(), out.lse.clone(), out.cert.clone(), out.vbound.clone()
        for b, (ob, lb, cb, vbb) in rows.items():
            o[b], lse[b], c[b], vb[b] = ob.to(o.dtype), lb.to(lse.dtype), cb.to(c.dtype), vbb.to(vb.dtype)
        return DecodeOut(out=o, lse=lse, cert=c, vbound=vb, radius=out.radius, radius_kind=out.radius_kind)

    def repair_row(self, b: int, heads: list[int], cert_b: torch.Tensor):
        """Repair the gated heads of row b; returns the row's recomputed outputs."""
        gate, st = self.gate, self.gate.stats
        before = cert_b.tolist()
        slots = self.slots(b)
        if gate.policy.mode == "off":
            for h in heads:
                self._record(b, h, before[h], before[h], [])
            return self.row_decode(b)
        gate.pool.flush_backup_()  # the step's own token may still be staged (CUDA pools)
        z, v, u, wv = self.terms(b, slots)
        blocks = {h: self._repair_head(b, h, slots, z[h].clone(), u[h].clone()) for h in heads}
        row = self.row_decode(b)
        # Exact entries shift p^ for the other heads of a KV group: repair any head pushed over tau.
        extra = [h for h in (row[2] > gate.tau).nonzero().flatten().tolist() if h not in blocks]
        if extra:
            z, v, u, wv = self.terms(b, slots)
            for h in extra:
                before[h] = float(row[2][h])
                blocks[h] = self._repair_head(b, h, slots, z[h].clone(), u[h].clone())
            row = self.row_decode(b)
        after = row[2].tolist()
        for h, nb in blocks.items():
            self._record(b, h, before[h], after[h], nb)
        return row

    def _record(self, b, h, before, after, blocks: list[int]) -> None:
        st, gate = self.gate.stats, self.gate
        st.heads_gated += 1
        st.heads_repaired += after <= gate.tau
        st.cert_before_sum += _finite(before)
        st.cert_after_sum += _finite(after)
        st.cert_before_max = max(st.cert_before_max, before)
        st.cert_after_max = max(st.cert_after_max, after)
        if len(st.events) < gate.max_events:
            st.events.append((st.steps, self.layer, b, h, before, after, blocks))

    def _page(self, slots: torch.Tensor, kvh: int) -> int:
        n = self.gate.store.page_in_(self.layer, slots, kvh)
        st = self.gate.stats
        st.entries_paged += n
        st.bytes_paged += n * 2 * self.gate.store.k.shape[1] * self.gate.store.k.element_size()
        return n

    def _repair_head(self, b: int, h: int, slots: torch.Tensor, z: torch.Tensor, u: torch.Tensor) -> list[int]:
        """Page in blocks of head h's KV head until its cert <= tau; returns the indices of
        the blocks paged, in page-in order (head mode: ``[0]``, the whole head)."""
        gate = self.gate
        if bool(self.qbad[b, h]):
            return []  # a non-finite query has no certificate to repair
        Hq = self.q.shape[1]
        kvh = h // (Hq // self.layer_kv.num_kv_heads)
        if gate.policy.mode == "head":
            n = self._page(slots, kvh)
            gate.stats.blocks_paged += 1 if n else 0
            return [0] if n else []
        bt = gate.policy.block_tokens
        N = slots.shape[0]
        tried = torch.zeros(-(-N // bt), dtype=torch.bool, device=z.device)
        qn = torch.linalg.vector_norm(self.q[b, h])
        paged = []
        while float(certificate(z, u)[1]) > gate.tau:
            c = block_contributions(z, u, block_tokens=bt).masked_fill(tried, -1.0)
            j = int(c.argmax())
            if not float(c[j]) > 0.0:
                break  # nothing left that lowers A
            tried[j] = True
            blk = slots[j * bt:(j + 1) * bt]
            if self._page(blk, kvh):
                paged.append(j)
                gate.stats.blocks_paged += 1
            rows, ok = gate.store.live(self.layer, blk)
            r, m = rows[:, kvh], ok[:, kvh]
            sl = slice(j * bt, j * bt + blk.shape[0])
            z[sl] = torch.where(m, self.sm * (gate.store.k[r].float() @ self.q[b, h]), z[sl])
            u[sl] = torch.where(m, self.sm * qn * gate.store.wk[r], u[sl])
            if bool(torch.isposinf(u[sl]).any()):
                break  # a flagged token whose backup is not finite either: no repair helps
        return paged


class _GatedOps:
    """Backend proxy: ``write_kv_``/``extend_attention`` unchanged, decode gated."""

    def __init__(self, ops, gate: Gate):
        self._ops, self.gate = ops, gate

    def _reads_store(self, q, layer_kv) -> bool:
        """Whether this decode ran the reference (which reads ``LayerKV.exact``)."""
        if getattr(self._ops, "decode_attention", None) is _ref_attention.decode_attention:
            return True
        pick = getattr(self._ops, "backend_for", None)  # witcert.backend
        return pick is not None and pick(q, layer_kv) == "ref"

    def __getattr__(self, name):
        return getattr(self._ops, name)

    def decode_attention(self, q, layer_kv, block_table, seq_lens, *, page_size, sm_scale, cert,
                         delta_loc, num_splits=1, return_radius=False):
        self.gate.before_decode(layer_kv)
        out = self._ops.decode_attention(q, layer_kv, block_table, seq_lens, page_size=page_size,
                                         sm_scale=sm_scale, cert=cert, delta_loc=delta_loc,
                                         num_splits=num_splits, return_radius=return_radius)
        self.gate.recompute_rows = not self._reads_store(q, layer_kv)
        return self.gate.after_decode(out, q, layer_kv, block_table, seq_lens, page_size=page_size,
                                      sm_scale=sm_scale, cert=cert, delta_loc=delta_loc)
