"""Certificate counters from vLLM's worker processes to Prometheus, through files.

Certificates are computed in the worker process; vLLM's ``/metrics`` is served by the
API-server process. The worker keeps a ``witcert.telemetry.CertLog`` and, after the last
layer of every step that had decode queries, rewrites ``<stats_dir>/worker-<pid>.json``
(write to a temporary name, then ``os.replace``: a reader never sees half a file). The
API server's collector reads every snapshot at scrape time and sums them, so /metrics is
exactly the state after the last finished step. Counters are cumulative per worker, so
the sums are monotonic. No vLLM import here (the stat logger lives in ``stat_logger.py``).
With the gate on, the snapshot also holds the gate's counters (``gate.GateEvents``).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from witcert.telemetry import HIST_BINS, CertLog, hist_edges

PREFIX = "witcert"
GATE_KEYS = ("fired", "repaired", "blocks", "tokens", "fallbacks", "raw_covered",
             "before_sum", "before_max", "after_sum", "after_max")


class WorkerStats:
    """Per-worker accumulators: decode certificates (a CertLog) and token counts.

    info: static facts written with every snapshot (method, radius, capacity, ...).
    gate: keep the gate's counters (``WITCERT_VLLM_GATE`` on); the certificates in the
    CertLog are then the delivered ones, after repair.
    """

    def __init__(self, *, num_layers: int, num_q_heads: int, tau: float, stats_dir: str | None,
                 info: dict, gate: bool = False) -> None:
        # stride: only step 0 is kept whole; a server must not grow a buffer per step.
        self.log = CertLog(num_layers=num_layers, num_q_heads=num_q_heads, tau=tau,
                           stride=2**62)
        self.decode_tokens = 0
        self.prefill_tokens = 0
        self.info = dict(info)
        self.gate = dict.fromkeys(GATE_KEYS, 0) if gate else None
        self.path = None if stats_dir is None else Path(stats_dir) / f"worker-{os.getpid()}.json"
        self._pending = False

    def record(self, layer: int, cert, *, decode_tokens: int, prefill_tokens: int,
               prefill_cert=None) -> None:
        """One layer of one engine step: decode certs [Bd, Hq], prefill certs [n, Hq]
        (extend rows' new tokens, counted apart: ``CertLog.record_prefill_``)."""
        if cert is not None and cert.shape[0]:
            self.log.record_(layer, cert)
            self._pending = True
        if prefill_cert is not None and prefill_cert.shape[0]:  # folded now: no decode step
            self.log.record_prefill_(layer, prefill_cert)
        if layer == 0:
            self.decode_tokens += decode_tokens
            self.prefill_tokens += prefill_tokens

    def record_gate(self, events) -> None:
        """Add one layer's ``GateEvents`` (sums; maxima for ``*_max``)."""
        if self.gate is None:
            return
        for k, v in events.as_dict().items():
            self.gate[k] = max(self.gate[k], v) if k.endswith("_max") else self.gate[k] + v

    def end_step(self) -> None:
        if self._pending:
            self.log.end_step_()
            self._pending = False
        self.flush()

    def snapshot(self) -> dict:
        return {"pid": os.getpid(), "info": self.info, "tau": self.log.tau,
                "num_layers": self.log.num_layers, "num_q_heads": self.log.num_q_heads,
                "steps": self.log.steps, "decode_tokens": self.decode_tokens,
                "prefill_tokens": self.prefill_tokens, "counters": self.log.counters(),
                "gate": self.gate}

    def flush(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.snapshot()))
        os.replace(tmp, self.path)


