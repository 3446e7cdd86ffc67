"""The plugin's settings, read from the environment in this one place.

vLLM starts the API server, the engine core and the workers as separate processes and
loads plugins in each of them, so an environment variable is the one switch that
reaches all of them. The plugin is OFF unless ``WITCERT_VLLM`` names a preset:

- ``WITCERT_VLLM``: ``off``/``0``/unset (vLLM untouched), ``on``/``1`` (= ``default``),
  or a preset of ``witcert.config.PRESETS`` (``default``, ``deterministic``, ``dither16``, ``fast8``).
- ``WITCERT_VLLM_TAU``: coverage threshold, overrides the preset's ``CertConfig.tau``.
- ``WITCERT_VLLM_SEED``: 64-bit dither seed (default: fresh secret seed per worker).
- ``WITCERT_VLLM_STATS_DIR``: where workers write certificate counters for /metrics;
  set by the plugin in the first process when absent (children inherit it): a fresh
  directory under ``/dev/shm`` when writable (tmpfs), else under the system temp dir.
- ``WITCERT_VLLM_GATE``: in-engine gating (repair from an exact copy), off by default.
  ``off``/``0``/unset: certificates only; ``on``/``1``/``block``: block repair (the
  16-token blocks of the KV head with the largest contribution made exact until
  ``cert <= tau``); ``head``: whole-KV-head fallback (every token of the KV head exact).
  With the gate on every worker keeps an exact copy of K and V in the model dtype
  (``Settings.repair`` is the ``witcert.config.RepairPolicy``; ``off`` when not gating).
- ``WITCERT_VLLM_NATIVE``: the fused C decode and write (``witcert.native``: one C pass per
  (sequence, KV head) reads the pages, regenerates the dither, attends and certifies; the
  write encodes new tokens in C; both bitwise the reference where the reference is exact,
  float64 softmax and certificate). ``auto`` (default): built with gcc at worker start-up,
  the torch reference path with one warning if it cannot build; ``on``/``1``: start-up
  fails if it cannot build; ``off``/``0``: the torch reference path. Unset or empty: the
  library-wide ``WITCERT_BACKEND`` decides (``native`` -> ``on``, ``ref`` -> ``off``,
  ``auto`` or ``triton`` -> ``auto``: this CPU plugin has no Triton path), so one switch
  picks the implementation everywhere. Deprecated: set ``WITCERT_BACKEND`` instead (``native``
  = ``on``, ``ref`` = ``off``); a set ``WITCERT_VLLM_NATIVE`` is still honoured, with one
  warning per process naming the replacement.
- ``WITCERT_VLLM_GATE_COPY``: memory bound of the gate's exact K/V copy. ``all`` (default,
  also unset): a copy of every slot of vLLM's pool; a size (``512MiB``, ``2GiB``, ``1.5GB``,
  plain bytes; ``0`` keeps no copy): the copy holds at most that many bytes of K/V rows
  (whole KV blocks, least recently used first out); a token without a copy cannot be made
  exact, so a head that needs it is reported unrepaired (``copystore``).
- ``WITCERT_VLLM_DITHER_KEY``: what keys the dither (docs/MATH.md §6). ``slot`` (default,
  also unset): the token's cache slot and the slot's epoch (bumped at every write), so
  every write gets a fresh dither stream; ``position``: the token's position in its
  sequence and one server-wide nonce (``POSITION_NONCE``), so identical requests get the
  identical dither wherever vLLM places them and are answered identically. Gating needs
  the slot key (its exact entries are tracked by slot epoch): ``position`` with
  ``WITCERT_VLLM_GATE`` on stops start-up.

Internal (set by ``register()`` in the first process, inherited by the engine core and the
workers; never set it by hand): ``WITCERT_VLLM_INSTANCE`` names the server instance (owner
pid and start time, a random token, whether the plugin made the stats directory), so a
reused stats directory never mixes two servers' counters and the children can watch
their owner (``lifecycle``).

A server has no decode horizon, so the risk budget is always the ``anytime`` allocation
(docs/MATH.md §4), indexed by the token position of each decode query.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from witcert.config import PRESETS, CertConfig, QuantConfig, RepairPolicy
from witcert.settings import OFF_WORDS, ON_WORDS, engine_preset, gate_mode

ENV_ENABLE = "WITCERT_VLLM"
ENV_TAU = "WITCERT_VLLM_TAU"
ENV_SEED = "WITCERT_VLLM_SEED"
ENV_STATS_DIR = "WITCERT_VLLM_STATS_DIR"
ENV_GATE = "WITCERT_VLLM_GATE"
ENV_NATIVE = "WITCERT_VLLM_NATIVE"
ENV_GATE_COPY = "WITCERT_VLLM_GATE_COPY"
ENV_DITHER_KEY = "WITCERT_VLLM_DITHER_KEY"
DITHER_KEYS = ("slot", "position")
# The counter word 3 of every stored token under the position key (one nonce for the whole
# server: identical requests must get identical dither). A public constant, not derived from
# the seed: the radius needs counters chosen without knowledge of the seed (MATH §6), and
# the seed already makes the stream differ between servers.
POSITION_NONCE = 0
ENV_INSTANCE = "WITCERT_VLLM_INSTANCE"
NATIVE_MODES = ("auto", "on", "off")
GATE_BLOCK_TOKENS = 16



@dataclass(frozen=True)
class Settings:
    preset: str
    quant: QuantConfig
    cert: CertConfig
    stats_dir: str | None
    repair: RepairPolicy = RepairPolicy()
    native: str = "auto"  # one of NATIVE_MODES
    gate_copy_bytes: int | None = None  # None: a copy of every slot (WITCERT_VLLM_GATE_COPY=all)
    instance: str | None = None  # WITCERT_VLLM_INSTANCE, as set by register()
    dither_key: str = "slot"  # one of DITHER_KEYS (WITCERT_VLLM_DITHER_KEY)

    @property
    def gate(self) -> bool:
        return self.repair.mode != "off"

    def __post_init__(self) -> None:
        if self.gate_copy_bytes is not None and self.gate_copy_bytes < 0:
            raise ValueError(f"{ENV_GATE_COPY}={self.gate_copy_bytes}: must be >= 0 or 'all'")
        if self.dither_key not in DITHER_KEYS:
            raise ValueError(f"{ENV_DITHER_KEY}={self.dither_key!r}: expected slot or position")
        if self.dither_key == "position" and self.gate:
            raise ValueError(f"{ENV_DITHER_KEY}=position with {ENV_GATE}={self.repair.mode}: the "
                             "gate tracks exact entries by slot epoch and needs the slot key; "
                             f"unset one of them")
        if self.native not in NATIVE_MODES:
            raise ValueError(f"{ENV_NATIVE}={self.native!r}: expected one of {NATIVE_MODES}")
        if self.quant.method != "dither8":
            raise ValueError(f"{ENV_ENABLE}: the vLLM pool stores dither8 only, got "
                             f"{self.quant.method!r}")
        if self.quant.outliers:
            raise ValueError(f"{ENV_ENABLE}={self.preset}: outlier bypass needs per-layer "
                             "calibration, which the vLLM integration does not run; "
                             "use a preset without outliers")


def enabled() -> bool:
    return os.environ.get(ENV_ENABLE, "").strip().lower() not in OFF_WORDS


def _native_mode(value: str) -> str:
    v = value.strip().lower()
    if v in ("", "auto"):
        return "auto"
    if v in ON_WORDS:
        return "on"
    if v in OFF_WORDS:
        return "off"
    raise ValueError(f"{ENV_NATIVE}={value!r}: expected auto, on or off")


_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
          "gb": 1000**3, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(value: str, *, name: str = ENV_GATE_COPY) -> int | None:
    """``all`` / empty -> None (no bound); else bytes from ``<number>[unit]`` (``512MiB``,
    ``1.5GB``, ``100000``; binary units KiB/MiB/GiB/TiB, decimal K/KB/M/MB/G/GB)."""
    v = value.strip().lower().replace(" ", "")
    if v in ("", "all"):
        return None
    num = v.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = v[len(num):]
    try:
        n = float(num)
    except ValueError:
        n = -1.0
    if unit not in _UNITS or not n >= 0 or n == float("inf"):
        raise ValueError(f"{name}={value!r}: expected 'all' or a size such as 512MiB, 2GiB, "
                         "1.5GB or a number of bytes")
    return int(n * _UNITS[unit])


@functools.lru_cache(maxsize=None)
def _parse(value: str, tau: str, seed: str, stats_dir: str, gate: str = "",
           native: str = "", gate_copy: str = "", instance: str = "",
           dither_key: str = "") -> Settings:
    name = "default" if value.lower() in ON_WORDS else value
    if name not in PRESETS:  # the enable switch also takes on / off
        raise ValueError(f"{ENV_ENABLE}={value!r}: expected off, on or one of {sorted(PRESETS)}")
    quant, cert = engine_preset(name, tau=tau, seed=seed, env_name=ENV_ENABLE)
    mode = gate_mode(gate, env_name=ENV_GATE)
    return Settings(preset=name, quant=quant, cert=cert, stats_dir=stats_dir or None,
                    repair=RepairPolicy(mode=mode, block_tokens=GATE_BLOCK_TOKENS),
                    native=_native_mode(native), gate_copy_bytes=parse_size(gate_copy),
                    instance=instance or None,
                    dither_key=dither_key.strip().lower() or "slot")


def load() -> Settings:
    """The settings of this process; ``ValueError`` (naming the variable) if malformed."""
    if not enabled():
        raise RuntimeError(f"witcert vLLM plugin is off (set {ENV_ENABLE}=on)")
    env = os.environ.get
    native = env(ENV_NATIVE, "")
    if native.strip():
        _warn_deprecated_native(native)
    else:  # unset: the library-wide WITCERT_BACKEND decides
        from witcert.settings import backend_choice

        native = {"native": "on", "ref": "off"}.get(backend_choice(), "auto")
    return _parse(env(ENV_ENABLE, "").strip(), env(ENV_TAU, ""), env(ENV_SEED, ""),
                  env(ENV_STATS_DIR, ""), env(ENV_GATE, ""), native,
                  env(ENV_GATE_COPY, ""), env(ENV_INSTANCE, ""), env(ENV_DITHER_KEY, ""))


@functools.lru_cache(maxsize=None)
def _warn_deprecated_native(value: str) -> None:
    """One log line per process and value: the plugin's own backend switch is deprecated."""
    import logging
    repl = {"on": "native", "off": "ref"}.get(_native_mode(value), "auto")
    logging.getLogger("witcert.vllm").warning(
        "witcert: %s=%s is deprecated; set WITCERT_BACKEND=%s (the one backend switch of the "
        "library and both engine plugins)", ENV_NATIVE, value.strip(), repl)


def instance_env() -> str:
    """The raw ``WITCERT_VLLM_INSTANCE`` of this process ('' when unset)."""
    return os.environ.get(ENV_INSTANCE, "")


def stats_dir_env() -> str:
    """The raw ``WITCERT_VLLM_STATS_DIR`` of this process ('' when unset)."""
    return os.environ.get(ENV_STATS_DIR, "")


def publish(*, stats_dir: str, instance: str) -> None:
    """Set the stats directory and instance for this process and its future children
    (engine core, workers inherit the environment)."""
    os.environ[ENV_STATS_DIR] = stats_dir
    os.environ[ENV_INSTANCE] = instance
