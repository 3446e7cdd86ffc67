"""witcert's Prometheus metrics, read from the worker snapshots at scrape time.

``WitcertCollector`` is registered on vLLM's registry by the stat logger in the API-server
process. Every series exists from start-up with a value that is defined then: counters at
0, labels fixed for the life of the server (``tau`` comes from the settings, which every
process reads from the same environment), capacity gauges from vLLM's block count
(``capacity.capacity_info``). Ratios of counters (``witcert_coverage``,
``witcert_overflow_fraction``, ``witcert_gate_coverage_before/_after``) are exported only
once there is a certificate (a ratio over nothing is not a number); before that, and for
windows, use the counters: ``rate(witcert_covered_total[5m]) /
rate(witcert_certificates_total[5m])``.
"""

from __future__ import annotations

import math

from witcert.integrations.vllm.stats import GATE_KEYS, merge, read_snapshots
from witcert.runtime.telemetry import hist_edges

PREFIX = "witcert"


class WitcertCollector:
    """Prometheus collector over the snapshots of one server instance.

    stats_dir: the shared stats directory; instance: the server's token (None: any live
    snapshot); tau: the coverage threshold (label); gate: whether the gate is on (its
    series then exist from the start); info: the capacity facts (None: from the snapshots).

    Metrics (prefix ``witcert_``): ``certificates_total`` (one per (layer, query head,
    decode token)), ``covered_total`` (finite and <= tau), ``decode_tokens_total``,
    ``decode_steps_total``, ``prefill_tokens_total``, ``overflow_total`` (cert = +inf),
    ``invalid_total`` (NaN: a bug if > 0), ``coverage`` / ``overflow_fraction`` (gauges,
    once defined), ``certificate`` (histogram; +inf only in +Inf, _sum over finite),
    ``kv_bytes_per_token`` / ``kv_capacity_tokens`` (label cache), ``memory_bytes`` (label
    part: pages, exact_copy). Prompt / extend tokens, counted apart from the decode
    certificates: ``prefill_certificates_total`` (one per (layer, query head, new token)),
    ``prefill_covered_total`` (finite and <= tau), ``prefill_overflow_total`` (+inf or NaN).
    With the gate, ``gate_*`` (see ``_gate_metrics``).
    """

    def __init__(self, stats_dir: str, *, instance: str | None = None, tau: float,
                 gate: bool = False, info: dict | None = None) -> None:
        self.stats_dir, self.instance, self.tau, self.gate = stats_dir, instance, tau, gate
        self.info = info

    def describe(self):
        return []  # unchecked collector: names come from collect()

    def summary(self) -> dict:
        return merge(read_snapshots(self.stats_dir, instance=self.instance))

    def collect(self):
        from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                            HistogramMetricFamily)

        m = self.summary()
        p, tau = PREFIX, f"{self.tau:g}"
        for name, doc, key in (
                ("certificates", "certificates emitted, one per (layer, query head, decode token)",
                 "certificates"),
                ("covered", "certificates finite and <= tau", "covered"),
                ("decode_tokens", "one-token query rows attended through witcert (decode "
                 "queries; see docs/VLLM.md for the relation to completion tokens)",
                 "decode_tokens"),
                ("decode_steps", "engine steps with at least one decode query", "steps"),
                ("prefill_tokens", "query tokens of prefill/extend rows", "prefill_tokens"),
                ("prefill_certificates", "prefill/extend certificates, one per (layer, query "
                 "head, new token)", "prefill_certificates"),
                ("prefill_covered", "prefill/extend certificates finite and <= tau",
                 "prefill_covered"),
                ("prefill_overflow", "prefill/extend certificates +inf or NaN",
                 "prefill_overflow"),
                ("overflow", "certificates that are +inf (no guarantee)", "overflow"),
                ("invalid", "NaN certificates (never expected; a bug if non-zero)", "invalid")):
            yield CounterMetricFamily(f"{p}_{name}", doc, value=m[key])
        if m["certificates"]:
            cov = GaugeMetricFamily(f"{p}_coverage", "fraction of certificates finite and "
                                    "<= tau since start", labels=["tau"])
            cov.add_metric([tau], m["coverage"])
            yield cov
            yield GaugeMetricFamily(f"{p}_overflow_fraction", "fraction of certificates = +inf "
                                    "since start", value=m["overflow_fraction"])
        cum, buckets = 0, []
        for le, n in zip(hist_edges().tolist() + [math.inf], m["histogram"]):
            cum += n
            buckets.append(("+Inf" if le == math.inf else repr(le), cum))
        buckets[-1] = ("+Inf", cum + m["overflow"] + m["invalid"])
        yield HistogramMetricFamily(f"{p}_certificate", "TV certificate A-1 per (layer, query "
                                    "head, decode token); _sum over finite values",
                                    buckets=buckets, sum_value=m["finite_sum"])
        info = self.info or m["info"]
        if info:
            yield from _capacity_metrics(info)
        if self.gate or m["gate"] is not None:
            yield from _gate_metrics(m, info or {}, tau)


