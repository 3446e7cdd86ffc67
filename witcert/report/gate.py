"""Gating in the report engine: block repair, position by position (docs/MATH.md §1, block
decomposition).

``RepairPolicy(mode="block")`` semantics over the engine's dequantised cache: at each
decode position, every query head with ``cert > tau`` pages in exact blocks of
``block_tokens`` tokens of its KV head, largest contribution ``sum_{t in block} p^_t
expm1(u_t)`` first, until ``cert <= tau``; paged entries stay exact for the rest of the
run (per KV head) and the heads of a group are rechecked once, since a repair moves
``p^`` for every head reading that KV head. ``witcert.runtime.repair.Gate`` does the same on the
paged pool; both stop at ``tau``.

What is shared and what is not. The block plan of a row is the runtime gate's one plan,
``witcert.runtime.repair_plan.plan_head`` (one sort and prefix sums; every entry not yet
exact is a candidate with exact radius 0 here), tested equal to the greedy definition
``gate_row_greedy`` (tests/test_report_engine.py). What stays here is not a second gate but
its simulation over dense float64 teacher-forcing tensors (logits ``zh`` / ``z`` and radii
``u`` of every position at once, no pool, no slots, no copy): ``gate_positions`` walks the
positions, keeps the exact set per KV head, and recomputes certificates and outputs from
those tensors.
"""

from __future__ import annotations

import torch

from witcert.ref.cert import block_contributions, certificate
from witcert.runtime.repair_plan import plan_head


def gate_positions(cfg, zh, z, u, mask, vgroups, vx, kvh, Hkv, oh):
    """Block repair position by position (persistent per KV head). ``vgroups``: list of
    (first, end, V) giving the stored V seen by positions first..end-1: V is f64 [Hq, N, D],
    or ``(vd, nV)`` meaning ``vx + vd`` on the first nV tokens and ``vx`` after (block methods).
    Returns
    (out f64 [Hq, T, D], cert after repair [Hq, T], fraction of entries made exact)."""
    Hq, T, N = zh.shape
    raw = certificate(zh, u, mask=mask)[1]
    fired = raw > cfg.tau
    if not bool(fired.any()):
        return oh, raw, 0.0
    exact = torch.zeros(Hkv, N, dtype=torch.bool)
    out, after = oh.clone(), raw.clone()
    first = int(fired.any(0).nonzero()[0])
    for i in range(first, T):
        n = int(mask[0, i].sum())
        ex = exact[kvh][:, :n]
        zi = torch.where(ex, z[:, i, :n], zh[:, i, :n])
        ui = torch.where(ex, torch.zeros((), dtype=u.dtype), u[:, i, :n])
        c = certificate(zi, ui)[1]
        for _ in range(2):  # a repair shifts p^ of the other heads of its group: recheck once
            for h in (c > cfg.tau).nonzero().flatten().tolist():
                gate_row(cfg, exact, int(kvh[h]), zi[h], ui[h], z[h, i, :n])
            ex = exact[kvh][:, :n]
            zi = torch.where(ex, z[:, i, :n], zh[:, i, :n])
            ui = torch.where(ex, torch.zeros((), dtype=u.dtype), u[:, i, :n])
            c = certificate(zi, ui)[1]
            if not bool((c > cfg.tau).any()):
                break
        out[:, i] = _out_at(vgroups, vx, i, n, torch.softmax(zi, -1), ex)
        after[:, i] = c
    return out, after, float(exact.double().mean())


def gate_row(cfg, exact, g, zi, ui, zx) -> None:
    """Page in blocks of ``block_tokens`` of KV head g by decreasing contribution
    ``sum p^_t expm1(u_t)`` (docs/MATH.md §1, block decomposition) until cert <= tau: the
    runtime gate's one plan (``witcert.runtime.repair_plan.plan_head``, one pass, equal to
    ``gate_row_greedy``), every entry not yet exact a candidate with exact radius 0.
    zi, ui, zx: f64 [n] (stored logits, radii, exact logits)."""
    n = zi.numel()
    take, _ = plan_head(zi, ui, zx, torch.zeros(n, dtype=torch.float64), ~exact[g, :n],
                        tau=cfg.tau, block_tokens=cfg.block_tokens)
    exact[g, :n] |= take


def gate_row_greedy(cfg, exact, g, zi, ui, zx) -> None:
    """The definition ``gate_row`` implements: repair the block of largest contribution,
    recompute, repeat until cert <= tau (or no block contributes)."""
    zi, ui = zi.clone(), ui.clone()
    bt = cfg.block_tokens
    while float(certificate(zi, ui)[1]) > cfg.tau:
        c = block_contributions(zi, ui, block_tokens=bt)
        j = int(c.argmax())
        if not float(c[j]) > 0.0:
            break
        sl = slice(j * bt, min((j + 1) * bt, zi.numel()))
        exact[g, sl] = True
        zi[sl], ui[sl] = zx[sl], 0.0


def _out_at(vgroups, vx, i: int, n: int, p, ex):
    """Output f64 [Hq, D] of position i: ``p`` [Hq, n] over V that is exact where ``ex``
    [Hq, n] and stored elsewhere (stored V of position i: see ``gate_positions``); touches
    only the exact columns beyond the plain stored product."""
    vg = next(v for a, b, v in vgroups if a <= i < b)
    if isinstance(vg, tuple):  # stored = vx + vd on the first nv tokens
        vd, nv = vg
        keep = (torch.arange(n) < nv) & ~ex
        return torch.einsum("hn,hnd->hd", p, vx[:, :n]) + torch.einsum("hn,hnd->hd", p * keep, vd[:, :n])
    out = torch.einsum("hn,hnd->hd", p, vg[:, :n])
    cols = ex.any(0).nonzero().flatten()
    if cols.numel():
        out = out + torch.einsum("hn,hnd->hd", (p * ex)[:, cols], vx[:, cols] - vg[:, cols])
    return out
