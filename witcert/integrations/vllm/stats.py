"""Certificate counters from vLLM's worker processes to Prometheus, through files.

Certificates are computed in the worker process; vLLM's ``/metrics`` is served by the
API-server process. The worker keeps a ``witcert.runtime.telemetry.CertLog`` and, after the last
layer of every step, rewrites ``<stats_dir>/worker-<instance>-<pid>.json`` (write to a
temporary name, then ``os.replace``: a reader never sees half a file). The API server's
collector (``metrics.py``) reads the snapshots at scrape time and sums them, so /metrics
is exactly the state after the last finished step. Only snapshots of the reader's own
server instance (``lifecycle.Instance``) written by a process that is still running
(same pid and start time) are counted: a stats directory reused across a restart, or a
worker that died, never adds its old counters. Counters are cumulative per worker, so
the sums are monotonic. No vLLM import here. With the gate on, the snapshot also holds
the gate's counters (``gate.GateEvents``) and the exact copy's (``copystore``).
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

from witcert.integrations.vllm import lifecycle
from witcert.runtime.telemetry import HIST_BINS, CertLog

logger = logging.getLogger("vllm.witcert")

PREFIX = "witcert"
GATE_KEYS = ("fired", "repaired", "blocks", "tokens", "fallbacks", "raw_covered",
             "before_sum", "before_max", "after_sum", "after_max")
COPY_KEYS = ("covered_tokens", "evicted_units", "uncopied_tokens")


class WorkerStats:
    """Per-worker accumulators: decode certificates (a CertLog) and token counts.

    info: static facts written with every snapshot (``capacity.capacity_info``).
    gate: keep the gate's counters (``WITCERT_VLLM_GATE`` on); the certificates in the
    CertLog are then the delivered ones, after repair.
    instance: the server instance token (``lifecycle.Instance.token``); None outside a
    server (tests).
    """

    def __init__(self, *, num_layers: int, num_q_heads: int, tau: float, stats_dir: str | None,
                 info: dict, gate: bool = False, instance: str | None = None) -> None:
        # stride: only step 0 is kept whole; a server must not grow a buffer per step.
        self.log = CertLog(num_layers=num_layers, num_q_heads=num_q_heads, tau=tau,
                           stride=2**62)
        self.decode_tokens = 0
        self.prefill_tokens = 0
        self.info = dict(info)
        self.gate = dict.fromkeys(GATE_KEYS, 0) if gate else None
        self.copy = dict.fromkeys(COPY_KEYS, 0) if gate else None
        self.instance = instance
        self.pid_start = lifecycle.process_start(os.getpid())
        name = f"worker-{instance or 'none'}-{os.getpid()}"
        self.path = None if stats_dir is None else Path(stats_dir) / f"{name}.json"
        self._pending = False
        self._warned = False

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

    def record_copy(self, store) -> None:
        """The exact copy's state (``copystore.CopyStore``): tokens held now, units evicted
        and token rows written without a copy so far."""
        if self.copy is not None:
            self.copy.update(covered_tokens=store.covered_tokens,
                             evicted_units=store.evicted_units,
                             uncopied_tokens=store.uncopied_tokens)

    def end_step(self) -> None:
        if self._pending:
            self.log.end_step_()
            self._pending = False
        self.flush()

    def snapshot(self) -> dict:
        return {"pid": os.getpid(), "pid_start": self.pid_start, "instance": self.instance,
                "info": self.info, "tau": self.log.tau,
                "num_layers": self.log.num_layers, "num_q_heads": self.log.num_q_heads,
                "steps": self.log.steps, "decode_tokens": self.decode_tokens,
                "prefill_tokens": self.prefill_tokens, "counters": self.log.counters(),
                "gate": self.gate, "copy": self.copy}

    def flush(self) -> None:
        """Replace the snapshot file. Never fails a step: once the owner is gone
        (``lifecycle.closed``, set under ``lifecycle.snapshot_lock`` with the cleanup) nothing
        is written; a missing directory (removed by its
        owner at shutdown, or by hand) is logged once and skipped."""
        if self.path is None:
            return
        tmp = self.path.with_suffix(".tmp")
        with lifecycle.snapshot_lock():  # never racing the watchdog's cleanup
            if lifecycle.closed():
                return
            try:
                tmp.write_text(json.dumps(self.snapshot()))
                os.replace(tmp, self.path)
            except FileNotFoundError:
                if not self._warned:
                    logger.warning("witcert: stats directory %s is gone; certificate counters "
                                   "are no longer exported", self.path.parent)
                    self._warned = True


def read_snapshots(stats_dir: str | Path, *, instance: str | None = None,
                   live_only: bool = True) -> list[dict]:
    """The snapshots in ``stats_dir`` of server ``instance`` (None: any instance), written by
    a process that still runs (``live_only``)."""
    d = Path(stats_dir)
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.glob("worker-*.json")):
        try:
            snap = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # replaced between glob and read
        if instance is not None and snap.get("instance") != instance:
            continue
        if live_only and not lifecycle.snapshot_alive(snap):
            continue
        out.append(snap)
    return out


def merge(snaps: list[dict]) -> dict:
    """Sum the snapshots of all workers into one summary (same keys as below)."""
    tot = lambda rows: sum(map(sum, rows))  # noqa: E731
    hist = [0] * (HIST_BINS + 2)
    m = {"steps": 0, "decode_tokens": 0, "prefill_tokens": 0, "certificates": 0, "covered": 0,
         "overflow": 0, "invalid": 0, "finite_sum": 0.0, "finite_max": -math.inf,
         "tau": None, "info": {}, "per_layer_count": None, "gate": None, "copy": None,
         "prefill_certificates": 0, "prefill_covered": 0, "prefill_overflow": 0}
    for s in snaps:
        cp = s.get("copy")
        if cp is not None:
            m["copy"] = {k: (m["copy"] or {}).get(k, 0) + cp[k] for k in COPY_KEYS}
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