def _capacity_metrics(info: dict):
    from prometheus_client.core import GaugeMetricFamily

    p = PREFIX
    bpt = GaugeMetricFamily(f"{p}_kv_bytes_per_token", "KV bytes per token, all layers",
                            labels=["cache"])
    cap = GaugeMetricFamily(f"{p}_kv_capacity_tokens", "tokens the KV pool holds; baseline: "
                            "vLLM's own cache in witcert's page memory; "
                            "baseline_same_memory: in the pages plus the gate's exact copy",
                            labels=["cache"])
    for cache in ("witcert", "baseline"):
        bpt.add_metric([cache], info[f"{cache}_bytes_per_token"])
        cap.add_metric([cache], info[f"{cache}_capacity_tokens"])
    cap.add_metric(["baseline_same_memory"], info["baseline_capacity_tokens_same_memory"])
    yield bpt
    yield cap
    mem = GaugeMetricFamily(f"{p}_memory_bytes", "most memory the plugin holds for KV: "
                            "pages (inside vLLM's KV budget) and the gate's exact copy "
                            "(outside it)", labels=["part"])
    mem.add_metric(["pages"], info["kv_pool_bytes"])
    mem.add_metric(["exact_copy"], info["exact_copy_bytes"])
    yield mem


def _gate_metrics(m: dict, info: dict, tau: str):
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    p = f"{PREFIX}_gate"
    g = m["gate"] or dict.fromkeys(GATE_KEYS, 0)
    n = m["certificates"]
    for name, doc, value in (
            ("fired", "(layer, sequence, query head) certificates > tau before repair",
             g["fired"]),
            ("repaired", "fired certificates <= tau after repair", g["repaired"]),
            ("unrepaired", "fired certificates still > tau after repair (no finite exact "
             "copy, or none held under WITCERT_VLLM_GATE_COPY)", g["fired"] - g["repaired"]),
            ("repaired_blocks", "(block, KV head) pairs made exact", g["blocks"]),
            ("repaired_tokens", "(token, KV head) entries made exact", g["tokens"]),
            ("fallbacks", "whole-KV-head repairs (WITCERT_VLLM_GATE=head)", g["fallbacks"]),
            ("covered_before", "certificates finite and <= tau before repair",
             g["raw_covered"])):
        yield CounterMetricFamily(f"{p}_{name}", doc, value=value)
    if n:
        for when, value in (("before", g["raw_covered"] / n), ("after", m["coverage"])):
            gm = GaugeMetricFamily(f"{p}_coverage_{when}", f"fraction of certificates finite "
                                   f"and <= tau {when} repair, since start", labels=["tau"])
            gm.add_metric([tau], value)
            yield gm
    cs = CounterMetricFamily(f"{p}_cert_sum", "sum of the finite certificates of fired heads",
                             labels=["when"])
    cm = GaugeMetricFamily(f"{p}_cert_max", "max finite certificate of fired heads (0 before "
                           "any fired)", labels=["when"])
    for when in ("before", "after"):
        cs.add_metric([when], g[f"{when}_sum"])
        cm.add_metric([when], g[f"{when}_max"])
    yield cs
    yield cm
    yield GaugeMetricFamily(f"{p}_exact_copy_bytes", "most bytes the exact K/V copy holds "
                            "(K/V rows within WITCERT_VLLM_GATE_COPY, flags and epochs)",
                            value=info.get("exact_copy_bytes", 0))
    yield GaugeMetricFamily(f"{p}_exact_copy_capacity_tokens", "tokens that can hold an "
                            "exact copy at once", value=info.get("exact_copy_capacity_tokens", 0))
    cp = m["copy"] or {}
    held = cp.get("covered_tokens")
    if held is None:  # no step yet: an unbounded copy covers every slot, a bounded one none
        cap = info.get("exact_copy_capacity_tokens", 0)
        held = cap if cap == info.get("witcert_capacity_tokens") else 0
    yield GaugeMetricFamily(f"{p}_exact_copy_tokens", "slots holding an exact copy now",
                            value=held)
    yield CounterMetricFamily(f"{p}_exact_copy_evicted_blocks", "units of KV blocks whose copy "
                              "was released for newer ones (bounded copy)",
                              value=cp.get("evicted_units", 0))
    yield CounterMetricFamily(f"{p}_uncopied_tokens", "token rows written without an exact "
                              "copy (bound reached; they cannot be repaired)",
                              value=cp.get("uncopied_tokens", 0))


def summary_lines(m: dict, *, tau: float) -> list[str]:
    """The log lines of one summary (empty before the first certificate)."""
    if not m["certificates"]:
        return []
    lines = [f"witcert: {m['decode_tokens']} decode tokens, {m['certificates']} certificates, "
             f"coverage@tau={tau:g} {m['coverage']:.4f}, overflow {m['overflow_fraction']:.2e}, "
             f"max finite cert {m['finite_max']:.3g}"]
    g = m["gate"]
    if g is not None:
        lines.append(f"witcert gate: {g['fired']} fired, {g['repaired']} repaired, "
                     f"{g['fired'] - g['repaired']} unrepaired, {g['blocks']} blocks / "
                     f"{g['tokens']} tokens made exact, {g['fallbacks']} head fallbacks, coverage "
                     f"{g['coverage_before']:.4f} before -> {g['coverage_after']:.4f} after "
                     f"repair, max cert of fired heads {g['before_max']:.3g} -> "
                     f"{g['after_max']:.3g}")
    return lines
