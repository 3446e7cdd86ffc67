"""Certificate telemetry of the scheduler process, exported in Prometheus format.

The attention backend runs in SGLang's scheduler process (one per TP rank). It records
every decode step's certificates ``[B, Hq]`` per layer into a ``witcert.runtime.telemetry.CertLog``
(and every extend's ``[new tokens, Hq]`` as prefill records, counted apart)
(device-side, no host sync), closes the step when the next forward is planned, and every
``export_every`` steps folds the counters into a ``PrometheusExporter`` (one host copy).
With ``WITCERT_SGLANG_METRICS_PORT`` set, the scheduler serves that registry on
127.0.0.1:port (+ TP rank) for the operator's Prometheus. Besides the exporter's
``witcert_coverage``, ``witcert_certificate`` (histogram), ``witcert_overflow_total``,
``witcert_bytes_saved``, ``witcert_steps_total`` and the prefill counters
(``witcert_prefill_certificates_total``, ``_covered_total``, ``_overflow_total``), this adds:

- ``witcert_records_total``: certificates logged ((layer, head, step, sequence) records);
- ``witcert_gate_events_total``: records over tau (``cert > tau`` or ``+inf``): the steps
  a gate (repair or fallback) would act on;
- ``witcert_overflow_fraction``: overflowed (``+inf``) records / all records;
- ``witcert_kv_capacity_tokens{kv="witcert"|"stock"}``: tokens this pool holds, and what
  a stock KV pool would hold in the same device bytes.
"""

from __future__ import annotations

import logging
import math

import torch

from witcert.runtime.telemetry import CertLog, PrometheusExporter

logger = logging.getLogger(__name__)

_SERVED_PORTS: set[int] = set()
_NEVER_SAMPLE = 2**62  # CertLog keeps sampled steps whole; a server keeps none but step 0


class SchedulerTelemetry:
    """num_layers, num_q_heads: the CertLog table (this rank's layers and query heads).
    tau: coverage / gate threshold. capacity: (witcert tokens, stock tokens) of the pool.
    bytes_saved: device bytes the pool saves versus a stock pool of the same tokens."""

    def __init__(self, *, num_layers: int, num_q_heads: int, tau: float, device,
                 export_every: int, capacity: tuple[int, int], bytes_saved: int,
                 port: int | None = None):
        self.log = CertLog(num_layers=num_layers, num_q_heads=num_q_heads, tau=tau,
                           stride=_NEVER_SAMPLE, device=device)
        self.exporter = PrometheusExporter()
        self.export_every = export_every
        self.capacity = capacity
        self.bytes_saved = bytes_saved
        self.records = self.gate_events = self.overflow = 0
        self.gate = None  # witcert.runtime.repair.Gate when WITCERT_SGLANG_GATE is on
        self._open = False
        self.exporter.registry.register(_Extra(self))
        if port is not None and port not in _SERVED_PORTS:
            from prometheus_client import start_http_server

            start_http_server(port, addr="127.0.0.1", registry=self.exporter.registry)
            _SERVED_PORTS.add(port)
            logger.info("witcert metrics on http://127.0.0.1:%d/metrics", port)

    def record(self, layer: int, cert: torch.Tensor | None) -> None:
        """Certificates ``[B, Hq]`` of one layer in the current decode step."""
        if cert is None:
            return
        self.log.record_(layer, cert)
        self._open = True

    def record_prefill(self, layer: int, cert: torch.Tensor) -> None:
        """Certificates ``[n, Hq]`` of one layer's extend (n new tokens), counted apart."""
        self.log.record_prefill_(layer, cert)

    def end_step(self) -> None:
        """Close the decode step in progress (if any); export every ``export_every`` steps."""
        if not self._open:
            return
        self.log.end_step_()
        self._open = False
        if (self.log.steps - 1) % self.export_every == 0:
            self.export()

    def export(self) -> dict:
        """Fold the log into the Prometheus metrics (host copy); returns the summary."""
        s = self.log.summary()
        self.exporter.update(self.log, bytes_saved=self.bytes_saved)
        self.records = s["records"]
        self.gate_events = s["records"] - s["covered"]
        self.overflow = s["overflow"]
        cov = s["coverage"]
        logger.info("witcert: steps=%d records=%d coverage@%g=%s gate_events=%d overflow=%d "
                    "prefill_records=%d", s["steps"], s["records"], s["tau"],
                    "n/a" if cov is None else f"{cov:.4f}", self.gate_events, self.overflow,
                    s["prefill"]["records"])
        return s

    def render(self) -> bytes:
        return self.exporter.render()


class _Extra:
    """Custom collector: the counters ``PrometheusExporter`` does not have."""

    def __init__(self, t: SchedulerTelemetry):
        self.t = t

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        t = self.t
        yield CounterMetricFamily("witcert_records", "certificates logged ((layer, head, "
                                  "step, sequence) records)", value=t.records)
        yield CounterMetricFamily("witcert_gate_events", "records with cert > tau or +inf "
                                  "(after the gate, if on: what is left above tau)",
                                  value=t.gate_events)
        if t.gate is not None:
            g = t.gate.stats
            for name, doc, value in (
                    ("gate_heads_gated", "(layer, sequence, query head) records the gate "
                     "fired on (cert > tau before repair)", g.heads_gated),
                    ("gate_heads_repaired", "of those, cert <= tau after repair",
                     g.heads_repaired),
                    ("gate_entries_paged", "(slot, KV head) entries made exact",
                     g.entries_paged)):
                yield CounterMetricFamily(f"witcert_{name}", doc, value=value)
        yield GaugeMetricFamily("witcert_overflow_fraction", "fraction of records whose "
                                "certificate overflowed to +inf",
                                value=t.overflow / t.records if t.records else math.nan)
        cap = GaugeMetricFamily("witcert_kv_capacity_tokens", "KV tokens of this pool "
                                "(witcert) and of a stock pool in the same device bytes",
                                labels=["kv"])
        cap.add_metric(["witcert"], t.capacity[0])
        cap.add_metric(["stock"], t.capacity[1])
        yield cap
