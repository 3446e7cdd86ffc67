"""Floating-point helpers with a stated rounding direction.

Everything stored in a narrow format that must stay an upper bound (scales, witnesses)
goes through ``fp16_round_up``: the smallest fp16 that is >= the exact input value.
"""

from __future__ import annotations

import torch

FP16_MIN_NORMAL = 2.0**-14  # smallest normal fp16; the floor of every dither scale
FP16_MAX = 65504.0


def fp16_round_up(x: torch.Tensor) -> torch.Tensor:
    """Smallest fp16 value >= ``x``, elementwise (round toward +inf into fp16).

    x: any float tensor (fp16, bf16, fp32, fp64), any shape. Returns fp16, same shape.
    ``x > 65504`` gives ``+inf``; ``+-inf`` stay as they are; NaN gives ``+inf``
    (NaN has no upper bound, and every caller uses the result as one: a bound that
    is ``+inf`` reads "no guarantee", a NaN bound would be silently dropped).
    """
    if not x.is_floating_point():
        raise TypeError(f"fp16_round_up: x must be floating point, got {x.dtype}")
    nan = torch.isnan(x)
    # fp16 is a subset of fp32/fp64, so comparisons in x.dtype are exact. A conversion
    # that rounds to nearest (even if done in two steps) lands on one of the two fp16
    # neighbours of x; when it is the lower one we step one ulp up.
    wide = x if x.dtype == torch.float64 else x.to(torch.float32)
    h = wide.to(torch.float16)
    low = h.to(wide.dtype) < wide
    bits = h.view(torch.int16).to(torch.int32) & 0xFFFF
    # positive (incl. +0): next fp16 up has bit pattern +1; negative: magnitude shrinks, -1
    up = torch.where(bits < 0x8000, bits + 1, bits - 1)
    up = torch.where(up >= 0x8000, up - 0x10000, up).to(torch.int16).view(torch.float16)
    out = torch.where(low, up, h)
    return torch.where(nan, torch.full_like(out, float("inf")), out)
