"""Shared helpers of the vLLM integration tests (imported by name: tests/vllm is on sys.path).

The engine tests need the separate vLLM venv (``bash scripts/setup_vllm_env.sh``) and run
``python -m pytest tests/vllm -m vllm`` with that venv's python; from any other env they
skip with a reason. Every engine runs in its own subprocess (the plugin's backend
override is process-global, and vLLM needs a main guard).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HAS_VLLM = importlib.util.find_spec("vllm") is not None
NEEDS_VLLM = pytest.mark.skipif(
    not HAS_VLLM, reason="vllm is not installed in this env; run with the venv made by "
                         "scripts/setup_vllm_env.sh")
ENGINE_TIMEOUT_S = 900


def engine_env(tmp_path: Path, *, witcert: bool, extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WITCERT_VLLM")}
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if witcert:
        env["WITCERT_VLLM"] = "on"
        # a fixed dither seed keeps CI reproducible (near-tie tokens can flip between
        # seeds; the default in production is a fresh secret seed per worker)
        env["WITCERT_VLLM_SEED"] = "20261129"
        env["WITCERT_VLLM_STATS_DIR"] = str(tmp_path / "stats")
    env.update(extra or {})
    return env


def run_offline(tmp_path: Path, name: str, *, witcert: bool, args: list[str] = (),
                extra_env: dict | None = None) -> tuple:
    """Run ``witcert.integrations.vllm.run`` in a subprocess; (returncode, result|None, log).
    extra_env: more variables (e.g. ``WITCERT_VLLM_GATE``) on top of ``engine_env``."""
    out = tmp_path / f"{name}.json"
    env = engine_env(tmp_path, witcert=witcert, extra=extra_env)
    proc = subprocess.run([sys.executable, "-m", "witcert.integrations.vllm.run", "--out",
                           str(out), *args], env=env, capture_output=True, text=True,
                          timeout=ENGINE_TIMEOUT_S)
    log = proc.stdout + proc.stderr
    res = json.loads(out.read_text()) if proc.returncode == 0 and out.exists() else None
    return proc.returncode, res, log
