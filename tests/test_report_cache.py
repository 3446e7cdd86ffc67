"""The report's resumable cache: a finished unit is never recomputed, a key change is."""

from __future__ import annotations

import torch

from witcert.report.cache import ResultCache


def test_cache_returns_stored_value_and_skips_the_work(tmp_path):
    calls = []

    def work():
        calls.append(1)
        return {"x": torch.arange(3)}

    c = ResultCache(tmp_path)
    a = c.get_or_compute("s", {"k": 1}, work)
    b = ResultCache(tmp_path).get_or_compute("s", {"k": 1}, work)  # a new process resuming
    assert len(calls) == 1 and torch.equal(a["x"], b["x"])
    ResultCache(tmp_path).get_or_compute("s", {"k": 2}, work)
    assert len(calls) == 2


def test_corrupt_entry_is_recomputed(tmp_path):
    c = ResultCache(tmp_path)
    c.get_or_compute("s", {"k": 1}, lambda: 1)
    c.path("s", {"k": 1}).write_bytes(b"not a torch file")
    c2 = ResultCache(tmp_path)
    assert c2.get_or_compute("s", {"k": 1}, lambda: 2) == 2 and c2.misses == 1


def test_disabled_cache_always_recomputes(tmp_path):
    c = ResultCache(tmp_path, enabled=False)
    assert c.get_or_compute("s", {"k": 1}, lambda: 1) == 1
    assert c.get_or_compute("s", {"k": 1}, lambda: 2) == 2
