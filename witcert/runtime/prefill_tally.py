"""Prefill / extend certificates, counted apart from the decode certificates.

One record = one (layer, query head, new token) certificate of a chunked prefill or extend
(docs/MATH.md §1, the distribution of that new token over the compressed prefix and the
exact new tokens before it). ``CertLog.record_prefill_`` folds a layer's ``[n, Hq]`` block
here at once, with device ops only (no host sync): the same conventions as the decode
statistics (covered = finite and <= tau; overflow = +inf; invalid = NaN / -inf; finite
sum / max over finite certs; the histogram of ``witcert.runtime.telemetry.hist_edges``).
"""

from __future__ import annotations

import math

import torch


class PrefillTally:
    """Accumulators ``[L, Hq]`` of prefill certificates on ``device``.

    edges: float64 upper edges of the finite histogram bins (``hist_edges()``), on ``device``.
    """

    def __init__(self, *, num_layers: int, num_q_heads: int, tau: float, edges: torch.Tensor,
                 device: torch.device) -> None:
        shape = (num_layers, num_q_heads)
        self.num_layers, self.num_q_heads, self.tau = num_layers, num_q_heads, float(tau)
        self._edges = edges
        z = lambda dt: torch.zeros(shape, dtype=dt, device=device)  # noqa: E731
        self._count, self._covered, self._overflow = z(torch.int64), z(torch.int64), z(torch.int64)
        self._invalid, self._fcount, self._fsum = z(torch.int64), z(torch.int64), z(torch.float64)
        self._fmax = torch.full(shape, -math.inf, dtype=torch.float64, device=device)
        # finite bins, below and above, then one dump bin for non-finite values (never reported)
        self._hist = torch.zeros(edges.numel() + 2, dtype=torch.int64, device=device)

    def record_(self, layer: int, cert: torch.Tensor) -> None:
        """Fold one layer's certificates ``[n, Hq]`` (n new tokens) into the accumulators."""
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer={layer} not in [0, {self.num_layers})")
        if cert.dim() != 2 or cert.shape[1] != self.num_q_heads:
            raise ValueError(f"prefill cert must be [n, {self.num_q_heads}], got {tuple(cert.shape)}")
        if cert.device != self._count.device:
            raise ValueError(f"cert is on {cert.device}, CertLog on {self._count.device}")
        c = cert.detach().to(torch.float64)  # a float64 cert is never rounded down on its way in
        finite = torch.isfinite(c)
        self._count[layer] += c.shape[0]
        self._covered[layer] += (finite & (c <= self.tau)).sum(0)
        self._overflow[layer] += torch.isposinf(c).sum(0)
        self._invalid[layer] += (torch.isnan(c) | torch.isneginf(c)).sum(0)
        self._fcount[layer] += finite.sum(0)
        self._fsum[layer] += torch.where(finite, c, 0.0).sum(0)
        torch.maximum(self._fmax[layer], torch.where(finite, c, -math.inf).amax(0),
                      out=self._fmax[layer])
        dump = self._edges.numel() + 1
        idx = torch.where(finite, torch.bucketize(c, self._edges), dump)
        self._hist.scatter_add_(0, idx.flatten(), torch.ones_like(idx).flatten())

    def counters(self) -> dict:
        """Host copies (one sync); arrays are nested lists [L][Hq]."""
        return {"count": self._count.tolist(), "covered": self._covered.tolist(),
                "overflow": self._overflow.tolist(), "invalid": self._invalid.tolist(),
                "finite_count": self._fcount.tolist(), "finite_sum": self._fsum.tolist(),
                "finite_max": self._fmax.tolist(), "hist": self._hist[:-1].tolist()}

    def summary(self) -> dict:
        """Totals over layers and heads: records, covered, coverage, overflow, invalid, finite
        max / mean (None when nothing was recorded) and the histogram counts."""
        c = self.counters()
        tot = lambda rows: sum(map(sum, rows))  # noqa: E731
        n, fc = tot(c["count"]), tot(c["finite_count"])
        fmax = max((v for row in c["finite_max"] for v in row), default=-math.inf)
        return {"records": n, "covered": tot(c["covered"]),
                "coverage": tot(c["covered"]) / n if n else None,
                "overflow": tot(c["overflow"]), "invalid": tot(c["invalid"]),
                "finite_max": fmax if math.isfinite(fmax) else None,
                "finite_mean": tot(c["finite_sum"]) / fc if fc else None,
                "histogram_counts": c["hist"]}
