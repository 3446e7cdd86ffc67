"""Which entries a gated query head makes exact: the block order by contribution, in one pass.

A head's certificate (docs/MATH.md §1) is ``cert = E / W`` with ``W = sum_t exp(z_t - m)``
and ``E = sum_t exp(z_t - m) expm1(u_t)``. Making token t exact replaces its logit and
radius ``(z_t, u_t)`` by the exact ones ``(zx_t, ux_t)`` (``ux`` is the arithmetic slack
plus the copy's rounding witness, 0 for neither), which changes ``W`` and ``E`` by that
token's terms only. So the certificate after making a set of blocks exact is computed from
per-block sums without recomputing anything, and the greedy policy (largest contribution
``sum_{t in block} p^_t expm1(u_t)`` first, docs/GATING.md) is one sort plus prefix sums.
The caller recomputes the real certificate afterwards (the path's own sums, slack and
tail) and plans again if it is still above tau, so the estimate only decides the order and
where to stop, never what is reported.
"""

from __future__ import annotations

import numpy as np
import torch

from witcert import native

# the estimate omits the certificate's 1 + sum_rel and its tail term; aim a little lower
_TARGET_SLACK = 1.0 + 2.0**-20


def _excess(s: np.ndarray, u: np.ndarray) -> np.ndarray:
    """``exp(s + u) (1 - exp(-u)) = exp(s) expm1(u)`` (``witcert.ref.cert.excess_terms``),
    ``+inf`` where ``u = +inf`` (call under ``np.errstate``: exp may overflow to inf)."""
    return np.where(u == np.inf, np.inf, np.exp(s + u) * -np.expm1(-u))


def plan_head(z: torch.Tensor, u: torch.Tensor, zx: torch.Tensor, ux: torch.Tensor,
              cand: torch.Tensor, *, tau: float, block_tokens: int,
              whole: bool = False) -> tuple[torch.Tensor, list[int]]:
    """Entries of one query head to make exact so that its certificate gets to ``tau``.

    z, u: f64 [n] logits used and whole radii now (entries already exact included);
    zx, ux: f64 [n] logits and radii of the exact copy (read only where ``cand``);
    cand: bool [n] entries that can be made exact (not exact yet, copy finite); all CPU.
    whole: every candidate at once (the ``head`` policy, reported as the one block ``[0]``).
    Returns ``(take bool [n], blocks)`` with the block indices (block j = tokens
    ``[j * block_tokens, (j + 1) * block_tokens)``) in page-in order. Nothing when the
    certificate of ``(z, u)`` is already at most tau (estimated like the plan), when no
    candidate lowers it, or when a token that cannot be made exact has ``u = +inf`` (no
    repair can make that certificate finite). Host arithmetic: the C plan when the native
    library is available (``native_plan``), else numpy (a few dozen operations on short
    vectors, each cheaper than a torch op).
    """
    if whole:
        return cand.clone(), [0] if bool(cand.any()) else []
    args = (z.numpy(), u.numpy(), zx.numpy(), ux.numpy(), cand.numpy())
    if native_plan():
        return native_plan_mod().plan(*args, tau=tau, block_tokens=block_tokens, slack=_TARGET_SLACK)
    with np.errstate(over="ignore", invalid="ignore"):
        return _plan(*args, tau=tau, block_tokens=block_tokens)


def native_plan() -> bool:
    """Whether ``plan_head`` runs the C plan (``witcert.native.plan``: the same steps; the
    numpy ``_plan`` below specifies it and serves when the native library is unavailable)."""
    return native.available()


def native_plan_mod():
    """``witcert.native.plan`` (imported on first use: it loads the library)."""
    from witcert.native import plan
    return plan


def _plan(z, u, zx, ux, c, *, tau: float, block_tokens: int) -> tuple[torch.Tensor, list[int]]:
    n = z.size
    nb = -(-n // block_tokens)
    none = torch.zeros(n, dtype=torch.bool)
    if ((u == np.inf) & ~c).any() or not c.any():
        return none, []
    zc = np.where(c, zx, z)
    m = max(z.max(), zc.max())
    w, x = np.exp(z - m), np.exp(zc - m)
    e = _excess(z - m, u)
    ex = _excess(zc - m, np.where(c, ux, u))
    bad = e == np.inf
    ef = np.where(bad, 0.0, e)
    if not bad.any() and ef.sum() / w.sum() * _TARGET_SLACK <= tau:
        return none, []  # already under tau
    pad = np.zeros(nb * block_tokens - n)

    def per_block(t: np.ndarray) -> np.ndarray:
        return np.concatenate([t, pad]).reshape(nb, block_tokens).sum(-1)

    contrib = per_block(np.where(c, e, 0.0))  # +inf for a block holding a flagged token
    order = np.argsort(-contrib, kind="stable")
    npos = int((contrib > 0).sum())
    if npos == 0:
        return none, []
    d_w = per_block(np.where(c, x - w, 0.0))[order]
    d_e = per_block(np.where(c, ex - ef, 0.0))[order]
    left_bad = bad.sum() - np.cumsum(per_block((bad & c).astype(np.float64))[order])
    cert = (ef.sum() + np.cumsum(d_e)) / (w.sum() + np.cumsum(d_w))
    cert = np.where(left_bad > 0, np.inf, cert)
    ok = (cert * _TARGET_SLACK <= tau) & (np.arange(1, nb + 1) <= npos)
    k = int(np.argmax(ok)) + 1 if ok.any() else npos
    blocks = order[:k].tolist()
    take = np.zeros((nb, block_tokens), dtype=bool)
    take[blocks] = True
    return torch.from_numpy(take.reshape(-1)[:n] & c), blocks
