"""In-engine gating for the vLLM plugin: the exact copy, and the repair of one sequence.

With ``WITCERT_VLLM_GATE`` on, the worker keeps per layer a ``witcert.runtime.exact.ExactCopy``
(the exact-entry layout the HF gate and the native C decode share): K and V in the model
dtype, ``[num_slots, Hkv, D]`` per side, written for the same slots as the witcert pages,
plus a bool ``[num_slots, Hkv]`` of entries made exact by a repair and the slot epoch at
which they were made exact. An entry is live only while the slot's epoch is unchanged (a
rewrite of the slot bumps the epoch and also clears the entry), so a freed and reused
slot never reads a stale exact value.

``repair_sequence`` is the torch path's gate of one decode query (``WITCERT_VLLM_NATIVE=
off``) and the spec the native path is tested against (that one repairs with the HF gate's
``witcert.runtime.repair_rows``: the same decisions, from the float64 C logits). One sequence, all
query heads: the query heads whose certificate exceeds ``tau`` make entries of their KV head exact
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
from witcert.runtime.exact import ExactCopy  # noqa: F401  (the one exact-entry layout, re-exported)
from witcert.ref.arith import native_model
from witcert.ref.cert import certificate, repair_blocks


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
