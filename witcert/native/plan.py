"""ctypes launcher of ``plan.c``: the gate's block plan of one query head in C (the steps of
``witcert.runtime.repair_plan._plan``, which specifies it and serves when the library is not
available; tests/test_repair_native.py checks the two on shared rows)."""

from __future__ import annotations

import functools
from ctypes import c_double, c_int64, c_void_p

import numpy as np
import torch

from witcert import native


@functools.lru_cache(maxsize=None)
def _fn():
    f = native.lib().wc_plan_head  # (n, z, u, zx, ux, cand, tau, bt, slack, blocks, take) -> k
    f.argtypes = [c_int64, c_void_p, c_void_p, c_void_p, c_void_p, c_void_p, c_double, c_int64, c_double,
                  c_void_p, c_void_p]
    f.restype = c_int64
    return f


def plan(z: np.ndarray, u: np.ndarray, zx: np.ndarray, ux: np.ndarray, cand: np.ndarray, *,
         tau: float, block_tokens: int, slack: float) -> tuple[torch.Tensor, list[int]]:
    """(take bool [n], blocks in page-in order) for float64 [n] arrays ``z, u, zx, ux`` and bool
    [n] ``cand`` (contiguous), as ``repair_plan._plan``; ``MemoryError`` if C gets no scratch."""
    n = z.size
    arrs = [np.ascontiguousarray(a, dtype=np.float64) for a in (z, u, zx, ux)]
    c = np.ascontiguousarray(cand, dtype=np.uint8)
    blocks = np.empty(max(1, -(-n // block_tokens)), dtype=np.int64)
    take = np.zeros(n, dtype=np.uint8)
    k = _fn()(n, *(a.ctypes.data for a in arrs), c.ctypes.data, tau, block_tokens, slack,
              blocks.ctypes.data, take.ctypes.data)
    if k < 0:
        raise MemoryError("witcert native plan: no scratch memory")
    return torch.from_numpy(take.view(np.bool_)), blocks[:k].tolist()
