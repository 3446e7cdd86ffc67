"""In-engine gating for the vLLM plugin: the exact copy, and the repair of one sequence.

With ``WITCERT_VLLM_GATE`` on, the worker keeps per layer an ``ExactCopy``: K and V in
the model dtype, ``[num_slots, Hkv, D]`` per side, written for the same slots as the
witcert pages, plus a bool ``[num_slots, Hkv]`` of entries made exact by a repair and
the slot epoch at which they were made exact. An entry is live only while the slot's
epoch is unchanged (a rewrite of the slot bumps the epoch and also clears the entry), so
a freed and reused slot never reads a stale exact value.

``repair_sequence`` is the gate of one decode query (one sequence, all query heads): the
query heads whose certificate exceeds ``tau`` make entries of their KV head exact
(``block``: the ``block_tokens``-token blocks of largest contribution
``sum_{t in block} p^_t expm1(u_t)`` first, until ``cert <= tau``, with the one-pass
``witcert.ref.cert.repair_blocks``; ``head``: every token of the KV head). A repair moves
``p^`` for every query head of that KV group, so the heads are rechecked until none
exceeds ``tau`` or nothing more can be made exact. Output and certificate are then
computed in float64 over the mixed values: exact logit and value with radius 0 on exact
entries, stored logit and value with their radius elsewhere; the certificate is that
computed value (a sound bound), never a value claimed from the decision.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from witcert.config import RepairPolicy
from witcert.ref.arith import native_model
from witcert.ref.cert import certificate, repair_blocks


class ExactCopy:
    """Exact K/V of one layer, keyed by vLLM slot; ``epochs`` is the worker's slot epochs.

    k, v: optional preallocated storage ([num_slots, Hkv, D], contiguous; the bounded copy
    of ``copystore`` passes views of memory that is only resident where written).
    have: optional bool [num_slots] shared by all layers (``copystore``): the slot's copy
    is held; None means every slot has one. ``read`` gives NaN rows for slots without a
    copy, which the repair never makes exact (a non-finite copy cannot be exact).
    """

    def __init__(self, *, num_slots: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, epochs: torch.Tensor, k: torch.Tensor | None = None,
                 v: torch.Tensor | None = None, have: torch.Tensor | None = None) -> None:
        if epochs.shape != (num_slots,):
            raise ValueError(f"epochs {tuple(epochs.shape)} != num_slots {num_slots}")
        shape = (num_slots, num_kv_heads, head_dim)
        for name, t in (("k", k), ("v", v)):
            if t is not None and (tuple(t.shape) != shape or t.dtype != dtype
                                  or not t.is_contiguous()):
                raise ValueError(f"exact copy {name}: need a contiguous {dtype} {shape}")
        if have is not None and (have.shape != (num_slots,) or have.dtype != torch.bool):
            raise ValueError(f"have: need bool [{num_slots}], got {have.dtype} "
                             f"{tuple(have.shape)}")
        self.k = torch.zeros(shape, dtype=dtype) if k is None else k
        self.v = torch.zeros(shape, dtype=dtype) if v is None else v
        self.exact = torch.zeros(num_slots, num_kv_heads, dtype=torch.bool)
        self.exact_epoch = torch.zeros(num_slots, num_kv_heads, dtype=torch.int64)
        self.epochs = epochs
        self.have = have

    @staticmethod
    def bytes_per_slot(*, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        """K and V copies plus the exact flag and its epoch, per slot of one layer."""
        return num_kv_heads * (2 * head_dim * dtype.itemsize + 1 + 8)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size()
                   for t in (self.k, self.v, self.exact, self.exact_epoch))

    def write_(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Copy the new tokens (call after the epoch bump); a rewritten slot is not exact.
        With ``have``, only the slots whose copy is held are written."""
        if self.have is not None:
            keep = self.have[slots]
            if not bool(keep.all()):
                slots, k, v = slots[keep], k[keep], v[keep]
        self.k[slots] = k.to(self.k.dtype)
        self.v[slots] = v.to(self.v.dtype)
        self.exact[slots] = False

    def read(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v) rows of ``slots`` in the copy's dtype, NaN where no copy is held."""
        k, v = self.k[slots], self.v[slots]
        if self.have is not None:
            miss = ~self.have[slots]
            if bool(miss.any()):
                nan = torch.tensor(float("nan"), dtype=k.dtype)
                k = torch.where(miss[..., None, None], nan, k)
                v = torch.where(miss[..., None, None], nan, v)
        return k, v

    def live(self, slots: torch.Tensor) -> torch.Tensor:
        """bool [*slots.shape, Hkv]: made exact, at the slot's current epoch."""
        return self.exact[slots] & (self.exact_epoch[slots] == self.epochs[slots].unsqueeze(-1))

    def mark_(self, slots: torch.Tensor, heads: torch.Tensor) -> None:
        """Make the (slot, KV head) entries exact from now on (until the slot is rewritten)."""
        self.exact[slots, heads] = True
        self.exact_epoch[slots, heads] = self.epochs[slots]