def read_snapshots(stats_dir: str | Path) -> list[dict]:
    d = Path(stats_dir)
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.glob("worker-*.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, json.JSONDecodeError):
            continue  # replaced between glob and read
    return out


def merge(snaps: list[dict]) -> dict:
    """Sum the snapshots of all workers into one summary (same keys as below)."""
    tot = lambda rows: sum(map(sum, rows))  # noqa: E731
    hist = [0] * (HIST_BINS + 2)
    m = {"steps": 0, "decode_tokens": 0, "prefill_tokens": 0, "certificates": 0, "covered": 0,
         "overflow": 0, "invalid": 0, "finite_sum": 0.0, "finite_max": -math.inf,
         "tau": None, "info": {}, "per_layer_count": None, "gate": None,
         "prefill_certificates": 0, "prefill_covered": 0, "prefill_overflow": 0}
    for s in snaps:
        g = s.get("gate")
        if g is not None:
            if m["gate"] is None:
                m["gate"] = dict.fromkeys(GATE_KEYS, 0)
            mg = m["gate"]
            for k in GATE_KEYS:
                mg[k] = max(mg[k], g[k]) if k.endswith("_max") else mg[k] + g[k]
        c = s["counters"]
        p = c.get("prefill")  # absent in snapshots of older versions
        if p is not None:
            m["prefill_certificates"] += tot(p["count"])
            m["prefill_covered"] += tot(p["covered"])
            m["prefill_overflow"] += tot(p["overflow"]) + tot(p["invalid"])
        m["steps"] += s["steps"]
        m["decode_tokens"] += s["decode_tokens"]
        m["prefill_tokens"] += s["prefill_tokens"]
        m["certificates"] += tot(c["count"])
        m["covered"] += tot(c["covered"])
        m["overflow"] += tot(c["overflow"])
        m["invalid"] += tot(c["invalid"])
        m["finite_sum"] += tot(c["finite_sum"])
        m["finite_max"] = max([m["finite_max"]] + [v for row in c["finite_max"] for v in row])
        hist = [a + b for a, b in zip(hist, c["hist"])]
        per = [sum(row) for row in c["count"]]
        m["per_layer_count"] = per if m["per_layer_count"] is None else \
            [a + b for a, b in zip(m["per_layer_count"], per)]
        m["tau"], m["info"] = s["tau"], s["info"]
    n = m["certificates"]
    m["coverage"] = m["covered"] / n if n else None
    m["overflow_fraction"] = m["overflow"] / n if n else None
    m["histogram"] = hist
    if m["gate"] is not None:
        g = m["gate"]
        g["coverage_before"] = g["raw_covered"] / n if n else None
        g["coverage_after"] = m["coverage"]
        g["exact_copy_bytes"] = m["info"].get("exact_copy_bytes", 0)
    return m


class WitcertCollector:
    """Prometheus collector: reads the worker snapshots at scrape time.

    Metrics (prefix ``witcert_``): ``certificates_total`` (one per (layer, query head,
    decode token)), ``decode_tokens_total``, ``decode_steps_total``, ``prefill_tokens_total``,
    ``coverage`` (gauge, label tau: finite and <= tau), ``overflow_total`` and
    ``overflow_fraction`` (cert = +inf, no guarantee), ``invalid_total`` (NaN: a bug if > 0),
    ``certificate`` (histogram; +inf certs only in the +Inf bucket, _sum over finite),
    ``kv_bytes_per_token`` / ``kv_capacity_tokens`` (labels: witcert, baseline).
    Prompt / extend tokens (counted apart from the decode certificates above):
    ``prefill_certificates_total`` (one per (layer, query head, new token)),
    ``prefill_covered_total`` (finite and <= tau), ``prefill_overflow_total`` (+inf or NaN).
    With the gate on (prefix ``witcert_gate_``): ``fired_total`` ((layer, sequence, query
    head) certificates > tau before repair), ``repaired_total`` (of those, <= tau after),
    ``unrepaired_total``, ``repaired_blocks_total`` / ``repaired_tokens_total`` ((block, KV
    head) / (token, KV head) entries made exact), ``fallbacks_total`` (whole-KV-head
    repairs), ``coverage_before`` / ``coverage_after`` (gauges, label tau; after =
    ``witcert_coverage``, the certificates delivered), ``cert_sum_total`` / ``cert_max``
    (label when: before/after repair, finite certificates of the fired heads) and
    ``exact_copy_bytes`` (the exact K/V copy kept for repair, all layers).
    """

    def __init__(self, stats_dir: str) -> None:
        self.stats_dir = stats_dir

    def describe(self):
        return []  # unchecked collector: names come from collect()

    def collect(self):
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            HistogramMetricFamily)

        m = merge(read_snapshots(self.stats_dir))
        p = PREFIX
        for name, doc, key in (
                ("certificates", "certificates emitted, one per (layer, query head, decode token)",
                 "certificates"),
                ("decode_tokens", "decode query tokens attended through witcert", "decode_tokens"),
                ("decode_steps", "engine steps with at least one decode query", "steps"),
                ("prefill_tokens", "prefill/extend query tokens", "prefill_tokens"),
                ("prefill_certificates", "prefill/extend certificates, one per (layer, query head, "
                 "new token)", "prefill_certificates"),
                ("prefill_covered", "prefill/extend certificates finite and <= tau",
                 "prefill_covered"),
                ("prefill_overflow", "prefill/extend certificates +inf or NaN", "prefill_overflow"),
                ("overflow", "certificates that are +inf (no guarantee)", "overflow"),
                ("invalid", "NaN certificates (never expected; a bug if non-zero)", "invalid")):
            yield CounterMetricFamily(f"{p}_{name}", doc, value=m[key])
        tau = "nan" if m["tau"] is None else f"{m['tau']:g}"
        cov = GaugeMetricFamily(f"{p}_coverage", "fraction of certificates finite and <= tau",
                                labels=["tau"])
        cov.add_metric([tau], math.nan if m["coverage"] is None else m["coverage"])
        yield cov
        yield GaugeMetricFamily(f"{p}_overflow_fraction", "fraction of certificates = +inf",
                                value=math.nan if m["overflow_fraction"] is None
                                else m["overflow_fraction"])
        cum, buckets = 0, []
        for le, n in zip(hist_edges().tolist() + [math.inf], m["histogram"]):
            cum += n
            buckets.append(("+Inf" if le == math.inf else repr(le), cum))
        buckets[-1] = ("+Inf", cum + m["overflow"] + m["invalid"])
        yield HistogramMetricFamily(f"{p}_certificate", "TV certificate A-1 per (layer, query "
                                    "head, decode token); _sum over finite values",
                                    buckets=buckets, sum_value=m["finite_sum"])
        info = m["info"]
        if info:
            bpt = GaugeMetricFamily(f"{p}_kv_bytes_per_token", "KV bytes per token, all layers",
                                    labels=["cache"])
            cap = GaugeMetricFamily(f"{p}_kv_capacity_tokens", "tokens the KV pool holds at "
                                    "this memory setting", labels=["cache"])
            for cache in ("witcert", "baseline"):
                bpt.add_metric([cache], info[f"{cache}_bytes_per_token"])
                cap.add_metric([cache], info[f"{cache}_capacity_tokens"])
            yield bpt
            yield cap
        g = m["gate"]
        if g is not None:
            yield from _gate_metrics(g, tau)


