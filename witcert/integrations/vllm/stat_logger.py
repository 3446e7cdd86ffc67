"""vLLM stat-logger plugin: witcert's certificate metrics on vLLM's Prometheus /metrics.

vLLM instantiates stat-logger plugins in the API-server process only; the certificates
are computed in the worker process, so this logger registers a collector
(``metrics.WitcertCollector``) that reads the workers' snapshot files at scrape time. It
logs through vLLM's own logger tree (``vllm.witcert``, so vLLM's handler and
``VLLM_LOGGING_LEVEL`` apply): the capacity line once the engine is up, and with vLLM's
periodic stats (``Engine 000: Avg prompt throughput ...``, every
``VLLM_LOG_STATS_INTERVAL`` seconds, not under ``--disable-log-stats``) a summary line
``witcert: N decode tokens, ...`` (and ``witcert gate: ...`` with the gate) whenever the
counters moved since the last one. Inert when ``WITCERT_VLLM`` is off.
"""

from __future__ import annotations

import logging
import os

from vllm.v1.metrics.loggers import StatLoggerBase

from witcert.integrations.vllm import settings
from witcert.integrations.vllm.capacity import capacity_info
from witcert.integrations.vllm.lifecycle import Instance
from witcert.integrations.vllm.metrics import WitcertCollector, summary_lines

logger = logging.getLogger("vllm.witcert")
_REGISTERED: dict[str, WitcertCollector] = {}


def _pool_info(s: settings.Settings, vllm_config) -> dict | None:
    """Capacity facts from the API server's copy of the config (vLLM sets the block count
    in it once the engine core reports it), None if not known yet."""
    try:
        mc, pc, cc = vllm_config.model_config, vllm_config.parallel_config, \
            vllm_config.cache_config
        if not cc.num_gpu_blocks:
            return None
        return capacity_info(s, num_layers=mc.get_num_layers(pc),
                             num_kv_heads=mc.get_num_kv_heads(pc), head_dim=mc.get_head_size(),
                             model_dtype=str(mc.dtype).removeprefix("torch."),
                             itemsize=mc.dtype.itemsize, num_blocks=cc.num_gpu_blocks,
                             block_size=cc.block_size)
    except (AttributeError, TypeError, ValueError) as e:
        logger.warning("witcert: capacity figures unavailable at start-up (%s); they appear "
                       "with the first worker snapshot", e)
        return None


class WitcertStatLogger(StatLoggerBase):
    def __init__(self, vllm_config, engine_index: int = 0) -> None:
        self.collector: WitcertCollector | None = None
        self._last: tuple | None = None
        if not settings.enabled():
            return
        s = settings.load()
        if s.stats_dir is None:
            return
        self.settings, self.vllm_config = s, vllm_config
        hit = _REGISTERED.get(s.stats_dir)
        if hit is not None:
            self.collector = hit
            return
        from prometheus_client import REGISTRY

        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            logger.warning("witcert: PROMETHEUS_MULTIPROC_DIR is set (several API servers); "
                           "witcert metrics are exported only with a single API server")
        inst = Instance.decode(s.instance) if s.instance else None
        self.collector = WitcertCollector(s.stats_dir, instance=None if inst is None
                                          else inst.token, tau=s.cert.tau, gate=s.gate,
                                          info=_pool_info(s, vllm_config))
        REGISTRY.register(self.collector)
        _REGISTERED[s.stats_dir] = self.collector

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
        pass  # the numbers live in the worker; they are read at scrape/log time

    def log(self) -> None:
        if self.collector is None:
            return
        m = self.collector.summary()
        key = (m["decode_tokens"], m["certificates"], m["prefill_tokens"])
        if key == self._last:
            return  # nothing new since the last line (vLLM logs its own idle lines too)
        self._last = key
        for line in summary_lines(m, tau=self.settings.cert.tau):
            logger.info("%s", line)

    def log_engine_initialized(self) -> None:
        if self.collector is None:
            return
        if self.collector.info is None:  # the block count is known by now
            self.collector.info = _pool_info(self.settings, self.vllm_config)
        info = self.collector.info
        if not info:
            return
        line = (f"witcert: KV {info['witcert_bytes_per_token']} B/token (vLLM's own "
                f"{info['baseline_bytes_per_token']}), capacity {info['witcert_capacity_tokens']} "
                f"tokens (vLLM's own cache: {info['baseline_capacity_tokens']} in the same memory)")
        if info["gate"] != "off":
            line += (f"; gate exact copy {info['exact_copy_bytes'] / 2**20:.1f} MiB outside the "
                     f"KV budget ({info['exact_copy_capacity_tokens']} tokens can hold a copy), "
                     f"pages + copy {info['memory_bytes'] / 2**20:.1f} MiB would hold "
                     f"{info['baseline_capacity_tokens_same_memory']} tokens of vLLM's own cache")
        logger.info("%s", line)
