"""vLLM stat-logger plugin: witcert's certificate metrics on vLLM's Prometheus /metrics.

vLLM instantiates stat-logger plugins in the API-server process only; the certificates
are computed in the worker process, so this logger registers a collector
(``stats.WitcertCollector``) that reads the workers' snapshot files at scrape time, and
prints a one-line summary (and one for the gate, when it is on) whenever vLLM logs its
own stats. Inert when ``WITCERT_VLLM`` is off.
"""

from __future__ import annotations

import logging
import os

from vllm.v1.metrics.loggers import StatLoggerBase

from witcert.integrations.vllm import settings
from witcert.integrations.vllm.stats import WitcertCollector, merge, read_snapshots

logger = logging.getLogger("witcert.vllm")
_REGISTERED: set[str] = set()


class WitcertStatLogger(StatLoggerBase):
    def __init__(self, vllm_config, engine_index: int = 0) -> None:
        self.stats_dir = settings.load().stats_dir if settings.enabled() else None
        if self.stats_dir is None or self.stats_dir in _REGISTERED:
            return
        from prometheus_client import REGISTRY

        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            logger.warning("witcert: PROMETHEUS_MULTIPROC_DIR is set (several API servers); "
                           "witcert metrics are exported only with a single API server")
        REGISTRY.register(WitcertCollector(self.stats_dir))
        _REGISTERED.add(self.stats_dir)

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
        pass  # the numbers live in the worker; they are read at scrape/log time

    def log(self) -> None:
        if self.stats_dir is None:
            return
        m = merge(read_snapshots(self.stats_dir))
        if not m["certificates"]:
            return
        logger.info("witcert: %d decode tokens, %d certificates, coverage@tau=%g %.4f, "
                    "overflow %.2e, max finite cert %.3g", m["decode_tokens"], m["certificates"],
                    m["tau"], m["coverage"], m["overflow_fraction"], m["finite_max"])
        g = m["gate"]
        if g is not None:
            logger.info("witcert gate: %d fired, %d repaired, %d blocks / %d tokens made exact, "
                        "%d head fallbacks, coverage %.4f before -> %.4f after repair, "
                        "max cert of fired heads %.3g -> %.3g", g["fired"], g["repaired"],
                        g["blocks"], g["tokens"], g["fallbacks"], g["coverage_before"],
                        g["coverage_after"], g["before_max"], g["after_max"])

    def log_engine_initialized(self) -> None:
        if self.stats_dir is None:
            return
        info = merge(read_snapshots(self.stats_dir))["info"]
        if info:
            logger.info("witcert: KV %d B/token (baseline %d), capacity %d tokens (baseline %d "
                        "at the same memory)", info["witcert_bytes_per_token"],
                        info["baseline_bytes_per_token"], info["witcert_capacity_tokens"],
                        info["baseline_capacity_tokens"])
