"""Validation of the scalars every path receives at its public boundary.

One place, shared by the reference, the Triton launchers, the native C path, the backend
dispatch and the engine plugins, so a bad value fails the same way everywhere: a
``ValueError`` naming the argument and the fix, never a negative or NaN certificate.
"""

from __future__ import annotations

import math

import torch


# The smallest scale accepted. The tensor-core kernels form each query row's logit factor in fp32
# as (2^-(b+8+...) sm) 2^e, and below about 2^(b-118) the first product is subnormal: it keeps a
# few bits, which the kernels' rounding model does not cover (an adversarial audit found
# certificates of 5e-4 against an exact TV of 1e-2 at sm = 6e-35). 2^-64 keeps that product
# normal for every dither width (b <= 24) with a margin; real scales are head_dim ** -0.5 or so.
SM_SCALE_MIN = 2.0 ** -64


def check_sm_scale(sm_scale) -> float:
    """``sm_scale`` must be a finite number >= 2^-64 (a negative scale flips the logits the radii
    bound; inf / NaN make every logit meaningless; below ``SM_SCALE_MIN`` the kernels' logit
    factor would leave fp32's normal range). Returns it as a float."""
    try:
        sm = float(sm_scale)
    except (TypeError, ValueError):
        raise ValueError(f"sm_scale: {sm_scale!r} must be a finite number >= 2^-64") from None
    if not (math.isfinite(sm) and sm >= SM_SCALE_MIN):
        raise ValueError(f"sm_scale: {sm_scale!r} must be a finite number >= 2^-64 "
                         "(the softmax scale, usually head_dim ** -0.5)")
    return sm


ATTENTION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_attention_dtypes(**tensors) -> None:
    """Queries, exact new-token keys / values and the rows written to the pool or to the exact
    copy must be fp32, fp16 or bf16: every path computes in fp32 (or float64 from fp32 values),
    so a float64 input would be rounded to fp32 outside the certificate, which bounds the
    distance to the softmax of the inputs as given (an exact new token's radius is only the
    arithmetic's; a written row's witness would bound the error of its fp32 rounding, or, for
    the baselines' float64 arithmetic, underflow to 0). One-line ``TypeError`` naming the
    argument."""
    for name, x in tensors.items():
        if x is not None and x.dtype not in ATTENTION_DTYPES:
            raise TypeError(f"{name} must be fp32, fp16 or bf16, got {x.dtype} (a float64 value would be "
                            "rounded to fp32 outside the certificate: convert it first)")


def check_delta_loc(delta_loc, *, batch: int | None = None) -> None:
    """``delta_loc`` (a float, or a tensor [] or [B]) must lie in the open interval (0, 1).

    Tensors on a GPU are checked only when they live on the CPU: reading a CUDA tensor
    here would synchronise with the host (the kernels clamp nothing and would report a
    NaN-free but meaningless radius; callers on the GPU build delta_loc on the host).
    """
    if isinstance(delta_loc, torch.Tensor):
        if batch is not None and tuple(delta_loc.shape) not in ((), (batch,), (1,)):
            raise ValueError(f"delta_loc must be a float or [B={batch}], got {tuple(delta_loc.shape)}")
        if delta_loc.device.type != "cpu":
            return
        d = delta_loc.to(torch.float64)
        if d.numel() and not bool(((d > 0.0) & (d < 1.0)).all()):
            raise ValueError("delta_loc: every value must lie in (0, 1), "
                             f"got range [{float(d.min())}, {float(d.max())}]")
        return
    try:
        d = float(delta_loc)
    except (TypeError, ValueError):
        raise ValueError(f"delta_loc: {delta_loc!r} must be a number in (0, 1)") from None
    if not 0.0 < d < 1.0:
        raise ValueError(f"delta_loc: {delta_loc!r} must lie in (0, 1)")
