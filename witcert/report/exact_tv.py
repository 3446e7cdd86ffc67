"""Exact total variation for soundness checks (the report's runtime section, the tests through
``tests/fpexact.py`` and ``benchmarks/soundness_sweep.py``).

``cert >= TV(p, p_used)`` must be checked against the exact distribution ``p = softmax(sm q.k)``
of the exact keys and the distribution the path used, ``softmax(l_used)``. Logits near
1e8 or gaps below float64's resolution need more than a float64 dot, so:

- the dot of fp32 (or narrower) values is summed in double-double (every product of two
  fp32 values is exact in float64; TwoSum keeps the rounding error of each addition), the
  scale applied with Dekker's exact product, and the logits shifted by their maximum
  before the final rounding, so every shifted logit is within ~2^-100 relative of exact;
- ``tv`` computes TV in float64 and recomputes with mpmath (80 digits) every row where the
  float64 value cannot be trusted against the certificate (TV within 1e-9 relative of it
  or below 1e-12).
"""

from __future__ import annotations

import torch

_SPLIT = 134217729.0  # 2^27 + 1 (Dekker)


def _two_sum(a, b):
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _split(a):
    c = _SPLIT * a
    hi = c - (c - a)
    return hi, a - hi


def _two_prod(a, b):
    p = a * b
    ah, al = _split(a)
    bh, bl = _split(b)
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def exact_shifted_logits(q: torch.Tensor, k: torch.Tensor, *, sm_scale: float,
                         mask: torch.Tensor | None = None) -> torch.Tensor:
    """``sm q.k_t - max_s sm q.k_s`` in float64, correct to ~2^-100 relative before the last
    rounding. q: [..., D] (values exact in fp32); k: [..., N, D] (exact in fp32); mask: bool
    [..., N] of the tokens that count (others -inf). Returns f64 [..., N]."""
    q64, k64 = q.to(torch.float64), k.to(torch.float64)
    prod = q64.unsqueeze(-2) * k64  # [..., N, D], exact
    hi = torch.zeros(prod.shape[:-1], dtype=torch.float64, device=prod.device)
    lo = torch.zeros_like(hi)
    for d in range(prod.shape[-1]):
        hi, e = _two_sum(hi, prod[..., d])
        lo = lo + e
    hi, lo = _two_sum(hi, lo)
    p, e = _two_prod(torch.full_like(hi, float(sm_scale)), hi)
    lo = e + float(sm_scale) * lo
    hi, lo = _two_sum(p, lo)
    if mask is not None:
        hi = torch.where(mask, hi, torch.full_like(hi, float("-inf")))
    j = hi.argmax(dim=-1, keepdim=True)
    out = (hi - hi.gather(-1, j)) + (lo - lo.gather(-1, j))
    return out if mask is None else torch.where(mask, out, torch.full_like(out, float("-inf")))


def _tv_mp(a: torch.Tensor, b: torch.Tensor) -> float:
    """TV(softmax(a), softmax(b)) of two 1-D float64 logit rows in 80-digit arithmetic."""
    import mpmath  # torch depends on it (through sympy); only the rare risky rows need it

    b = b - b.max()  # exact: the used logits are fp32 (or fp64 within 2^53 of each other)
    with mpmath.workdps(80):
        ea = [mpmath.e ** mpmath.mpf(float(x)) for x in a.tolist()]
        eb = [mpmath.e ** mpmath.mpf(float(x)) for x in b.tolist()]
        sa, sb = mpmath.fsum(ea), mpmath.fsum(eb)
        return float(mpmath.fsum(abs(x / sa - y / sb) for x, y in zip(ea, eb)) / 2)


def tv(exact_shifted: torch.Tensor, used: torch.Tensor, cert: torch.Tensor | None = None,
       *, mask: torch.Tensor | None = None) -> torch.Tensor:
    """TV(softmax(exact), softmax(used)) per row, f64 [...]. exact_shifted, used: [..., N]
    (used: the logits the path used, any float dtype); mask: bool [..., N] of attended
    tokens. Rows whose float64 value is untrustworthy against ``cert`` are recomputed in
    mpmath."""
    a = exact_shifted.to(torch.float64)
    b = used.to(torch.float64)
    if mask is not None:
        a = torch.where(mask, a, torch.full_like(a, float("-inf")))
        b = torch.where(mask, b, torch.full_like(b, float("-inf")))
    out = 0.5 * (torch.softmax(a, -1) - torch.softmax(b, -1)).abs().sum(-1)
    if cert is None:
        return out
    c = cert.to(torch.float64).expand_as(out)
    flat_o, flat_c = out.reshape(-1), c.reshape(-1)
    a2, b2 = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    risky = (flat_o < 1e-12) | (flat_o >= flat_c * (1 - 1e-9))
    for i in risky.nonzero().flatten().tolist():
        keep = torch.isfinite(a2[i]) & torch.isfinite(b2[i])
        flat_o[i] = _tv_mp(a2[i][keep], b2[i][keep])
    return flat_o.view_as(out)
