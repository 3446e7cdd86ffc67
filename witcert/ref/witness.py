"""Deterministic error witnesses (docs/MATH.md §2a, DESIGN step 7).

A witness is an upper bound on the l2 norm of the compression error of one channel
group (band) of one token-head, stored in fp16 rounded up, so that
``|q . (k^ - k)| <= sum_g ||q_g|| w_g`` holds for every query.
"""

from __future__ import annotations

import torch

from witcert.ref.fp import fp16_round_up

# float64 sum of <= 128 squares, a sqrt and one multiply have relative error < 2^-45;
# this factor covers it with room to spare before the fp16 round-up.
WITNESS_SLACK = 1.0 + 2.0**-40


def group_witness(x: torch.Tensor, xhat: torch.Tensor, *, group_size: int,
                  bypass: torch.Tensor | None = None) -> torch.Tensor:
    """Per-group l2 norm of ``xhat - x``, rounded up to fp16.

    x: exact values, float [T, H, D] (fp16, bf16, fp32 or fp64).
    xhat: reconstructed values, float [T, H, D].
    group_size: ``G``, must divide D.
    bypass: bool [H, D], channels kept exact (they contribute 0), or None.
    Returns fp16 [T, H, D // G] with ``w >= ||xhat_g - x_g||_2`` computed exactly. A
    token-head row with any non-finite value in ``x`` or ``xhat`` (bypassed channels
    included) gets ``+inf`` in every group.
    """
    if x.shape != xhat.shape or x.dim() != 3:
        raise ValueError(f"x {tuple(x.shape)} and xhat {tuple(xhat.shape)} must both be [T, H, D]")
    T, H, D = x.shape
    if group_size <= 0 or D % group_size != 0:
        raise ValueError(f"group_size {group_size} must divide head_dim {D}")
    x64 = x.to(torch.float64)
    xh64 = xhat.to(torch.float64)
    bad = ~(torch.isfinite(x64).all(dim=-1) & torch.isfinite(xh64).all(dim=-1))  # [T, H]
    err = xh64 - x64
    if bypass is not None:
        if bypass.shape != (H, D) or bypass.dtype != torch.bool:
            raise ValueError(f"bypass must be bool [H={H}, D={D}], got {bypass.dtype} {tuple(bypass.shape)}")
        err = torch.where(bypass.to(err.device), torch.zeros((), dtype=err.dtype, device=err.device), err)
    err = torch.where(bad[..., None], torch.zeros((), dtype=err.dtype, device=err.device), err)
    norm = (err * err).view(T, H, D // group_size, group_size).sum(dim=-1).sqrt() * WITNESS_SLACK
    norm = torch.where(bad[..., None], torch.full_like(norm, float("inf")), norm)
    return fp16_round_up(norm)
