"""Paired statistics: bootstrap confidence intervals and McNemar's exact test.

Every comparison in the report is paired: configuration and reference were run on the
same inputs, so the unit that is resampled is the input (a needle sample, a decode
step), never each arm separately.
"""

from __future__ import annotations

import math

import torch

BOOTSTRAP_RESAMPLES = 10_000


def paired_bootstrap(a, b, *, resamples: int = BOOTSTRAP_RESAMPLES, level: float = 0.95,
                     seed: int = 0) -> dict:
    """CI of ``mean(a) - mean(b)`` for paired samples (same length n >= 1).

    Percentile bootstrap over the n pairs with ``resamples`` draws (fixed generator seed,
    so a rerun gives the same interval). Returns ``{diff, lo, hi, n, resamples, level}``.
    """
    a = torch.as_tensor(a, dtype=torch.float64).flatten()
    b = torch.as_tensor(b, dtype=torch.float64).flatten()
    if a.shape != b.shape or a.numel() == 0:
        raise ValueError(f"paired samples must have the same non-zero length, got {a.numel()} and {b.numel()}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level {level} must be in (0, 1)")
    d = a - b
    n = d.numel()
    g = torch.Generator().manual_seed(seed)
    means = torch.empty(resamples, dtype=torch.float64)
    chunk = max(1, 2_000_000 // n)
    for s in range(0, resamples, chunk):
        m = min(chunk, resamples - s)
        idx = torch.randint(0, n, (m, n), generator=g)
        means[s:s + m] = d[idx].mean(-1)
    alpha = (1.0 - level) / 2.0
    lo, hi = torch.quantile(means, torch.tensor([alpha, 1.0 - alpha], dtype=torch.float64)).tolist()
    return {"diff": float(d.mean()), "lo": lo, "hi": hi, "n": n, "resamples": resamples, "level": level}


def mcnemar(a, b) -> dict:
    """McNemar's exact test on paired binary outcomes (a, b: bool/0-1 sequences).

    ``n01`` = pairs with a wrong and b right, ``n10`` = a right and b wrong. The two-sided
    exact p-value is ``min(1, 2 * P(X <= min(n01, n10)))`` with X ~ Binomial(n01 + n10, 1/2);
    p = 1 when there is no discordant pair.
    """
    a = [bool(x) for x in a]
    b = [bool(x) for x in b]
    if len(a) != len(b):
        raise ValueError("paired outcomes must have the same length")
    n10 = sum(x and not y for x, y in zip(a, b))
    n01 = sum(y and not x for x, y in zip(a, b))
    n = n01 + n10
    if n == 0:
        return {"n01": 0, "n10": 0, "p": 1.0}
    k = min(n01, n10)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
    return {"n01": n01, "n10": n10, "p": min(1.0, 2.0 * tail)}


def quantiles(x, ps=(0.5, 0.9)) -> list[float | None]:
    t = torch.as_tensor(x, dtype=torch.float64).flatten()
    t = t[torch.isfinite(t)]
    if t.numel() == 0:
        return [None for _ in ps]
    return torch.quantile(t, torch.tensor(ps, dtype=torch.float64)).tolist()
