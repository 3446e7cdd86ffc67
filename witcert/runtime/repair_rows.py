"""One layer's gated batch rows: recompute a row over the repaired cache, and repair it.

``RowCtx`` holds one layer's decode inputs for a gate: the HF gate (``witcert.runtime.repair.Gate``)
and the vLLM plugin's native gated decode (``witcert.integrations.vllm.attend.decode_gated``)
both repair through ``RowCtx.repair_row`` (one gate implementation). The caller gives the
layer's ``ExactCopy``, tau and the ``RepairPolicy``; ``repair_row`` returns a ``RowRepair``
(outputs, certificates before / after, blocks and entries made exact) and each caller keeps
its own counters from it. A row's
state (out, lse, cert, vbound and, for the repair, the logits the path used with their
whole radii) comes from the native C decode of that one row, with the layer's
``ExactCopy`` as overlay and the C code's debug outputs, when the native path serves the
pool (``witcert.runtime.dispatch`` picks ``native``); else from the reference, given the copy's live
entries of the row (``ExactCopy.entries``) as plain data. ``repair_row`` plans every fired head with
``witcert.runtime.repair_plan.plan_head`` (exact logits and radii of the candidates from the copy),
marks the entries exact, recomputes the row and repeats while a head of the row is still
above tau and something new can be made exact (each round adds an entry, so it ends).
The certificate delivered is always the recomputed one, never the plan's estimate.
``repair_rows`` repairs the fired rows of a whole gated call: on the native path in one C
call (``witcert.native.repair``: the same steps, the same bits; ``rows_unsupported`` says
when it cannot serve), else ``repair_row`` per row, which stays the specification.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from witcert.ref import attention as _ref_attention
from witcert.native.decode import native_model
from witcert.ref.arith import reference_model
from witcert.ref.attention import Partials, token_slots
from witcert.runtime.repair_plan import plan_head

INF = float("inf")


@dataclass
class RowRepair:
    """What ``RowCtx.repair_row`` did to one row.

    outputs: (out, lse, cert, vbound) of the row recomputed over the repaired cache (the
    delivered certificate is this recomputed one, never the plan's estimate); before
    {head: cert} of every head it looked at (the caller's cert for the heads it passed, the
    row's state for heads that went above tau during the repair); after: list [Hq] of the
    row's final certificates; blocks {head: [block indices planned]} (same keys as before);
    new: bool [Hkv, n] entries of the row made exact by this repair; entries: their count;
    fallbacks: KV heads the ``head`` policy made exact (something added)."""

    outputs: tuple
    before: dict
    after: list
    blocks: dict
    new: torch.Tensor
    entries: int = 0
    fallbacks: int = 0


@dataclass
class RowsRepair:
    """What ``RowCtx.repair_rows`` did to the rows it was given.

    out: f32 [B, Hq, D] and cert: f32 [B, Hq] of the context's rows, the repaired rows
    recomputed over the repaired cache (the rows not given: unset); entries, fallbacks, blocks:
    totals over the rows of entries made exact, ``head``-policy repairs and (block, KV head)
    pairs with a new entry (``count_blocks``)."""

    out: torch.Tensor
    cert: torch.Tensor
    entries: int = 0
    fallbacks: int = 0
    blocks: int = 0


@dataclass
class RowState:
    """One row over the current cache: out f32 [Hq, D]; lse, cert, vbound f32 [Hq];
    z f64 [Hq, n] the logits the path used and u f64 [Hq, n] their whole radii (None when
    not asked for)."""

    out: torch.Tensor
    lse: torch.Tensor
    cert: torch.Tensor
    vbound: torch.Tensor
    z: torch.Tensor | None = None
    u: torch.Tensor | None = None

    def outputs(self) -> tuple:
        return self.out, self.lse, self.cert, self.vbound


class RowCtx:
    """One layer's decode inputs (as ``Gate.after_decode`` receives them), per row."""

    def __init__(self, q, layer_kv, block_table, seq_lens, page_size, sm_scale, cert,
                 delta_loc, *, copy, tau: float, policy, mark=None, native: bool | None = None,
                 num_threads: int | None = None, first=None, terms: dict | None = None):
        """copy: the layer's ``ExactCopy`` (None: nothing can be repaired); tau, policy: the
        gate's threshold and ``RepairPolicy``; mark(slots int64 [n], kv_head) -> int: makes
        the entries exact (default ``copy.mark_``; the HF gate also counts them in its
        store). native: whether rows are decoded by the C code (None: decided here, see
        ``_native_ok``); num_threads: its threads (None: torch's). first: the backend's
        DecodeOut of this layer over the current cache, and terms the native path's logits
        / radii that came with it (``witcert.runtime.dispatch``), used as the fired rows' first
        state; None: the rows are decoded again."""
        self.layer_kv, self.layer = layer_kv, layer_kv.layer
        self.tau, self.policy = float(tau), policy
        self.first, self.terms = first, terms
        q32 = q.to(torch.float32)
        self.q_raw = q32
        self.qbad = ~torch.isfinite(q32).all(-1)  # [B, Hq]
        self.q = torch.where(torch.isfinite(q32), q32, torch.zeros((), device=q.device))
        self.block_table, self.seq_lens, self.page_size = block_table, seq_lens, page_size
        self.sm, self.cert = sm_scale, cert
        B = q.shape[0]
        self.delta = torch.as_tensor(delta_loc, dtype=torch.float64).cpu().expand(B) if B else None
        self.copy = copy
        self._mark = mark if mark is not None else self._mark_copy
        self.threads = num_threads
        self._touched = None  # bool [num_slots]: slots this context made exact (any KV head)
        if native is None:  # the backend's own native decode of this call settles it
            native = bool(terms) and terms.get("backend") == "native" and "radius" in terms \
                or self._native_ok()
        self.native = native
        self.model = (native_model if self.native else reference_model)(layer_kv.head_dim)

    def _mark_copy(self, slots: torch.Tensor, kvh: int) -> int:
        self.copy.mark_(slots, kvh)
        return slots.numel()

    def _native_ok(self) -> bool:
        """Whether rows are recomputed by the C decode (CPU tensors, the backend picks the
        native path for this pool, and the C code reads this copy)."""
        if self.q.device.type != "cpu" or self.block_table.device.type != "cpu" \
                or self.seq_lens.device.type != "cpu" or self.block_table.dtype != torch.int32 \
                or self.seq_lens.dtype != torch.int32:
            return False
        from witcert.runtime import dispatch as backend
        from witcert.native.decode import exact_unsupported, unsupported
        if backend.backend_for(self.q, self.layer_kv) != "native" \
                or unsupported(self.layer_kv, self.q) is not None:
            return False
        if self.copy is not None and exact_unsupported(self.copy, self.layer_kv) is not None:
            return False
        if self.cert.radius != "det" and self.delta is not None:
            lo, hi = float(self.delta.min()), float(self.delta.max())
            return 0.0 < lo and hi < 1.0
        return True

    def slots(self, b: int) -> torch.Tensor:
        return token_slots(self.block_table[b], int(self.seq_lens[b]), page_size=self.page_size)

    # ---- one row's state -------------------------------------------------------------
    def state(self, b: int, *, terms: bool = False, prev: RowState | None = None,
              kv_heads: list[int] | None = None) -> RowState:
        """Row b over the current cache (repaired entries read exactly); ``terms``: also the
        logits used and the whole radii (float64, on the CPU). prev, kv_heads: the row's
        state before entries of the KV heads ``kv_heads`` (only) were made exact: on the C
        path only those KV heads are decoded again, the others' query heads keep ``prev``
        (a KV head's entries alone decide its query heads' state: the same bits as a
        decode of the whole row)."""
        if self.native:
            if prev is not None and kv_heads is not None and prev.lse is not None \
                    and (not terms or prev.z is not None):
                return self._native_heads(b, terms, prev, kv_heads)
            return self._native_state(b, terms)
        z, v, u, wv = self._ref_terms(b, self.slots(b))
        st = _ref_attention.split_state(z, v, u, wv)
        p = Partials(*[t[None, :, None] for t in st[:2]], st[2][None, :, None],
                     *[t[None, :, None] for t in st[3:]])
        out, lse, c, vb = _ref_attention.merge_partials(p)
        bad = self.qbad[b]
        rs = RowState(out[0], lse[0], torch.where(bad, INF, c[0]), torch.where(bad, INF, vb[0]))
        if terms:
            rs.z, rs.u = z.double().cpu(), torch.where(bad[:, None], INF, u.double()).cpu()
        return rs

    def first_state(self, b: int) -> RowState:
        """Row b as the backend decoded it, with its logits and radii (``state`` if the
        backend did not hand them over)."""
        t = self.terms
        if not (self.native and t and "radius" in t and not t.get("fired_only")
                and self.first is not None and self.first.lse is not None) \
                or (self._touched is not None and bool(self._touched[self.slots(b)].any())):
            # (an earlier row of this batch made a slot of this row exact: a shared prefix)
            return self.state(b, terms=True)
        n = int(self.seq_lens[b])
        f = self.first
        return RowState(f.out[b], f.lse[b], f.cert[b], f.vbound[b], t["logits"][b, :, :n],
                        t["radius"][b, :, :n].double())

    def row_decode(self, b: int) -> tuple:
        """(out [Hq, D], lse [Hq], cert [Hq], vbound [Hq]) of row b over the repaired cache."""
        return self.state(b).outputs()

    def _ref_terms(self, b: int, slots: torch.Tensor):
        exact = None if self.copy is None else self.copy.entries(slots, device=self.q.device)
        return _ref_attention.sequence_terms(self.q[b], self.layer_kv, slots, sm_scale=self.sm,
                                             cert=self.cert, delta_loc=float(self.delta[b]),
                                             exact=exact)

    def _native_state(self, b: int, terms: bool, kv_sel: torch.Tensor | None = None) -> RowState:
        """kv_sel: None, or bool [1, Hkv]: decode those KV heads only (the rest unset)."""
        from witcert.native.decode import decode_attention_full
        dbg = {} if terms else None
        dl = self.delta[b:b + 1].contiguous() if self.cert.radius != "det" else None
        out, lse, c, vb = decode_attention_full(
            self.q_raw[b:b + 1], self.layer_kv, self.block_table[b:b + 1].contiguous(),
            self.seq_lens[b:b + 1].contiguous(), page_size=self.page_size, sm_scale=self.sm,
            radius=self.cert.radius, delta_loc=dl,
            num_threads=self.threads or max(1, torch.get_num_threads()),
            exact=self.copy, debug=dbg, kv_heads=kv_sel)
        rs = RowState(out[0], lse[0], c[0], vb[0])
        if terms:
            n = int(self.seq_lens[b])
            rs.z, rs.u = dbg["logits"][0, :, :n], dbg["radius"][0, :, :n].double()
        return rs

    def _native_heads(self, b: int, terms: bool, prev: RowState, kv_heads: list[int]) -> RowState:
        """``_native_state`` of row b with only the KV heads ``kv_heads`` decoded again, the
        query heads of the others taken from ``prev``."""
        Hkv = self.layer_kv.num_kv_heads
        sel = torch.zeros(1, Hkv, dtype=torch.bool)
        sel[0, kv_heads] = True
        new = self._native_state(b, terms, kv_sel=sel)
        R = self.q.shape[1] // Hkv
        keep = (~sel[0]).repeat_interleave(R)  # [Hq] query heads whose KV head is unchanged
        pairs = [(new.out, prev.out), (new.lse, prev.lse), (new.cert, prev.cert),
                 (new.vbound, prev.vbound)]
        if terms:
            pairs += [(new.z, prev.z), (new.u, prev.u)]
        for x, p in pairs:
            x[keep] = p[keep]
        return new

    def replace_rows(self, out, rows: dict):
        """``out`` (a DecodeOut) with the rows of ``rows`` {b: outputs or None} replaced."""
        rows = {b: r for b, r in rows.items() if r is not None}
        if not rows:
            return out
        o, lse, c, vb = out.out.clone(), out.lse.clone(), out.cert.clone(), out.vbound.clone()
        for b, (ob, lb, cb, vbb) in rows.items():
            o[b], lse[b], c[b], vb[b] = (ob.to(o.dtype), lb.to(lse.dtype), cb.to(c.dtype),
                                         vbb.to(vb.dtype))
        return type(out)(out=o, lse=lse, cert=c, vbound=vb, radius=out.radius,
                         radius_kind=out.radius_kind)

    # ---- the repair ------------------------------------------------------------------
    def repair_row(self, b: int, heads: list[int], cert_b: torch.Tensor) -> RowRepair:
        """Repair the gated heads ``heads`` of row b (``cert_b`` f32 [Hq]: the row's
        certificates the caller gated on); returns the ``RowRepair`` (policy ``off``: the
        row untouched, outputs None)."""
        before = dict(zip(heads, cert_b[heads].tolist()))
        Hkv = self.layer_kv.num_kv_heads
        n = int(self.seq_lens[b])
        rep = RowRepair(None, before, cert_b.tolist(), {h: [] for h in heads},
                        torch.zeros(Hkv, n, dtype=torch.bool))
        if self.policy.mode == "off":
            return rep
        slots = self.slots(b)
        slots_cpu = slots.cpu()
        st = self.first_state(b)
        exact_terms: dict[int, tuple] = {}  # per KV head: (zx, ux, finite), fixed for the row
        todo = heads
        while todo:
            live = self.copy.live(slots.to(self.copy.exact.device)).cpu()  # [n, Hkv]
            marked: dict[int, torch.Tensor] = {}
            added = 0
            for h in todo:
                before.setdefault(h, float(st.cert[h]))
                rep.blocks.setdefault(h, [])
                if bool(self.qbad[b, h]):
                    continue  # a non-finite query has no certificate to repair
                added += self._repair_head(b, h, slots_cpu, st, live, marked, exact_terms, rep)
            if not added:
                break
            st = self.state(b, terms=True, prev=st, kv_heads=sorted(marked))
            todo = [h for h in (st.cert > self.tau).nonzero().flatten().tolist()
                    if not bool(self.qbad[b, h])]
        rep.outputs, rep.after = st.outputs(), st.cert.tolist()
        return rep

    def repair_rows(self, rows: list[int], fired: torch.Tensor, *,
                    native_rows: bool | None = None) -> RowsRepair:
        """``repair_row`` of each row of ``rows`` (context rows, in this order: a later row
        sees the entries an earlier one made exact) for its heads ``fired`` (bool [B, Hq],
        finite query heads only), gating on the first state's certificates. One C call for
        all the rows (``witcert.native.repair``, the same steps and bits) when it serves this
        context (``native_rows``: None decides by ``rows_unsupported``; True / False forces
        it), else ``repair_row`` per row (the spec). Policy ``off``: not supported here."""
        B, Hq = fired.shape
        if native_rows is None:
            native_rows = self.rows_unsupported() is None
        if native_rows:
            from witcert.native import repair as native_repair
            from witcert.runtime.repair_plan import _TARGET_SLACK
            out, cert, stats = native_repair.repair_rows(
                self.q_raw, self.layer_kv, self.block_table, self.seq_lens,
                page_size=self.page_size, sm_scale=self.sm, radius=self.cert.radius,
                delta_loc=self.delta if self.cert.radius != "det" else None,
                num_threads=self.threads or max(1, torch.get_num_threads()), copy=self.copy,
                rows=rows, fired=fired, first=self.first, terms=self.terms, tau=self.tau,
                block_tokens=self.policy.block_tokens, whole=self.policy.mode == "head",
                slack=_TARGET_SLACK)
            e, f, k = stats.sum(0).tolist() if len(rows) else (0, 0, 0)
            return RowsRepair(out, cert, e, f, k)
        D = self.q.shape[-1]
        res = RowsRepair(torch.empty(B, Hq, D, dtype=torch.float32),
                         torch.empty(B, Hq, dtype=torch.float32))
        cert0 = self.first.cert if self.first is not None else None
        for b in rows:
            heads = fired[b].nonzero().flatten().tolist()
            c_b = cert0[b] if cert0 is not None else torch.full((Hq,), INF)  # (for ``before``)
            r = self.repair_row(b, heads, c_b)
            ob, _, cb, _ = r.outputs
            res.out[b], res.cert[b] = ob, cb
            res.entries += r.entries
            res.fallbacks += r.fallbacks
            res.blocks += count_blocks(r.new, self.policy.block_tokens)
        return res

    def rows_unsupported(self) -> str | None:
        """Why ``repair_rows`` runs the rows one by one in Python (None: one C call serves):
        the C repair needs the native decode, the copy's own marking and an exact copy."""
        if not self.native or self.copy is None:
            return "not the native decode path"
        if self._mark != self._mark_copy:
            return "a caller's own mark"
        from witcert.native import repair as native_repair
        return native_repair.unsupported(self.copy, self.q, mode=self.policy.mode)

    def _repair_head(self, b, h, slots, st: RowState, live, marked, exact_terms,
                     rep: RowRepair) -> int:
        """Plan head h of row b over the state ``st`` plus this round's marks, mark its
        entries exact; returns the number of entries added (into ``rep``)."""
        R = self.q.shape[1] // self.layer_kv.num_kv_heads
        kvh, r = divmod(h, R)
        if kvh not in exact_terms:
            exact_terms[kvh] = self._exact_terms(b, kvh, slots)
        zx, ux, finite = exact_terms[kvh]
        zx, ux = zx[r], ux[r]
        z, u = st.z[h], st.u[h]
        mk = marked.get(kvh)
        if mk is not None:  # entries an earlier head of this group made exact this round
            # (the plan returns nothing when they already bring this head under tau)
            z, u = torch.where(mk, zx, z), torch.where(mk, ux, u)
        elif not float(st.cert[h]) > self.tau:
            return 0
        cand = finite & ~live[:, kvh]
        if mk is not None:
            cand &= ~mk
        whole = self.policy.mode == "head"
        take, blocks = plan_head(z, u, zx, ux, cand, tau=self.tau,
                                 block_tokens=self.policy.block_tokens, whole=whole)
        if not blocks:
            return 0
        n = self._mark(slots[take], kvh)
        if self._touched is None:
            self._touched = torch.zeros(self.copy.exact.shape[0], dtype=torch.bool)
        self._touched[slots[take]] = True
        marked[kvh] = take if mk is None else (mk | take)
        rep.new[kvh] |= take
        rep.blocks[h].extend(blocks)
        rep.entries += n
        rep.fallbacks += whole
        return n

    def _exact_terms(self, b: int, kvh: int, slots: torch.Tensor) -> tuple:
        """(zx, ux, finite) on the CPU: zx f64 [R, n] the logits of the R query heads of KV
        head kvh over the exact copy (the dot products in ``dot4``'s fixed order), ux f64 [R, n] the radius such an entry gets (the
        copy's rounding witness plus the path's arithmetic slack), finite bool [n] whether
        the copy of the entry is finite (K and V; one that is not can never be made exact)."""
        R = self.q.shape[1] // self.layer_kv.num_kv_heads
        s = slots.to(self.copy.k.device)
        kx = self.copy.k[s, kvh].cpu()
        vx = self.copy.v[s, kvh].cpu()
        k64 = kx.double().numpy()  # host arithmetic in numpy: short vectors, cheaper ops
        fk = np.isfinite(k64)
        finite = fk.all(-1) & np.isfinite(vx.double().numpy()).all(-1)
        if self.copy.have is not None:  # a bounded copy: a slot without one is never exact
            finite &= self.copy.have[s].cpu().numpy()
        if not fk.all():
            k64 = np.where(fk, k64, 0.0)
        qg = self.q[b, kvh * R:(kvh + 1) * R].cpu().double().numpy()
        zx = self.sm * dot4(qg, k64)
        m = self.model
        ux = (m.rel_s * self.sm) * dot4(np.abs(qg), np.abs(k64)) + m.rel_l * np.abs(zx) \
            + (m.abs_err + m.softmax)
        if self.copy.rounds:
            wk = self.copy.witness(kx).double().numpy()
            ux = ux + self.sm * np.linalg.norm(qg, axis=-1)[:, None] * wk[None]
        return torch.from_numpy(zx), torch.from_numpy(ux), torch.from_numpy(finite)


def dot4(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """f64 [R, n] dot products of the rows of a f64 [R, D] and b f64 [n, D], each as four
    partial sums over d mod 4 (in d order) combined ``(s0 + s1) + (s2 + s3)``: the order of
    the C repair (``witcert/native/repair.c``), so both give the same bits (the fp32-valued
    operands multiply exactly in float64; a BLAS matmul's order depends on the library)."""
    R, D = a.shape
    pad = -D % 4
    if pad:  # zero products leave every partial sum unchanged
        a, b = np.pad(a, ((0, 0), (0, pad))), np.pad(b, ((0, 0), (0, pad)))
    p = (a[:, None, :] * b[None, :, :]).reshape(R, b.shape[0], -1, 4)
    acc = np.zeros((R, b.shape[0], 4))
    for i in range(p.shape[2]):
        acc = acc + p[:, :, i]
    return (acc[..., 0] + acc[..., 1]) + (acc[..., 2] + acc[..., 3])


def count_blocks(new: torch.Tensor, block_tokens: int) -> int:
    """(block, KV head) pairs with at least one entry of ``new`` (bool [Hkv, n])."""
    Hkv, n = new.shape
    nb = -(-n // block_tokens)
    padded = torch.nn.functional.pad(new, (0, nb * block_tokens - n))
    return int(padded.view(Hkv, nb, block_tokens).any(-1).sum())
