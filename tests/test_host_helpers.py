"""The launchers' host-side helpers (witcert.kernels.plan ``cdiv`` / ``next_pow2``, which stand in
for triton's ConstexprFunctions on the host; the fp32 roundings of ``e_soft`` and ``delta``): the
same values as the functions they replace, and each rounding in its stated direction as an fp32
number (a float64 just past an fp32 value would round back through ctypes' c_float)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():  # before triton's first import, as the kernels' test files do
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402

from witcert.kernels.extend import _e_soft  # noqa: E402
from witcert.kernels.launch import _f32_down  # noqa: E402
from witcert.kernels.plan import cdiv, next_pow2  # noqa: E402


def test_cdiv_and_next_pow2_match_triton():
    for a in [0, 1, 2, 15, 16, 17, 1000, 4096, 32769]:
        for b in [1, 2, 3, 16, 32, 64]:
            assert cdiv(a, b) == triton.cdiv(a, b)
    for n in [0, 1, 2, 3, 4, 5, 7, 8, 9, 28, 32, 33, 1000]:
        assert next_pow2(n) == triton.next_power_of_2(n)


@pytest.mark.parametrize("tiles", [0, 1, 3, 40, 1024, 65537])
def test_e_soft_is_the_least_fp32_at_least_its_value(tiles):
    x = 1.0616e-05 + (tiles + 2) * 4.76837158203125e-07
    e = _e_soft(tiles)
    assert np.float32(e) == e and e >= x  # an fp32 number: ctypes' c_float keeps it
    assert float(np.nextafter(np.float32(e), np.float32(0))) < x


@pytest.mark.parametrize("x", [1e-6, 1e-9, 0.5, 1.0 / 3.0, 2.0**-30 * 1.1])
def test_f32_down_is_the_largest_fp32_at_most_its_value(x):
    f = _f32_down(x)
    assert np.float32(f) == f and f <= x
    assert float(np.nextafter(np.float32(f), np.float32(np.inf))) > x
