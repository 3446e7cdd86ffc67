"""tests/sglang: witcert's SGLang plugin against SGLang's own components (marked ``sglang``).

They run only in the separate SGLang environment (``scripts/setup_sglang_env.sh``); in any
other environment every test here is skipped with the reason. Inside it, this conftest
sets what SGLang and Triton need on a CPU-only machine, before either is imported:
``SGLANG_USE_CPU_ENGINE=1``, ``TRITON_INTERPRET=1`` (Triton kernels on CPU tensors) and
``WITCERT_BACKEND=triton`` (witcert's write/decode/extend kernels, not the reference), and
puts the import-only stand-ins of ``stubs/`` on ``sys.path`` (see ``stubs/_stub.py``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
STUBS = HERE / "stubs"
HAVE_SGLANG = importlib.util.find_spec("sglang") is not None
SKIP_REASON = ("SGLang is not installed in this environment: run "
               "`bash scripts/setup_sglang_env.sh` and use that venv's python")

if HAVE_SGLANG:
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("WITCERT_BACKEND", "triton")
    for p in (str(STUBS), str(HERE)):
        if p not in sys.path:
            sys.path.insert(0, p)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.sglang)
            if not HAVE_SGLANG:
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))

