"""Certificate telemetry: a device-side log of every certificate, a heatmap, Prometheus.

``CertLog.record_`` is called once per (layer, decode step) from inside the model's
forward pass, so it must never wait for the GPU and must cost little: it copies the
layer's certs into a device step buffer (two small device ops). ``end_step_`` folds the
whole step ``[L, B, Hq]`` into preallocated device accumulators with elementwise ops,
``sum``/``amax`` reductions, ``bucketize`` and ``scatter_add_`` (no boolean indexing, no
``.item()``, no Python branch on a tensor). ``summary()`` is the one place that copies
to the host.

Counting conventions (one "record" = one (layer, query head, step, sequence) cert):
- covered: finite and ``<= tau``. Coverage = covered / all records, so an overflowed
  (``+inf``) certificate counts against coverage; it is never dropped.
- overflow: ``+inf`` (the bound exists but says nothing), reported separately.
- invalid: NaN or ``-inf``. The math never produces these; a non-zero count is a bug
  upstream and is reported, never hidden.
- finite max / mean are over finite certs only.

Prefill / extend certificates (one per (layer, query head, new token)) are recorded with
``record_prefill_`` into separate accumulators (``witcert.runtime.prefill_tally``): ``summary()``
reports them under ``"prefill"``; every other figure is about decode records only.
"""

from __future__ import annotations

import json
import math
import weakref
from pathlib import Path

import torch

from witcert.runtime.prefill_tally import PrefillTally

# Fixed histogram of log10(cert): HIST_BINS bins over [HIST_LO, HIST_HI] decades, plus one
# bin below (cert <= 10**HIST_LO, including 0) and one above (finite, > 10**HIST_HI).
HIST_LO = -8.0
HIST_HI = 2.0
HIST_BINS = 40


def hist_edges() -> torch.Tensor:
    """Upper edges (float64) of the finite histogram bins: ``10**HIST_LO .. 10**HIST_HI``.

    Bin 0 is ``(-inf, edges[0]]``, bin i is ``(edges[i-1], edges[i]]``, the last finite bin
    is ``(edges[-1], +inf)``: Prometheus ``le`` semantics.
    """
    exps = torch.linspace(HIST_LO, HIST_HI, HIST_BINS + 1, dtype=torch.float64)
    return torch.pow(torch.tensor(10.0, dtype=torch.float64), exps)


