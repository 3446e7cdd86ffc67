"""benchmarks/sass_philox.py: the SASS count behind BENCHMARKS.md 4t (Philox's cost per call in the
CUDA kernels, counted with nvcc on any machine). Each Philox round must compile to two wide integer
multiplies (both halves of a product from one IMAD.WIDE) and two LOP3, with the key schedule shared
by the calls; 4t's floor per (token, KV head) rests on that. Skipped without nvcc or cuobjdump."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import sass_philox  # noqa: E402


def _tools_or_skip():
    for name in ("nvcc", "cuobjdump"):
        try:
            sass_philox.find_tool(name)
        except SystemExit:
            pytest.skip(f"{name} not found")


def test_a_philox_round_is_two_wide_multiplies_and_two_lop3():
    _tools_or_skip()
    base = sass_philox.marginal(0)[1]
    counts = {}
    for rounds in (10, 7):
        ops, total = sass_philox.marginal(rounds)
        wide = sum(v for k, v in ops.items() if k.startswith("IMAD.WIDE"))
        lop3 = sum(v for k, v in ops.items() if k.startswith("LOP3"))
        counts[rounds] = total - base
        # two multiplies and two three-input xors per round; a few of the first round's fold into
        # the counter set-up, so at least 1.5 and at most 2 of each per round
        assert 1.5 * rounds <= wide <= 2 * rounds + 0.5, f"{rounds} rounds: {wide} IMAD.WIDE ({ops})"
        assert 1.5 * rounds <= lop3 <= 2 * rounds + 1.5, f"{rounds} rounds: {lop3} LOP3 ({ops})"
        # the key schedule (two adds per round) is shared by the calls: well under 6 per round
        assert counts[rounds] <= 4.5 * rounds, f"{rounds} rounds: {counts[rounds]} per call"
    # 4t's figures: 39.4 at 10 rounds, 27.4 at 7 (nvcc 13.0); three rounds cost about 12
    assert 10 <= counts[10] - counts[7] <= 14, f"per call: {counts}"


def test_the_tool_finds_no_tool_with_a_one_line_exit(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.setitem(sys.modules, "triton", None)  # no bundled cuobjdump either
    with pytest.raises(SystemExit, match="not found"):
        sass_philox.find_tool("cuobjdump")
