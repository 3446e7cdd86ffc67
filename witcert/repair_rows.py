"""One layer's gated batch rows: recompute a row over the repaired cache, and repair it.

``RowCtx`` holds one layer's decode inputs for the gate (``witcert.repair.Gate``). A row's
state (out, lse, cert, vbound and, for the repair, the logits the path used with their
whole radii) comes from the native C decode of that one row, with the layer's
``ExactCopy`` as overlay and the C code's debug outputs, when the native path serves the
pool (``witcert.backend`` picks ``native``); else from the reference, which reads the copy
through ``LayerKV.exact``. ``repair_row`` plans every fired head with
``witcert.repair_plan.plan_head`` (exact logits and radii of the candidates from the copy),
marks the entries exact, recomputes the row and repeats while a head of the row is still
above tau and something new can be made exact (each round adds an entry, so it ends).
The certificate delivered is always the recomputed one, never the plan's estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from witcert.ref import attention as _ref_attention
from witcert.native.decode import native_model
from witcert.ref.arith import reference_model
from witcert.ref.attention import Partials, token_slots
from witcert.repair_plan import plan_head

INF = float("inf")


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


def _finite(x: float) -> float:
    return x if x == x and abs(x) != INF else 0.0


class RowCtx:
    """One layer's decode inputs (as ``Gate.after_decode`` receives them), per row."""

    def __init__(self, gate, q, layer_kv, block_table, seq_lens, page_size, sm_scale, cert,
                 delta_loc, *, first=None, terms: dict | None = None):
        """first: the backend's DecodeOut of this layer over the current cache, and terms
        the native path's logits / radii that came with it (``witcert.backend``), used as
        the fired rows' first state; None: the rows are decoded again."""
        self.gate, self.layer_kv, self.layer = gate, layer_kv, layer_kv.layer
        self.first, self.terms = first, terms
        q32 = q.to(torch.float32)
        self.q_raw = q32
        self.qbad = ~torch.isfinite(q32).all(-1)  # [B, Hq]
        self.q = torch.where(torch.isfinite(q32), q32, torch.zeros((), device=q.device))
        self.block_table, self.seq_lens, self.page_size = block_table, seq_lens, page_size
        self.sm, self.cert = sm_scale, cert
        B = q.shape[0]
        self.delta = torch.as_tensor(delta_loc, dtype=torch.float64).cpu().expand(B) if B else None
        self.copy = None if gate.store is None else gate.store.copies[self.layer]
        # the backend's own native decode of this call (with this copy as overlay) settles it
        self.native = bool(terms) and terms.get("backend") == "native" and "radius" in terms \
            or self._native_ok()
        self.model = (native_model if self.native else reference_model)(layer_kv.head_dim)

    def _native_ok(self) -> bool:
        """Whether rows are recomputed by the C decode (CPU tensors, the backend picks the
        native path for this pool, and the C code reads this copy)."""
        if self.q.device.type != "cpu" or self.block_table.device.type != "cpu" \
                or self.seq_lens.device.type != "cpu" or self.block_table.dtype != torch.int32 \
                or self.seq_lens.dtype != torch.int32:
            return False
        from witcert import backend
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
    def state(self, b: int, *, terms: bool = False) -> RowState:
        """Row b over the current cache (repaired entries read exactly); ``terms``: also the
        logits used and the whole radii (float64, on the CPU)."""
        if self.native:
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
        if not (self.native and t and "radius" in t and self.first is not None):
            return self.state(b, terms=True)
        n = int(self.seq_lens[b])
        f = self.first
        return RowState(f.out[b], f.lse[b], f.cert[b], f.vbound[b], t["logits"][b, :, :n],
                        t["radius"][b, :, :n].double())

    def row_decode(self, b: int) -> tuple:
        """(out [Hq, D], lse [Hq], cert [Hq], vbound [Hq]) of row b over the repaired cache."""
        return self.state(b).outputs()

    def _ref_terms(self, b: int, slots: torch.Tensor):
        z, v, u, wv = _ref_attention.sequence_terms(self.q[b], self.layer_kv, slots, sm_scale=self.sm,
                                                    cert=self.cert, delta_loc=float(self.delta[b]))
        if self.copy is None or self.layer_kv.exact is self.copy:  # already overlaid
            return z, v, u, wv
        return self.copy.overlay(self.layer, self.q[b], slots, z, v, u, wv, sm_scale=self.sm)

    def _native_state(self, b: int, terms: bool) -> RowState:
        from witcert.native.decode import decode_attention_full
        dbg = {} if terms else None
        dl = self.delta[b:b + 1].contiguous() if self.cert.radius != "det" else None
        out, lse, c, vb = decode_attention_full(
            self.q_raw[b:b + 1], self.layer_kv, self.block_table[b:b + 1].contiguous(),
            self.seq_lens[b:b + 1].contiguous(), page_size=self.page_size, sm_scale=self.sm,
            radius=self.cert.radius, delta_loc=dl, num_threads=max(1, torch.get_num_threads()),
            exact=self.copy, debug=dbg)
        rs = RowState(out[0], lse[0], c[0], vb[0])
        if terms:
            n = int(self.seq_lens[b])
            rs.z, rs.u = dbg["logits"][0, :, :n], dbg["radius"][0, :, :n].double()
        return rs

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
    def repair_row(self, b: int, heads: list[int], cert_b: torch.Tensor):
        """Repair the gated heads of row b; returns the row's recomputed outputs (None:
        unchanged, policy ``off``)."""
        gate = self.gate
        before = dict(zip(heads, cert_b[heads].tolist()))
        if gate.policy.mode == "off":
            for h in heads:
                self._record(b, h, before[h], before[h], [])
            return None
        gate.pool.flush_backup_()  # the step's own token may still be staged (CUDA pools)
        slots = self.slots(b)
        slots_cpu = slots.cpu()
        st = self.first_state(b)
        blocks: dict[int, list[int]] = {}
        exact_terms: dict[int, tuple] = {}  # per KV head: (zx, ux, finite), fixed for the row
        todo = heads
        while todo:
            live = self.copy.live(slots.to(self.copy.exact.device)).cpu()  # [n, Hkv]
            marked: dict[int, torch.Tensor] = {}
            added = 0
            for h in todo:
                before.setdefault(h, float(st.cert[h]))
                blocks.setdefault(h, [])
                if bool(self.qbad[b, h]):
                    continue  # a non-finite query has no certificate to repair
                added += self._repair_head(b, h, slots_cpu, st, live, marked, exact_terms,
                                           blocks[h])
            if not added:
                break
            st = self.state(b, terms=True)
            todo = [h for h in (st.cert > gate.tau).nonzero().flatten().tolist()
                    if not bool(self.qbad[b, h])]
        after = st.cert.tolist()
        for h, nb in blocks.items():
            self._record(b, h, before[h], after[h], nb)
        return st.outputs()

    def _repair_head(self, b, h, slots, st: RowState, live, marked, exact_terms,
                     paged: list[int]) -> int:
        """Plan head h of row b over the state ``st`` plus this round's marks, mark its
        entries exact; returns the number of entries added (block indices into ``paged``)."""
        gate = self.gate
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
        elif not float(st.cert[h]) > gate.tau:
            return 0
        cand = finite & ~live[:, kvh]
        if mk is not None:
            cand &= ~mk
        take, blocks = plan_head(z, u, zx, ux, cand, tau=gate.tau,
                                 block_tokens=gate.policy.block_tokens,
                                 whole=gate.policy.mode == "head")
        if not blocks:
            return 0
        n = self._page(slots[take], kvh)
        marked[kvh] = take if mk is None else (mk | take)
        paged.extend(blocks)
        gate.stats.blocks_paged += len(blocks)
        return n

    def _exact_terms(self, b: int, kvh: int, slots: torch.Tensor) -> tuple:
        """(zx, ux, finite) on the CPU: zx f64 [R, n] the logits of the R query heads of KV
        head kvh over the exact copy, ux f64 [R, n] the radius such an entry gets (the
        copy's rounding witness plus the path's arithmetic slack), finite bool [n] whether
        the copy of the entry is finite (K and V; one that is not can never be made exact)."""
        R = self.q.shape[1] // self.layer_kv.num_kv_heads
        s = slots.to(self.copy.k.device)
        kx = self.copy.k[s, kvh].cpu()
        vx = self.copy.v[s, kvh].cpu()
        k64 = kx.double().numpy()  # host arithmetic in numpy: short vectors, cheaper ops
        fk = np.isfinite(k64)
        finite = fk.all(-1) & np.isfinite(vx.double().numpy()).all(-1)
        if not fk.all():
            k64 = np.where(fk, k64, 0.0)
        qg = self.q[b, kvh * R:(kvh + 1) * R].cpu().double().numpy()
        zx = self.sm * (qg @ k64.T)
        m = self.model
        ux = (m.rel_s * self.sm) * (np.abs(qg) @ np.abs(k64).T) + m.rel_l * np.abs(zx) \
            + (m.abs_err + m.softmax)
        if self.copy.rounds:
            wk = self.copy.witness(kx).double().numpy()
            ux = ux + self.sm * np.linalg.norm(qg, axis=-1)[:, None] * wk[None]
        return torch.from_numpy(zx), torch.from_numpy(ux), torch.from_numpy(finite)

    def _page(self, slots: torch.Tensor, kvh: int) -> int:
        n = self.gate.store.mark_(self.layer, slots, kvh)  # candidates: not live, finite
        st = self.gate.stats
        st.entries_paged += n
        st.bytes_paged += n * 2 * self.copy.k.shape[-1] * self.copy.k.element_size()
        return n

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
