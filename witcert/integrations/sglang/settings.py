"""The SGLang plugin's settings, read from the environment in this one place.

SGLang loads ``sglang.srt.plugins`` entry points in every process (HTTP server, scheduler,
detokenizer), and the scheduler is a child process, so the environment is what reaches
all of them. What switches witcert ON is the attention backend name: ``--attention-backend
witcert``. Without it every hook passes through and SGLang runs stock. The variables
below only tune a server that selected witcert:

- ``WITCERT_SGLANG_PRESET``: a preset of ``witcert.config.PRESETS`` (default ``default``).
- ``WITCERT_SGLANG_TAU``: coverage threshold, overrides the preset's ``CertConfig.tau``.
- ``WITCERT_SGLANG_SEED``: 64-bit dither seed (default: a fresh secret seed per pool).
- ``WITCERT_SGLANG_SPLITS``: decode KV splits: ``sglang`` (default: SGLang's own
  ``--triton-attention-num-kv-splits``, the split count of its two-stage decode),
  ``auto`` (witcert plans per request from its length) or a positive integer.
- ``WITCERT_SGLANG_METRICS_PORT``: port of the scheduler's Prometheus endpoint on
  127.0.0.1 (unset: no endpoint; the counters are still kept and logged).
- ``WITCERT_SGLANG_EXPORT_EVERY``: decode steps between two exporter updates (one host
  copy of the counters each time; default 16).
- ``WITCERT_SGLANG_EXACT_BACKUP``: ``1`` (default) keeps the exact K/V on the host for
  repair; ``0`` drops it (no repair, and ``move_kv_cache`` is refused).
- ``WITCERT_SGLANG_GATE``: ``off`` (default, also unset): certificates only; ``on`` / ``1`` /
  ``block``: every decode certificate above tau is repaired by the gate (exact blocks from the
  host copy until ``cert <= tau``, ``witcert.runtime.repair.Gate``, the same gate as HF and vLLM's
  native path); ``head``: whole-KV-head fallback. Needs the exact backup and a CPU pool
  (the decode paths that read exact entries: native C or the reference).

A server has no decode horizon, so the risk budget is the ``anytime`` allocation (docs/MATH.md §4)
indexed by the attended length of each decode query (distinct at every step of a request).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from witcert.config import CertConfig, QuantConfig, RepairPolicy
from witcert.settings import engine_preset, gate_mode

BACKEND_NAME = "witcert"

ENV_PRESET = "WITCERT_SGLANG_PRESET"
ENV_TAU = "WITCERT_SGLANG_TAU"
ENV_SEED = "WITCERT_SGLANG_SEED"
ENV_SPLITS = "WITCERT_SGLANG_SPLITS"
ENV_METRICS_PORT = "WITCERT_SGLANG_METRICS_PORT"
ENV_EXPORT_EVERY = "WITCERT_SGLANG_EXPORT_EVERY"
ENV_EXACT_BACKUP = "WITCERT_SGLANG_EXACT_BACKUP"
ENV_GATE = "WITCERT_SGLANG_GATE"


@dataclass(frozen=True)
class Settings:
    """preset: name in ``PRESETS``; quant, cert: the configs the pool and backend use.
    splits: ``"sglang"``, ``"auto"`` or an int >= 1. metrics_port: None or a TCP port.
    export_every: steps between exporter updates. exact_backup: keep the host copy.
    repair: the gate's ``RepairPolicy`` (mode ``off``: no gate)."""

    preset: str
    quant: QuantConfig
    cert: CertConfig
    splits: str | int
    metrics_port: int | None
    export_every: int
    exact_backup: bool
    repair: RepairPolicy = RepairPolicy()

    def __post_init__(self) -> None:
        if self.quant.method != "dither8":
            raise ValueError(f"{ENV_PRESET}={self.preset}: the SGLang pool stores dither8 only, "
                             f"got {self.quant.method!r}")
        if self.quant.outliers:
            raise ValueError(f"{ENV_PRESET}={self.preset}: outlier bypass needs per-layer "
                             "calibration, which the SGLang integration does not run")
        if not (self.splits in ("sglang", "auto") or (isinstance(self.splits, int) and self.splits >= 1)):
            raise ValueError(f"{ENV_SPLITS}={self.splits!r}: expected sglang, auto or an int >= 1")
        if self.metrics_port is not None and not 0 < self.metrics_port < 65536:
            raise ValueError(f"{ENV_METRICS_PORT}={self.metrics_port}: not a TCP port")
        if self.export_every < 1:
            raise ValueError(f"{ENV_EXPORT_EVERY}={self.export_every}: must be >= 1")
        if self.repair.mode != "off" and not self.exact_backup:
            raise ValueError(f"{ENV_GATE}={self.repair.mode}: the gate repairs from the exact "
                             f"host copy; it needs {ENV_EXACT_BACKUP}=1")


@functools.lru_cache(maxsize=None)
def _parse(preset: str, tau: str, seed: str, splits: str, port: str, every: str,
           backup: str, gate: str = "") -> Settings:
    name = preset or "default"
    quant, cert = engine_preset(name, tau=tau, seed=seed, env_name=ENV_PRESET)
    split = splits.lower() or "sglang"
    mode = gate_mode(gate, env_name=ENV_GATE)
    return Settings(preset=name, quant=quant, cert=cert,
                    splits=split if split in ("sglang", "auto") else int(split),
                    metrics_port=int(port) if port else None,
                    export_every=int(every) if every else 16,
                    exact_backup=backup.lower() not in ("0", "off", "false", "no"),
                    repair=RepairPolicy(mode=mode))


def load() -> Settings:
    """The settings of this process; ``ValueError`` (naming the variable) if malformed."""
    env = lambda k: os.environ.get(k, "").strip()  # noqa: E731
    return _parse(env(ENV_PRESET), env(ENV_TAU), env(ENV_SEED), env(ENV_SPLITS),
                  env(ENV_METRICS_PORT), env(ENV_EXPORT_EVERY), env(ENV_EXACT_BACKUP),
                  env(ENV_GATE))