@dataclass
class GateEvents:
    """Counters of one or more gated decode batches (summed with ``add_``).

    fired: (sequence, query head) certificates > tau before this step's repair (query
    heads with a non-finite query are not gated: their cert is +inf whatever the KV);
    repaired: fired heads with cert <= tau after it; blocks/tokens: (block, KV head) and
    (token, KV head) entries newly made exact; fallbacks: whole-KV-head repairs (``head``);
    raw_covered: certificates <= tau before repair (all heads of the batch);
    before_*/after_*: sum and max of the finite certificates of the fired heads."""

    fired: int = 0
    repaired: int = 0
    blocks: int = 0
    tokens: int = 0
    fallbacks: int = 0
    raw_covered: int = 0
    before_sum: float = 0.0
    before_max: float = 0.0
    after_sum: float = 0.0
    after_max: float = 0.0

    def add_(self, o: "GateEvents") -> None:
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(o, f.name)
            setattr(self, f.name, max(a, b) if f.name.endswith("_max") else a + b)

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class RowRepair:
    exact: torch.Tensor  # bool [Hkv, n], after repair (includes the entries live before)
    out: torch.Tensor  # f64 [Hq, D]
    cert: torch.Tensor  # f64 [Hq]
    fallbacks: int


def repair_sequence(qg: torch.Tensor, khat: torch.Tensor, vhat: torch.Tensor, u: torch.Tensor,
                    kx: torch.Tensor, vx: torch.Tensor, exact: torch.Tensor,
                    fire: torch.Tensor, skip: torch.Tensor, *, sm_scale: float, tau: float,
                    policy: RepairPolicy) -> RowRepair:
    """Gate one decode query of n context tokens.

    qg: float [Hkv, R, D] (non-finite entries zeroed); khat, vhat: float [n, Hkv, D] stored
    (dequantized) K/V; u: float [Hkv, R, n] radii of the stored logits (+inf flagged);
    kx, vx: [n, Hkv, D] exact copy; exact: bool [Hkv, n] entries exact before this step;
    fire: bool [Hq] heads to repair; skip: bool [Hq] heads never repaired (bad query).
    An entry whose exact copy is not finite is never made exact.
    """
    f64 = torch.float64
    Hkv, R, D = qg.shape
    Hq, n = Hkv * R, khat.shape[0]
    q = qg.to(f64)
    ok = (torch.isfinite(kx).all(-1) & torch.isfinite(vx).all(-1)).T  # [Hkv, n]
    okk = ok.T.unsqueeze(-1)
    kx64 = torch.where(okk, kx.to(f64), torch.zeros((), dtype=f64))
    vx64 = torch.where(okk, vx.to(f64), torch.zeros((), dtype=f64))
    zh = sm_scale * torch.einsum("hrd,nhd->hrn", q, khat.to(f64)).reshape(Hq, n)
    zx = sm_scale * torch.einsum("hrd,nhd->hrn", q, kx64).reshape(Hq, n)
    zx = torch.where(ok.repeat_interleave(R, 0), zx, zh)  # never used where not ok
    uu = u.to(f64).reshape(Hq, n)
    kvh = torch.arange(Hq) // R
    ex = exact.clone()

    # exact entries: no compression radius, only the arithmetic of these float64 logits
    # (witcert.ref.arith.native_model: a float64 dot and softmax, docs/PROOFS.md section 5)
    model = native_model(D)
    sx = torch.einsum("hrd,nhd->hrn", q.abs(), kx64.abs()).reshape(Hq, n)
    ux = model.rel_s * sm_scale * sx * (1 + 2.0**-40) + (model.abs_err + model.softmax)

    def mixed(h=None):
        e = ex[kvh] if h is None else ex[kvh[h]]
        zs, us, xs, uxs = (zh, uu, zx, ux) if h is None else (zh[h], uu[h], zx[h], ux[h])
        return torch.where(e, xs, zs), torch.where(e, uxs, us)

    bt = policy.block_tokens
    fallbacks, todo = 0, fire & ~skip
    while bool(todo.any()):
        before = int(ex.sum())
        for h in todo.nonzero().flatten().tolist():
            g = int(kvh[h])
            zi, ui = mixed(h)
            if not float(certificate(zi, ui)[1]) > tau:
                continue  # an earlier head of the group already repaired it
            if policy.mode == "head":
                fallbacks += int(bool((ok[g] & ~ex[g]).any()))
                ex[g] |= ok[g]
            else:
                row = torch.zeros(n, dtype=torch.bool)
                for j in repair_blocks(zi, ui, zx[h], tau=tau, block_tokens=bt):
                    row[j * bt:(j + 1) * bt] = True
                ex[g] |= row & ok[g]
        zi, ui = mixed()
        c = certificate(zi, ui)[1]
        todo = (c > tau) & ~skip
        if int(ex.sum()) == before:
            break  # nothing more can be made exact
    zi, ui = mixed()
    c = certificate(zi, ui)[1]
    p = torch.softmax(zi, dim=-1).view(Hkv, R, n)
    vmix = torch.where(ex.T.unsqueeze(-1), vx64, vhat.to(f64))
    out = torch.einsum("hrn,nhd->hrd", p, vmix).reshape(Hq, D)
    return RowRepair(exact=ex, out=out, cert=c, fallbacks=fallbacks)


def count_blocks(new: torch.Tensor, block_tokens: int) -> int:
    """(block, KV head) pairs with at least one entry of ``new`` (bool [Hkv, n])."""
    Hkv, n = new.shape
    nb = -(-n // block_tokens)
    padded = torch.nn.functional.pad(new, (0, nb * block_tokens - n))
    return int(padded.view(Hkv, nb, block_tokens).any(-1).sum())


def finite_sum_max(x: torch.Tensor) -> tuple[float, float]:
    """(sum, max) of the finite entries of x; (0, 0) when there are none."""
    x = x[torch.isfinite(x)]
    return (float(x.sum()), float(x.max())) if x.numel() else (0.0, 0.0)
