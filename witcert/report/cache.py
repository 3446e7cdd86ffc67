"""Resumable result cache: one file per finished unit of work, keyed by its parameters.

A unit (one variant on one domain, one needle sample, ...) is stored as soon as it is
done, under ``DIR/cache/<section>/<sha1 of the canonical JSON of its key>.pt``, written to a
temporary name and renamed, so an interrupted run leaves no half-written entry and a
rerun with the same command skips every finished unit.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import torch


class ResultCache:
    """``get_or_compute(section, key, fn)``: load the stored result of ``key`` or run ``fn()``.

    root: cache folder; enabled False: always recompute (nothing read or written).
    ``hits``/``misses`` count what happened (reported in report.json).
    """

    def __init__(self, root: str | os.PathLike, *, enabled: bool = True):
        self.root, self.enabled = Path(root), enabled
        self.hits = self.misses = 0

    @staticmethod
    def digest(key: dict) -> str:
        return hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]

    def path(self, section: str, key: dict) -> Path:
        return self.root / section / f"{self.digest(key)}.pt"

    def get_or_compute(self, section: str, key: dict, fn: Callable[[], object]):
        p = self.path(section, key)
        if self.enabled and p.is_file():
            try:
                obj = torch.load(p, weights_only=False)
            except Exception:  # a corrupt entry is recomputed, never trusted
                obj = None
            if isinstance(obj, dict) and obj.get("_key") == key:
                self.hits += 1
                return obj["value"]
        self.misses += 1
        value = fn()
        if self.enabled:
            p.parent.mkdir(parents=True, exist_ok=True)
            tmp = p.with_suffix(f".tmp{os.getpid()}")
            torch.save({"_key": key, "value": value}, tmp)
            os.replace(tmp, p)
        return value
