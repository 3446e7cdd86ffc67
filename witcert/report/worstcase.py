"""Worst-case TV over the logit box (tightness reference for docs/MATH.md §1; offline, float64).

Problem: ``W(z^, u) = max TV(softmax(z), softmax(z^))`` over ``|z_t - z^_t| <= u_t``.

Structure (checked by tests/test_cert_lemma.py against brute force):
- ``TV = max_S [p(S) - p^(S)]`` and, for a fixed S, ``p(S)`` is maximised at the vertex
  ``z_t = z^_t + u_t`` (t in S), ``z^_t - u_t`` (otherwise). Hence
  ``W = max_S F(S)``, ``F(S) = X_S / (X_S + Y_S) - p^(S)``, ``X_S = sum_S p^_t e^{u_t}``,
  ``Y_S = sum_{not S} p^_t e^{-u_t}``.
- The optimal S is NOT always a threshold set in u (sorted prefix), nor an interval or
  the complement of an interval in u order. Two tokens suffice against the prefix
  claim: ``p^ = (0.01, 0.99)``, ``u = (1, 1.1)``: ``S = {0}`` (the smaller u) gives
  0.066, ``S = {1}`` only 0.009. The "best S for a fixed normaliser T is
  {t: e^{u_t} > T}" argument fails because T itself depends on S.
- Computing W exactly is NP-hard (weakly): with uniform ``u`` and ``p^_t = w_t / sum w``
  (integers w), ``F(S)`` depends only on ``pi = p^(S)`` and has the unique maximiser
  ``pi* = 1/(1 + e^u)`` where it equals ``tanh(u/2)``; so ``W >= tanh(u/2)`` iff some
  subset of the w sums to ``sum(w) / (1 + e^u)``: SUBSET-SUM. No polynomial exact
  algorithm exists unless P = NP.

So this module gives the exact value by enumeration (meet in the middle, N <= 24) and,
for any N, ``worst_tv_lower``: the best vertex among all intervals and interval
complements in u order (O(N^2)), an attained TV hence a valid lower bound on W. A
tightness report ``cert / W`` is then bounded above by ``cert / worst_tv_lower``.
"""

from __future__ import annotations

import torch

MAX_EXACT_TOKENS = 24
_LO_BITS = 12


def _prep(logits_hat: torch.Tensor, u: torch.Tensor):
    if logits_hat.shape != u.shape:
        raise ValueError(f"logits_hat {tuple(logits_hat.shape)} and u {tuple(u.shape)} differ")
    z = logits_hat.to(torch.float64)
    u = u.to(torch.float64)
    if not bool(torch.isfinite(z).all()):
        raise ValueError("logits_hat must be finite (drop masked tokens first)")
    if not bool(((u >= 0) & (u <= 700.0)).all()):
        raise ValueError("u must be finite, >= 0 and <= 700 (exp must not overflow in float64)")
    p = torch.softmax(z, dim=-1)
    return p, p * torch.exp(u), p * torch.exp(-u)


def _subset_sums(cols: torch.Tensor) -> torch.Tensor:
    """cols [n, 3] -> sums over all 2^n subsets [2^n, 3] (bit i of the index = token i)."""
    n = cols.shape[0]
    idx = torch.arange(1 << n, dtype=torch.int64)
    bits = ((idx[:, None] >> torch.arange(n, dtype=torch.int64)) & 1).to(torch.float64)
    return bits @ cols


def _exact_row(p: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    n = p.shape[0]
    btot = b.sum()
    cols = torch.stack([a, b, p], dim=-1)  # per token: (a_t, b_t, p^_t)
    lo = _subset_sums(cols[: min(n, _LO_BITS)])
    hi = _subset_sums(cols[min(n, _LO_BITS):])
    best = torch.zeros((), dtype=torch.float64)
    for start in range(0, hi.shape[0], 256):
        s = hi[start:start + 256, None, :] + lo[None, :, :]
        x, y, pi = s[..., 0], btot - s[..., 1], s[..., 2]
        f = x / (x + y) - pi
        best = torch.maximum(best, f.max())
    return best


def exact_worst_tv(logits_hat: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Exact ``max TV`` over the box ``|z - z^| <= u`` by enumerating every vertex.

    logits_hat, u: float [..., N] with N <= 24 (the problem is NP-hard in general).
    Returns float64 [...].
    """
    if logits_hat.shape[-1] > MAX_EXACT_TOKENS:
        raise ValueError(f"exact worst case enumerates 2^N vertices; N = {logits_hat.shape[-1]} > "
                         f"{MAX_EXACT_TOKENS} (use worst_tv_lower for long rows)")
    p, a, b = _prep(logits_hat, u)
    lead = p.shape[:-1]
    n = p.shape[-1]
    p, a, b = p.reshape(-1, n), a.reshape(-1, n), b.reshape(-1, n)
    out = torch.stack([_exact_row(p[i], a[i], b[i]) for i in range(p.shape[0])])
    return out.reshape(lead)


def worst_tv_lower(logits_hat: torch.Tensor, u: torch.Tensor, *, chunk: int = 256) -> torch.Tensor:
    """Best vertex among intervals and interval complements in sorted-u order.

    A TV actually attained in the box, hence ``<= exact_worst_tv``; covers every threshold
    (prefix) set. logits_hat, u: float [..., N]. Returns float64 [...]. O(N^2) time.
    """
    p, a, b = _prep(logits_hat, u)
    order = torch.argsort(u.to(torch.float64), dim=-1)
    p, a, b = (t.gather(-1, order) for t in (p, a, b))
    zero = torch.zeros_like(p[..., :1])
    ca, cb, cp = (torch.cat([zero, t.cumsum(-1)], dim=-1) for t in (a, b, p))
    atot, btot = ca[..., -1:, None], cb[..., -1:, None]
    n1 = ca.shape[-1]
    best = torch.zeros(p.shape[:-1], dtype=torch.float64)
    for i0 in range(0, n1, chunk):
        sl = slice(i0, min(n1, i0 + chunk))
        # interval [i, j) with i in the chunk, j any; i >= j gives the empty set (F = 0)
        alpha = (ca[..., None, :] - ca[..., sl, None]).clamp_min(0)
        beta = (cb[..., None, :] - cb[..., sl, None]).clamp_min(0)
        pi = (cp[..., None, :] - cp[..., sl, None]).clamp_min(0)
        f_in = alpha / (alpha + btot - beta) - pi
        f_out = (atot - alpha) / (atot - alpha + beta) - (1.0 - pi)
        f = torch.maximum(f_in, f_out).nan_to_num(nan=0.0)
        best = torch.maximum(best, f.amax(dim=(-2, -1)))
    return best