def _gate_metrics(g: dict, tau: str):
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    p = f"{PREFIX}_gate"
    for name, doc, value in (
            ("fired", "(layer, sequence, query head) certificates > tau before repair",
             g["fired"]),
            ("repaired", "fired certificates <= tau after repair", g["repaired"]),
            ("unrepaired", "fired certificates still > tau after repair",
             g["fired"] - g["repaired"]),
            ("repaired_blocks", "(block, KV head) pairs made exact", g["blocks"]),
            ("repaired_tokens", "(token, KV head) entries made exact", g["tokens"]),
            ("fallbacks", "whole-KV-head repairs (WITCERT_VLLM_GATE=head)", g["fallbacks"])):
        yield CounterMetricFamily(f"{p}_{name}", doc, value=value)
    for when in ("before", "after"):
        cov = g[f"coverage_{when}"]
        gm = GaugeMetricFamily(f"{p}_coverage_{when}", f"fraction of certificates finite and "
                               f"<= tau {when} repair", labels=["tau"])
        gm.add_metric([tau], math.nan if cov is None else cov)
        yield gm
    cs = CounterMetricFamily(f"{p}_cert_sum", "sum of the finite certificates of fired heads",
                             labels=["when"])
    cm = GaugeMetricFamily(f"{p}_cert_max", "max finite certificate of fired heads",
                           labels=["when"])
    for when in ("before", "after"):
        cs.add_metric([when], g[f"{when}_sum"])
        cm.add_metric([when], g[f"{when}_max"])
    yield cs
    yield cm
    yield GaugeMetricFamily(f"{p}_exact_copy_bytes", "bytes of the exact K/V copy kept for "
                            "repair (all layers, flags and epochs included)",
                            value=g["exact_copy_bytes"])