class CertLog:
    """Accumulates certificates ``[B, Hq]`` per layer on the device, without host syncs.

    num_layers, num_q_heads: the table is ``[L, Hq]``.
    tau: coverage threshold (``CertConfig.tau``).
    stride: every ``stride``-th step (0, stride, 2*stride, ...) is also kept whole in a
        device buffer (``[L, B, Hq]`` per sampled step) for ``to_jsonl``.
    device: where the accumulators live (the device of the certificates).
    """

    def __init__(self, *, num_layers: int, num_q_heads: int, tau: float, stride: int = 1,
                 device: torch.device | str = "cpu") -> None:
        if num_layers < 1 or num_q_heads < 1:
            raise ValueError(f"num_layers={num_layers}, num_q_heads={num_q_heads} must be >= 1")
        if not (tau > 0 and math.isfinite(tau)):
            raise ValueError(f"tau={tau} must be finite and > 0")
        if stride < 1:
            raise ValueError(f"stride={stride} must be >= 1")
        self.num_layers, self.num_q_heads = num_layers, num_q_heads
        self.tau, self.stride = float(tau), stride
        self.device = torch.empty(0, device=device).device  # "cuda" -> "cuda:0", as tensors report
        shape, dev = (num_layers, num_q_heads), self.device
        self._count = torch.zeros(shape, dtype=torch.int64, device=dev)
        self._covered = torch.zeros(shape, dtype=torch.int64, device=dev)
        self._overflow = torch.zeros(shape, dtype=torch.int64, device=dev)
        self._invalid = torch.zeros(shape, dtype=torch.int64, device=dev)
        self._fcount = torch.zeros(shape, dtype=torch.int64, device=dev)
        self._fsum = torch.zeros(shape, dtype=torch.float64, device=dev)
        self._fmax = torch.full(shape, -math.inf, dtype=torch.float64, device=dev)
        self._edges = hist_edges().to(dev)
        # HIST_BINS + 2 real bins, then one dump bin for non-finite values (never reported).
        self._hist = torch.zeros(HIST_BINS + 3, dtype=torch.int64, device=dev)
        self.steps = 0
        self._buf: torch.Tensor | None = None  # float64 [L, B, Hq], certs of the current step
        self._live = torch.zeros(num_layers, dtype=torch.bool, device=self.device)
        self._true = torch.ones((), dtype=torch.bool, device=self.device)
        self._pending_layers: set[int] = set()  # rows of _buf not in the accumulators yet
        self._step_layers: list[int] = []
        self._samples: list[tuple[int, list[int], torch.Tensor]] = []
        self.prefill = PrefillTally(num_layers=num_layers, num_q_heads=num_q_heads, tau=tau,
                                    edges=self._edges, device=self.device)

    # ---- hot path (no host sync) -------------------------------------------------------
    def record_(self, layer: int, cert: torch.Tensor) -> None:
        """Add one layer's certificates of the current step. cert: float ``[B, Hq]``.

        One device op (a copy into the step buffer); the statistics are updated once per
        step, for all layers at once, by ``end_step_``.
        """
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"layer={layer} not in [0, {self.num_layers})")
        if cert.dim() != 2 or cert.shape[1] != self.num_q_heads:
            raise ValueError(f"cert must be [B, {self.num_q_heads}], got {tuple(cert.shape)}")
        if cert.device != self.device:
            raise ValueError(f"cert is on {cert.device}, CertLog on {self.device}")
        B = cert.shape[0]
        if layer in self._pending_layers:  # same layer twice in a step: both records count
            self._accumulate_()
        if self._buf is not None and self._buf.shape[1] != B:
            if self._step_layers:
                raise ValueError(f"batch size changed within one step ({self._buf.shape[1]} -> {B})")
            self._buf = None
        if self._buf is None:
            # float64: a float64 cert must not be rounded down on its way into the log
            self._buf = torch.empty((self.num_layers, B, self.num_q_heads), dtype=torch.float64,
                                    device=self.device)
        self._buf[layer].copy_(cert.detach())
        self._pending_layers.add(layer)
        self._step_layers.append(layer)

    def record_prefill_(self, layer: int, cert: torch.Tensor) -> None:
        """Add one layer's prefill / extend certificates ``[n, Hq]`` (n new tokens): counted
        apart from the decode records, folded at once (device ops, no host sync)."""
        self.prefill.record_(layer, cert)

    def _accumulate_(self) -> None:
        """Fold the recorded rows of the step buffer into the accumulators (device ops)."""
        if not self._pending_layers:
            return
        c = self._buf
        if len(self._pending_layers) == self.num_layers:  # the usual case: a whole step
            live = self._true
            self._count += c.shape[1]
        else:  # rows of layers not (or not yet) recorded hold stale values: mask them
            self._live.zero_()
            for layer in self._pending_layers:
                self._live[layer].fill_(True)  # a kernel; `_live[i] = True` copies from the host
            live = self._live[:, None, None]
            self._count += self._live[:, None].to(torch.int64) * c.shape[1]
        self._fold_(c, live)
        self._pending_layers = set()

    def _fold_(self, c: torch.Tensor, live: torch.Tensor) -> None:
        """Statistics of ``c`` float64 [L, B, Hq] (rows where ``live``) into the accumulators.
        Elementwise ops, reductions and a scatter into preallocated tensors only."""
        finite = torch.isfinite(c) & live
        self._covered += (finite & (c <= self.tau)).sum(1)
        self._overflow += (torch.isposinf(c) & live).sum(1)
        self._invalid += ((torch.isnan(c) | torch.isneginf(c)) & live).sum(1)
        self._fcount += finite.sum(1)
        self._fsum += torch.where(finite, c, 0.0).sum(1)
        torch.maximum(self._fmax, torch.where(finite, c, -math.inf).amax(1), out=self._fmax)
        idx = torch.where(finite, torch.bucketize(c, self._edges), HIST_BINS + 2)
        self._hist.scatter_add_(0, idx.flatten(), torch.ones_like(idx).flatten())

    # ---- captured steps (CUDA graphs) ----------------------------------------------------
    def fold_step_(self, certs: torch.Tensor) -> None:
        """Fold one whole decode step, float64 ``[L, B, Hq]`` on the log's device, into the
        statistics.

        Device ops on preallocated tensors only and no Python state changes, so the call can
        be captured in a CUDA graph: every replay of the graph folds that replay's step.
        The host half of each executed fold is ``count_step_`` (called once per step, after
        the step ran eagerly or as a replay). Not to be mixed with an open ``record_`` step.
        """
        if certs.dtype != torch.float64 or certs.dim() != 3 or certs.shape[0] != self.num_layers \
                or certs.shape[2] != self.num_q_heads:
            raise ValueError(f"certs must be float64 [L={self.num_layers}, B, Hq={self.num_q_heads}], "
                             f"got {certs.dtype} {tuple(certs.shape)}")
        if certs.device != self.device:
            raise ValueError(f"certs are on {certs.device}, CertLog on {self.device}")
        if self._step_layers:
            raise ValueError("fold_step_: a step recorded with record_ is still open (end_step_ it first)")
        self._count += certs.shape[1]
        self._fold_(certs, self._true)

    def count_step_(self, certs: torch.Tensor) -> None:
        """Host bookkeeping of a step folded by ``fold_step_``: advance ``steps`` and, for a
        sampled step, keep a device copy of ``certs`` (no host sync)."""
        if self._step_layers:
            raise ValueError("count_step_: a step recorded with record_ is still open")
        if self.steps % self.stride == 0:
            self._samples.append((self.steps, list(range(self.num_layers)), certs.detach().clone()))
        self.steps += 1

    def end_step_(self) -> None:
        """Close the current decode step: update the statistics, keep the buffer if sampled."""
        self._accumulate_()
        if self._step_layers and self.steps % self.stride == 0:
            self._samples.append((self.steps, sorted(set(self._step_layers)), self._buf))
            self._buf = None  # the sample keeps this one; the next step gets a fresh buffer
        self._step_layers = []
        self.steps += 1

    # ---- host side ---------------------------------------------------------------------
    def counters(self) -> dict:
        """Host copies of the raw accumulators (one sync). Arrays are nested lists [L][Hq].
        Certificates of a step still open (no ``end_step_`` yet) are included."""
        self._accumulate_()
        return {
            "count": self._count.tolist(), "covered": self._covered.tolist(),
            "overflow": self._overflow.tolist(), "invalid": self._invalid.tolist(),
            "finite_count": self._fcount.tolist(), "finite_sum": self._fsum.tolist(),
            "finite_max": self._fmax.tolist(), "hist": self._hist[:HIST_BINS + 2].tolist(),
            "prefill": self.prefill.counters(),
        }

    def summary(self) -> dict:
        """Coverage, overflow, finite max/mean, the per-(layer, head) table and histogram of
        the decode records; ``"prefill"``: the prefill / extend records (``PrefillTally.summary``).

        Fractions are ``None`` when nothing was recorded; ``finite_max``/``finite_mean``
        are ``None`` when no finite cert was recorded (JSON has no inf).
        """
        c = self.counters()
        tot = lambda rows: sum(map(sum, rows))  # noqa: E731
        n, fc = tot(c["count"]), tot(c["finite_count"])
        fmax = max((v for row in c["finite_max"] for v in row), default=-math.inf)

        def ratio(a, b):
            return a / b if b else None

        per = {
            "count": c["count"],
            "coverage": [[ratio(a, b) for a, b in zip(ra, rb)]
                         for ra, rb in zip(c["covered"], c["count"])],
            "overflow": c["overflow"],
            "max": [[v if math.isfinite(v) else None for v in row] for row in c["finite_max"]],
            "mean": [[ratio(a, b) for a, b in zip(ra, rb)]
                     for ra, rb in zip(c["finite_sum"], c["finite_count"])],
        }
        edges = hist_edges().tolist()
        return {
            "tau": self.tau, "steps": self.steps, "records": n,
            "covered": tot(c["covered"]), "coverage": ratio(tot(c["covered"]), n),
            "overflow": tot(c["overflow"]), "overflow_fraction": ratio(tot(c["overflow"]), n),
            "invalid": tot(c["invalid"]),
            "finite_max": fmax if math.isfinite(fmax) else None,
            "finite_mean": ratio(tot(c["finite_sum"]), fc),
            "per_layer_head": per,
            "histogram": {"le": edges + [None], "counts": c["hist"]},
            "prefill": self.prefill.summary(),
        }

    def samples(self) -> list[tuple[int, list[int], torch.Tensor]]:
        """Sampled steps as ``(step, recorded layers, cert float64 [L, B, Hq] on the device)``;
        rows of layers not recorded are undefined. Includes the open step if it is sampled."""
        out = list(self._samples)
        if self._step_layers and self.steps % self.stride == 0:
            out.append((self.steps, sorted(set(self._step_layers)), self._buf))
        return out

    def to_jsonl(self, path: str | Path) -> Path:
        """One JSON line per sampled (step, layer): ``{"step", "layer", "cert": [B][Hq]}``
        (``null`` for a non-finite cert), then a final ``{"summary": ...}`` line."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as f:
            for step, layers, buf in self.samples():
                rows = buf.cpu().tolist()
                for layer in layers:
                    cert = [[v if math.isfinite(v) else None for v in b] for b in rows[layer]]
                    f.write(json.dumps({"step": step, "layer": layer, "cert": cert}) + "\n")
            f.write(json.dumps({"summary": self.summary()}) + "\n")
        return path

    def heatmap_png(self, path: str | Path, *, stat: str = "max") -> Path:
        """Per-(layer, head) ``max`` or ``mean`` finite cert, log colour scale, as a PNG.

        Cells with no finite cert are drawn black; cells with an overflow get an ``x``.
        """
        if stat not in ("max", "mean"):
            raise ValueError(f"stat={stat!r} must be 'max' or 'mean'")
        # Figure + Agg canvas directly: no pyplot, no global backend switch.
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.colors import LogNorm
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
        import numpy as np

        s = self.summary()
        table = np.array([[np.nan if v is None else v for v in row]
                          for row in s["per_layer_head"][stat]], dtype=np.float64)
        table = np.where(table > 0, table, np.nan)  # log scale: 0 and negatives have no colour
        vals = table[np.isfinite(table)]
        lo = float(vals.min()) if vals.size else 1e-6
        hi = float(vals.max()) if vals.size else 1.0
        fig = Figure(figsize=(max(5.0, 0.5 * self.num_q_heads + 2.5),
                              max(3.5, 0.22 * self.num_layers + 1.8)), layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        cmap = matplotlib.colormaps["viridis"].with_extremes(bad="black")
        im = ax.imshow(np.ma.masked_invalid(table), aspect="auto", cmap=cmap,
                       norm=LogNorm(vmin=lo, vmax=max(hi, lo * 1.0001)), interpolation="nearest")
        for li, row in enumerate(s["per_layer_head"]["overflow"]):
            for hi_, n in enumerate(row):
                if n:
                    ax.text(hi_, li, "x", ha="center", va="center", color="red")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("query head")
        ax.set_ylabel("layer")
        cov = "n/a" if s["coverage"] is None else f"{100 * s['coverage']:.2f}%"
        ax.set_title(f"{stat} certificate per (layer, head)\ntau={self.tau:g}, coverage={cov}, "
                     f"steps={s['steps']}", fontsize=9)
        fig.colorbar(im, ax=ax, label=f"{stat} cert (log)")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, format="png", dpi=100)
        return path


class PrometheusExporter:
    """Prometheus metrics fed from a ``CertLog``.

    Uses its own ``CollectorRegistry`` unless one is passed; nothing is registered in the
    global registry. ``update(log, bytes_saved)`` adds what the log gained since the last
    update of the same log (a new log object starts from zero), so counters and the
    histogram stay monotonic across requests. Metrics (prefix ``witcert_``):
    ``coverage`` (gauge, latest log, labelled by tau), ``certificate`` (histogram of all
    certs, ``le`` = log-spaced edges of ``hist_edges()``; ``+inf`` certs land in the
    ``+Inf`` bucket only, and ``_sum`` is over finite certs), ``overflow_total`` (counter
    of non-finite certs: ``+inf``, plus NaN if an upstream bug ever produced one),
    ``bytes_saved`` (gauge), ``steps_total`` (counter). Prefill / extend certificates (not
    in the metrics above): ``prefill_certificates_total``, ``prefill_covered_total`` (finite
    and <= tau), ``prefill_overflow_total`` (``+inf``, plus NaN if a bug ever produced one).
    """

    _PREFILL = ("certificates", "covered", "overflow")

    def __init__(self, registry=None, *, prefix: str = "witcert") -> None:
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry(auto_describe=True) if registry is None else registry
        self.prefix = prefix
        self._edges = hist_edges().tolist()
        self._buckets = [0] * (HIST_BINS + 3)  # finite bins, then the overflow (+inf) bucket
        self._sum = 0.0
        self._overflow = 0
        self._steps = 0
        self._coverage = math.nan
        self._tau = math.nan
        self._bytes_saved = 0.0
        self._prefill = dict.fromkeys(self._PREFILL, 0)
        self._last: tuple[weakref.ref, dict] | None = None
        self.registry.register(self)

    def update(self, cert_log: CertLog, bytes_saved: float = 0.0) -> None:
        c = cert_log.counters()
        tot = lambda rows: sum(map(sum, rows))  # noqa: E731
        p = c["prefill"]
        now = {"hist": c["hist"], "overflow": tot(c["overflow"]) + tot(c["invalid"]),
               "sum": tot(c["finite_sum"]), "steps": cert_log.steps,
               "prefill": {"certificates": tot(p["count"]), "covered": tot(p["covered"]),
                           "overflow": tot(p["overflow"]) + tot(p["invalid"])}}
        prev = self._last[1] if self._last and self._last[0]() is cert_log else None
        if prev is None:
            prev = {"hist": [0] * len(now["hist"]), "overflow": 0, "sum": 0.0, "steps": 0,
                    "prefill": dict.fromkeys(self._PREFILL, 0)}
        for k in self._PREFILL:
            self._prefill[k] += now["prefill"][k] - prev["prefill"][k]
        for i, (a, b) in enumerate(zip(now["hist"], prev["hist"])):
            self._buckets[i] += a - b
        self._buckets[-1] += now["overflow"] - prev["overflow"]
        self._overflow += now["overflow"] - prev["overflow"]
        self._sum += now["sum"] - prev["sum"]
        self._steps += now["steps"] - prev["steps"]
        self._last = (weakref.ref(cert_log), now)
        n = tot(c["count"])
        self._coverage = tot(c["covered"]) / n if n else math.nan
        self._tau = cert_log.tau
        self._bytes_saved = float(bytes_saved)

    def collect(self):
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            HistogramMetricFamily)

        p = self.prefix
        cov = GaugeMetricFamily(f"{p}_coverage", "fraction of (layer, head, step, seq) "
                                "certificates that are finite and <= tau", labels=["tau"])
        cov.add_metric([f"{self._tau:g}"], self._coverage)
        yield cov
        cum, buckets = 0, []
        for le, n in zip(self._edges + [math.inf], self._buckets[:-1]):
            cum += n
            buckets.append((repr(le) if le != math.inf else "+Inf", cum))
        buckets[-1] = ("+Inf", cum + self._buckets[-1])
        yield HistogramMetricFamily(f"{p}_certificate", "TV certificate A-1 per (layer, "
                                    "head, step, seq); _sum over finite values",
                                    buckets=buckets, sum_value=self._sum)
        yield CounterMetricFamily(f"{p}_overflow", "certificates that overflowed to +inf "
                                  "(no guarantee)", value=self._overflow)
        yield GaugeMetricFamily(f"{p}_bytes_saved", "KV bytes saved versus fp16",
                                value=self._bytes_saved)
        yield CounterMetricFamily(f"{p}_steps", "decode steps logged", value=self._steps)
        for k, doc in (("certificates", "prefill/extend certificates, one per (layer, head, new "
                        "token)"), ("covered", "prefill/extend certificates finite and <= tau"),
                       ("overflow", "prefill/extend certificates that overflowed to +inf")):
            yield CounterMetricFamily(f"{p}_prefill_{k}", doc, value=self._prefill[k])

    def render(self) -> bytes:
        """Text exposition format of this exporter's registry."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class GatePrometheus:
    """Prometheus collector of a ``Gate``'s counters (prefix ``witcert_gate_``).

    registry: a ``CollectorRegistry`` (e.g. ``PrometheusExporter(...).registry``, so the
    gate's metrics are served next to the certificate metrics); None for a private one.
    ``track(gate)`` switches to a new request's gate; the counters stay monotonic (a new
    gate's counts are added on top of the previous gates').
    """

    _COUNTERS = ("steps", "steps_gated", "heads_gated", "heads_repaired", "blocks_paged",
                 "entries_paged", "bytes_paged")

    def __init__(self, registry=None, *, prefix: str = "witcert_gate") -> None:
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry(auto_describe=True) if registry is None else registry
        self.prefix = prefix
        self._done = {name: 0 for name in self._COUNTERS}
        self._before = self._after = 0.0
        self._gate = None
        self.registry.register(self)

    def track(self, gate) -> None:
        if self._gate is not None and self._gate is not gate:
            st = self._gate.stats
            for name in self._COUNTERS:
                self._done[name] += getattr(st, name)
            self._before += st.cert_before_sum
            self._after += st.cert_after_sum
        self._gate = gate

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        if self._gate is None:
            return
        st = self._gate.stats
        help_ = {"steps": "decode steps seen by the gate",
                 "steps_gated": "decode steps where some certificate exceeded tau",
                 "heads_gated": "(layer, sequence, query head) certificates above tau",
                 "heads_repaired": "gated certificates brought to <= tau by repair",
                 "blocks_paged": "repair blocks paged in from the exact host backup",
                 "entries_paged": "(slot, kv head) entries paged in",
                 "bytes_paged": "bytes copied host -> device by repair (K and V)"}
        for name in self._COUNTERS:
            yield CounterMetricFamily(f"{self.prefix}_{name}", help_[name],
                                      value=self._done[name] + getattr(st, name))
        yield CounterMetricFamily(f"{self.prefix}_cert_before_sum", "sum of finite gated "
                                  "certificates before repair", value=self._before + st.cert_before_sum)
        yield CounterMetricFamily(f"{self.prefix}_cert_after_sum", "sum of finite gated "
                                  "certificates after repair", value=self._after + st.cert_after_sum)
        exact = 0 if self._gate is None else self._gate.bytes_exact()
        yield GaugeMetricFamily(f"{self.prefix}_exact_store_bytes", "bytes held by the exact "
                                "side store of the current request", value=exact)
