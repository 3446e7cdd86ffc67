"""Logits and whole radii of one batch of (query head, token) pairs, as the reference path
computes them (docs/MATH.md §1-2 and §7, docs/PROOFS.md section 5).

The reference's logit is ``l = fl32(fl64(sm * fl64(q . k^)))``: the dot in float64, rounded
once to fp32 (the kernels' logit format). Its radius is the compression radius
(``u_det``, ``u_prob`` or their min) plus ``witcert.ref.arith.logit_slack`` with the
reference's ``LogitModel`` and the exact float64 ``sum_i |q_i k^_i|``. Flagged tokens and
logits that overflow fp32 get ``u = +inf``.

Shapes: q f32 [..., D]; k [..., N, D]; per-token fields [..., N, NG]; masks [..., N].
"""

from __future__ import annotations

import torch

from witcert.config import CertConfig
from witcert.ref.arith import LogitModel, f32_round_up, logit_slack, logits_f64_to_f32, reference_model
from witcert.ref.cert import combine_radius, radius_det, radius_prob

INF = float("inf")


def logits_f32(q: torch.Tensor, k: torch.Tensor, *, sm_scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(l f32 [..., N], overflow bool [..., N], dot_bound f64 [..., N])``: the fp32 logits of
    the float64 dot, which of them overflowed fp32, and ``sum_i |q_i k_i|`` in float64.
    q: float [..., D] (finite); k: float [..., N, D] (finite)."""
    q64, k64 = q.to(torch.float64), k.to(torch.float64)
    y = sm_scale * torch.einsum("...d,...nd->...n", q64, k64)
    l, ovf = logits_f64_to_f32(y)
    bound = torch.einsum("...d,...nd->...n", q64.abs(), k64.abs())
    return l, ovf, bound


def logits_and_radii(q: torch.Tensor, khat: torch.Tensor, *, sm_scale: float, cert: CertConfig,
                     wit: torch.Tensor, scales: torch.Tensor | None, flagged: torch.Tensor,
                     group_size: int, bits: int | None, n_tokens, delta_loc,
                     bypass: torch.Tensor | None = None, has_prob: bool,
                     model: LogitModel | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The reference's logits ``l`` (f32 [..., N]) and whole radii ``u`` (f32 [..., N], rounded
    up; None when the certificate is disabled).

    q: f32 [..., D], non-finite entries already zeroed. khat: f32 [..., N, D], flagged rows
    already zeroed (a flagged key reads as 0). wit, scales: the stored K witnesses / scales
    [..., N, D/G] (scales None for det). flagged: bool [..., N], K or V flagged at write.
    bypass: bool broadcastable to q, exact channels (excluded from the radii's q norms).
    bits: dither bits (prob / min only). n_tokens, delta_loc: the union bound of §2b.
    """
    model = model or reference_model(q.shape[-1])
    l, ovf, bound = logits_f32(q, khat, sm_scale=sm_scale)
    if not cert.enabled:
        return l, None
    u_det = radius_det(q.to(torch.float64), wit, sm_scale=sm_scale, group_size=group_size, bypass=bypass)
    u_prob = None
    if cert.radius != "det":
        if not has_prob:
            raise ValueError(f"cert.radius={cert.radius!r} needs a dither method (subtractive dither)")
        u_prob = radius_prob(q.to(torch.float64), scales, sm_scale=sm_scale, group_size=group_size,
                             bits=bits, n_tokens=n_tokens, delta_loc=delta_loc, bypass=bypass)
    u = combine_radius(u_det, u_prob, cert.radius) + logit_slack(l, bound, sm_scale=sm_scale, model=model)
    # a flagged key is read as 0, so no finite radius covers its logit (u_prob is built from
    # the finite scale alone and would otherwise survive radius="min"); an fp32 overflow
    # means the logit used is not the computed one
    u = torch.where(flagged | ovf | torch.isnan(u), INF, u)
    return l, f32_round_up(u)


def exact_logits_and_radii(q: torch.Tensor, k: torch.Tensor, wk: torch.Tensor, *, sm_scale: float,
                           model: LogitModel | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Entries restored from the exact copy: ``(l f32 [..., N], u f32 [..., N])`` with the
    deterministic radius ``sm ||q||_2 wk`` (wk [..., N] bounds ||k_exact - k_model||, 0 when
    the copy is exact) plus the arithmetic slack. q f32 [..., D]; k float [..., N, D]."""
    model = model or reference_model(q.shape[-1])
    l, ovf, bound = logits_f32(q, k.to(torch.float32), sm_scale=sm_scale)
    u = radius_det(q.to(torch.float64), wk.to(torch.float64)[..., None], sm_scale=sm_scale,
                   group_size=q.shape[-1])
    u = u + logit_slack(l, bound, sm_scale=sm_scale, model=model)
    return l, f32_round_up(torch.where(ovf | torch.isnan(u), INF, u))
