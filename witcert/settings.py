"""The one reader of the core library's environment variables (read at call time, never at
import). The engine plugins read their own in ``witcert/integrations/{vllm,sglang}/settings.py``.

- ``WITCERT_BACKEND``: ``auto`` (default), ``ref``, ``triton`` or ``native``: which
  implementation ``witcert.runtime.dispatch`` dispatches to (``backend_choice``).
- ``WITCERT_CACHE``: root of witcert's on-disk cache (converted models, built CUDA and C
  libraries); default ``${XDG_CACHE_HOME:-~/.cache}/witcert`` (``cache_root``).
- ``WITCERT_NATIVE_CACHE``: where the C library is built (default ``cache_root() / "native"``).
- ``WITCERT_NATIVE_EXTEND_ARITH``: ``f32`` (default) or ``f64``: the arithmetic of the native
  C extend's dots and value pass (``native_extend_arith``; docs/PROOFS.md 5.3).
- ``WITCERT_NATIVE_EXTEND_BF16``: ``on`` (default) or ``off``: whether the native C extend's
  fp32 arithmetic may form the exact new tokens' dots as bf16 pairs (AVX512-BF16) where every
  operand is a bf16 number, and then their value pass as bf16 weights times bf16 values
  (``native_extend_bf16``; docs/PROOFS.md 5.3).
- ``WITCERT_EXTEND_WORKSPACE_MIB``: the most device memory (MiB, an integer >= 1; default 256)
  the CUDA extend's staged prefix tiles take in a call; a longer prefix runs in chunks, bitwise
  the same results (``extend_workspace_mib``; ``ExtendPlan.workspace_mib``; docs/PROOFS.md 5.4).

``engine_preset`` and ``gate_mode`` are the parsing rules both engine plugins share (their
own variables, read by their own ``settings.py``).
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_BACKEND = "WITCERT_BACKEND"
ENV_CACHE = "WITCERT_CACHE"
ENV_NATIVE_CACHE = "WITCERT_NATIVE_CACHE"
ENV_NATIVE_EXTEND_ARITH = "WITCERT_NATIVE_EXTEND_ARITH"
ENV_EXTEND_WORKSPACE_MIB = "WITCERT_EXTEND_WORKSPACE_MIB"
ENV_NATIVE_EXTEND_BF16 = "WITCERT_NATIVE_EXTEND_BF16"
EXTEND_WORKSPACE_MIB = 256
NATIVE_EXTEND_ARITHS = ("f32", "f64")
BACKENDS = ("auto", "ref", "triton", "native")


def backend_choice() -> str:
    """``WITCERT_BACKEND``, lower-cased (unset or empty: ``auto``); ``ValueError`` naming the
    variable for anything else than ``BACKENDS``."""
    choice = os.environ.get(ENV_BACKEND, "auto").strip().lower() or "auto"
    if choice not in BACKENDS:
        raise ValueError(f"{ENV_BACKEND}={choice!r} must be one of {BACKENDS}")
    return choice


def cache_root() -> Path:
    """``$WITCERT_CACHE``, else ``$XDG_CACHE_HOME/witcert``, else ``~/.cache/witcert``."""
    env = os.environ.get(ENV_CACHE)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "witcert"


def native_cache_dir() -> Path:
    """Where the C library is built: ``$WITCERT_NATIVE_CACHE``, else ``cache_root()/native``."""
    env = os.environ.get(ENV_NATIVE_CACHE)
    return Path(env).expanduser() if env else cache_root() / "native"


def native_extend_arith() -> str:
    """``WITCERT_NATIVE_EXTEND_ARITH``, lower-cased (unset or empty: ``f32``): the native
    extend's fp32 dots and value pass (``witcert.ref.arith.native_f32_model``) or float64
    throughout (``native_model``); ``ValueError`` naming the variable for anything else."""
    choice = os.environ.get(ENV_NATIVE_EXTEND_ARITH, "f32").strip().lower() or "f32"
    if choice not in NATIVE_EXTEND_ARITHS:
        raise ValueError(f"{ENV_NATIVE_EXTEND_ARITH}={choice!r} must be one of "
                         f"{NATIVE_EXTEND_ARITHS}")
    return choice


def extend_workspace_mib() -> int:
    """``WITCERT_EXTEND_WORKSPACE_MIB`` (unset or empty: ``EXTEND_WORKSPACE_MIB``): the CUDA
    extend's workspace cap in MiB when the caller passes no ``ExtendPlan``; ``ValueError``
    naming the variable for anything but an integer >= 1."""
    raw = os.environ.get(ENV_EXTEND_WORKSPACE_MIB, "").strip()
    if not raw:
        return EXTEND_WORKSPACE_MIB
    try:
        mib = int(raw)
    except ValueError:
        mib = 0
    if mib < 1:
        raise ValueError(f"{ENV_EXTEND_WORKSPACE_MIB}={raw!r} must be an integer number of MiB >= 1")
    return mib


OFF_WORDS = ("", "0", "off", "false", "no")
ON_WORDS = ("1", "on", "true", "yes")


def engine_preset(name: str, *, tau: str, seed: str, env_name: str):
    """(QuantConfig, CertConfig) of preset ``name`` for an engine plugin: the anytime risk
    allocation (requests have no known horizon), ``tau`` / ``seed`` overrides when non-empty
    (seed in any base: ``0x..``). ``ValueError`` naming ``env_name`` for an unknown preset."""
    from witcert.config import PRESETS

    if name not in PRESETS:
        raise ValueError(f"{env_name}={name!r}: expected one of {sorted(PRESETS)}")
    quant, cert = PRESETS[name]
    cert = cert.replace(allocation="anytime")
    if tau:
        cert = cert.replace(tau=float(tau))
    if seed:
        quant = quant.replace(seed=int(seed, 0))
    return quant, cert


def gate_mode(value: str, *, env_name: str) -> str:
    """An engine's gate switch: ``off`` (also 0/false/no/empty), ``block`` (also 1/on/true/
    yes), or ``head``; ``ValueError`` naming ``env_name`` otherwise."""
    g = value.strip().lower()
    if g in OFF_WORDS:
        return "off"
    if g in ON_WORDS or g == "block":
        return "block"
    if g == "head":
        return "head"
    raise ValueError(f"{env_name}={value!r}: expected off, on, block or head")


def native_extend_bf16() -> bool:
    """``WITCERT_NATIVE_EXTEND_BF16``, lower-cased (unset or empty: ``on``): whether the native
    extend may take its bf16-pair dots (``witcert.ref.arith.native_bf16_model``) and bf16 value
    pass (docs/PROOFS.md 5.3); ``ValueError`` naming the variable for anything else than ``on`` /
    ``off``."""
    choice = os.environ.get(ENV_NATIVE_EXTEND_BF16, "on").strip().lower() or "on"
    if choice not in ("on", "off"):
        raise ValueError(f"{ENV_NATIVE_EXTEND_BF16}={choice!r} must be 'on' or 'off'")
    return choice == "on"
