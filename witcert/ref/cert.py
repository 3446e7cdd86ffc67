"""Radii, the certificate ``A - 1``, the risk budget and the value-side bound (docs/MATH.md §1, §2, §4, §5).

All functions are pure torch, work in float32 or float64 (the dtype of the inputs) and
never return NaN for finite-or-infinite inputs: a token whose radius is ``+inf``
(flagged at write time) makes the certificate ``+inf`` ("no guarantee"), and masked
tokens are removed with ``where``, never multiplied by zero.
"""

from __future__ import annotations

import math

import torch

from witcert.config import ALLOCATIONS, RADII
from witcert.ref.arith import LogitModel, round_up_to, tail_bound
from witcert.ref.validate import check_sm_scale

# DESIGN.md: fp32 rounding of the quantizer adds at most 2^-15 to the dither bias coefficient.
FP_BIAS_SLACK = 2.0**-15
# float64 evaluation of the radius formulas (norms, sums over <= 128 groups, sqrt, log):
# relative error < 2^-44; this factor keeps every radius above its exact value
RADIUS_SLACK = 1.0 + 2.0**-40
# what certificate() itself computes: float64 softmax and sums (tail_gap, sum_rel only)
_CERT_MODEL = LogitModel(name="certificate", rel_l=0.0, rel_s=0.0, abs_err=0.0, softmax=2.0**-40,
                         tail_gap=700.0, sum_rel=2.0**-20)


def _masked_q(q: torch.Tensor, bypass: torch.Tensor | None) -> torch.Tensor:
    if bypass is None:
        return q
    if bypass.dtype != torch.bool:
        raise ValueError(f"bypass must be a bool tensor, got {bypass.dtype}")
    return torch.where(bypass.to(q.device), torch.zeros((), dtype=q.dtype, device=q.device), q)


def _group_norms(q: torch.Tensor, group_size: int, bypass: torch.Tensor | None, p: int) -> torch.Tensor:
    """q [..., D] -> per-group l_p norm [..., 1, D/G] (bypassed channels removed)."""
    D = q.shape[-1]
    if group_size <= 0 or D % group_size != 0:
        raise ValueError(f"group_size {group_size} must divide head_dim {D}")
    qg = _masked_q(q, bypass).reshape(*q.shape[:-1], D // group_size, group_size)
    return torch.linalg.vector_norm(qg, ord=p, dim=-1).unsqueeze(-2)


def _flag_inf(u: torch.Tensor, per_group: torch.Tensor) -> torch.Tensor:
    """Tokens with any non-finite per-group value get u = +inf (never 0 * inf = NaN)."""
    bad = ~torch.isfinite(per_group).all(dim=-1)
    return torch.where(bad, torch.full_like(u, float("inf")), u)


def _to_q_dtype_up(u64: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float64 radii -> the caller's dtype, never rounded down (fp32: smallest f32 >= u)."""
    return round_up_to(u64, dtype)


def radius_det(q: torch.Tensor, wit: torch.Tensor, *, sm_scale: float, group_size: int,
               bypass: torch.Tensor | None = None) -> torch.Tensor:
    """Deterministic radius ``u_det = sm * sum_g ||q_g||_2 w_g`` (docs/MATH.md §2a).

    q: float [..., D] (non-finite entries must already be zeroed by the caller).
    wit: witnesses [..., N, D/G] (fp16 or float; ``+inf`` for a flagged token).
    bypass: bool [D] or [..., D] broadcastable to q; exact channels, excluded from norms.
    Returns [..., N] in q's dtype, computed in float64 and rounded up (so no float
    rounding, underflow of q^2 included, can make the radius smaller than the exact value).
    """
    check_sm_scale(sm_scale)
    q64 = q.to(torch.float64)
    qn = _group_norms(q64, group_size, bypass, 2)
    w = wit.to(torch.float64)
    if w.shape[-1] != qn.shape[-1]:
        raise ValueError(f"wit has {w.shape[-1]} groups, q has {qn.shape[-1]}")
    wf = torch.where(torch.isfinite(w), w, torch.zeros((), dtype=w.dtype, device=w.device))
    u = sm_scale * (qn * wf).sum(dim=-1) * RADIUS_SLACK
    return _to_q_dtype_up(_flag_inf(u, w), q.dtype)


def prob_log_factor(*, n_tokens, delta_loc) -> torch.Tensor | float:
    """``sqrt(2 ln(2 N / delta_loc))``, the sub-Gaussian union-bound multiplier."""
    if isinstance(n_tokens, torch.Tensor) or isinstance(delta_loc, torch.Tensor):
        n = torch.as_tensor(n_tokens, dtype=torch.float64)
        d = torch.as_tensor(delta_loc, dtype=torch.float64)
        if bool((d <= 0).any()) or bool((d >= 1).any()) or bool((n < 1).any()):
            raise ValueError("delta_loc must be in (0, 1) and n_tokens >= 1")
        return torch.sqrt(2.0 * torch.log(2.0 * n / d))
    if not (0.0 < delta_loc < 1.0) or n_tokens < 1:
        raise ValueError(f"delta_loc {delta_loc} must be in (0, 1), n_tokens {n_tokens} >= 1")
    return math.sqrt(2.0 * math.log(2.0 * n_tokens / delta_loc))


def radius_prob(q: torch.Tensor, scales: torch.Tensor, *, sm_scale: float, group_size: int,
                bits: int, n_tokens, delta_loc, bypass: torch.Tensor | None = None) -> torch.Tensor:
    """Probabilistic radius of a b-bit subtractive dither (docs/MATH.md §2b, DESIGN radii).

    ``sigma^2 = sm^2/12 * sum_g ||q_g||_2^2 s_g^2``,
    ``bias = (2^-(b+1) + 2^-15) * sm * sum_g ||q_g||_1 s_g``,
    ``u = sigma * sqrt(2 ln(2N / delta_loc)) + bias``.
    q: float [..., D]; scales: [..., N, D/G] (``+inf`` for a flagged token).
    n_tokens, delta_loc: python numbers or tensors broadcastable to [..., 1].
    Returns [..., N] in q's dtype, computed in float64 and rounded up.
    """
    if bits not in (8, 16, 24):
        raise ValueError(f"bits {bits} must be 8, 16 or 24")
    check_sm_scale(sm_scale)
    q64 = q.to(torch.float64)
    q2 = _group_norms(q64, group_size, bypass, 2)
    q1 = _group_norms(q64, group_size, bypass, 1)
    s = scales.to(torch.float64)
    if s.shape[-1] != q2.shape[-1]:
        raise ValueError(f"scales has {s.shape[-1]} groups, q has {q2.shape[-1]}")
    sf = torch.where(torch.isfinite(s), s, torch.zeros((), dtype=s.dtype, device=s.device))
    sigma = sm_scale * torch.sqrt(((q2 * sf) ** 2).sum(dim=-1) / 12.0)
    bias = (2.0 ** -(bits + 1) + FP_BIAS_SLACK) * sm_scale * (q1 * sf).sum(dim=-1)
    lf = prob_log_factor(n_tokens=n_tokens, delta_loc=delta_loc)
    if isinstance(lf, torch.Tensor):
        lf = lf.to(device=q.device, dtype=torch.float64)
    return _to_q_dtype_up(_flag_inf((sigma * lf + bias) * RADIUS_SLACK, s), q.dtype)


def combine_radius(u_det: torch.Tensor, u_prob: torch.Tensor | None, mode: str) -> torch.Tensor:
    """Reported radius per ``CertConfig.radius``: det, prob or their elementwise min."""
    if mode not in RADII:
        raise ValueError(f"mode {mode!r} not in {RADII}")
    if mode == "det":
        return u_det
    if u_prob is None:
        raise ValueError(f"radius mode {mode!r} needs a probabilistic radius (dither methods only)")
    return u_prob if mode == "prob" else torch.minimum(u_det, u_prob)


def excess_terms(shifted: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``exp(z^ - m + u) * (1 - exp(-u)) = exp(z^ - m) * expm1(u)`` written so that it neither
    underflows (large u on a small weight) nor cancels (tiny u): accurate to a few ulps.
    ``u = +inf`` gives ``+inf`` whatever the weight (never ``0 * inf`` or ``-inf + inf``);
    masked entries must have ``shifted = -inf`` and u finite (they give 0)."""
    t = torch.exp(shifted + u) * -torch.expm1(-u)
    return torch.where(torch.isposinf(u), torch.full_like(t, float("inf")), t)


def certificate(logits_hat: torch.Tensor, u: torch.Tensor, *,
                mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``A = sum_t p^_t exp(u_t)`` and ``cert = A - 1`` (docs/MATH.md §1) for the distribution
    ``p^ = softmax(logits_hat)`` computed in float64.

    ``cert = sum_t exp(z^_t - m) expm1(u_t) / sum_t exp(z^_t - m)`` accumulated directly
    (never ``A - 1`` by subtraction), in float64, inflated by ``1 + 2^-20`` for the rounding
    of those sums, plus the tail term of tokens whose float64 weight underflows
    (``witcert.ref.arith.tail_bound``); rounded up when returned in float32. ``u`` must be
    the whole radius of the logits given (compression plus the arithmetic of the path that
    computed them, ``witcert.ref.arith.logit_slack``).
    logits_hat, u: float [..., N]; mask: bool [..., N] (True = attended) or None.
    Returns (A, cert), both [...] in logits_hat's dtype; cert >= 0, never NaN. ``+inf``
    when a live token has ``u = inf`` or A overflows; a row with no live token gives A = 1,
    cert = 0 (nothing to certify).
    """
    if logits_hat.shape != u.shape:
        raise ValueError(f"logits_hat {tuple(logits_hat.shape)} and u {tuple(u.shape)} differ")
    z64 = logits_hat.to(torch.float64)
    u64 = u.to(torch.float64)
    u64 = torch.where(torch.isnan(u64), torch.full_like(u64, float("inf")), u64)
    live = torch.isfinite(z64) if mask is None else (mask & torch.isfinite(z64))
    z = torch.where(live, z64, torch.full_like(z64, float("-inf")))
    m = z.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # empty row: any finite shift
    shifted = z - m
    l = torch.exp(shifted).sum(dim=-1)
    ul = torch.where(live, u64, torch.zeros_like(u64))
    ex = torch.where(live, excess_terms(shifted, ul), torch.zeros_like(u64)).sum(dim=-1)
    any_live = live.any(dim=-1)
    tail = tail_bound(live.sum(dim=-1), ul.amax(dim=-1), model=_CERT_MODEL)
    cert = torch.where(any_live, ex / torch.where(any_live, l, torch.ones_like(l))
                       * (1.0 + _CERT_MODEL.sum_rel) + tail, torch.zeros_like(l))
    dt = logits_hat.dtype
    return round_up_to(cert + 1.0, dt), round_up_to(cert, dt)


def delta_local(*, delta: float, num_layers: int, num_q_heads: int, allocation: str,
                horizon: int | None = None, step: int | None = None) -> float:
    """Per-(layer, query head, step) failure budget (docs/MATH.md §4).

    fixed: ``delta / (L * Hq * horizon)``; anytime: ``6 delta / (pi^2 step^2) / (L * Hq)``
    with step = 1, 2, ... Both sum to at most ``delta`` over every layer, head and step.
    """
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta {delta} must be in (0, 1)")
    if num_layers < 1 or num_q_heads < 1:
        raise ValueError("num_layers and num_q_heads must be >= 1")
    if allocation not in ALLOCATIONS:
        raise ValueError(f"allocation {allocation!r} not in {ALLOCATIONS}")
    lh = num_layers * num_q_heads
    if allocation == "fixed":
        if horizon is None or horizon < 1:
            raise ValueError("horizon must be >= 1 for the fixed allocation")
        if step is not None and not 1 <= step <= horizon:
            raise ValueError(f"step {step} outside the fixed horizon 1..{horizon}")
        return delta / (lh * horizon)
    if step is None or step < 1:
        raise ValueError("step must be >= 1 for the anytime allocation")
    return 6.0 * delta / (math.pi ** 2 * step * step) / lh


def block_contributions(logits_hat: torch.Tensor, u: torch.Tensor, *, block_tokens: int) -> torch.Tensor:
    """``sum_{t in block j} p^_t expm1(u_t)``: how much making block j exact lowers A.

    logits_hat, u: float [..., N]. Returns [..., ceil(N / block_tokens)]; a block holding a
    live token with ``u = inf`` contributes ``+inf``.
    """
    if block_tokens < 1:
        raise ValueError(f"block_tokens {block_tokens} must be >= 1")
    p = torch.softmax(logits_hat, dim=-1)
    c = torch.where(torch.isposinf(u) & torch.isfinite(logits_hat),
                    torch.full_like(p, float("inf")), p * torch.expm1(u))
    N = c.shape[-1]
    nb = -(-N // block_tokens)
    c = torch.nn.functional.pad(c, (0, nb * block_tokens - N))
    return c.reshape(*c.shape[:-1], nb, block_tokens).sum(dim=-1)


def output_bound(p_hat: torch.Tensor, v_hat: torch.Tensor, v_wit_norm: torch.Tensor,
                 cert: torch.Tensor) -> torch.Tensor:
    """docs/MATH.md §5 with centre 0: ``2 min(cert, 1) max_t (||v^_t|| + w_t) + sum_t p^_t w_t``.

    p_hat: [..., N]; v_hat: [..., N, D]; v_wit_norm: [..., N] (``>= ||v_t - v^_t||``);
    cert: [...]. Returns [...] bounding ``||o - o^||`` (TV <= min(cert, 1) since TV <= 1).
    """
    radius = torch.linalg.vector_norm(v_hat, dim=-1) + v_wit_norm
    spread = 2.0 * torch.clamp(cert, max=1.0) * radius.amax(dim=-1)
    inf = torch.full_like(v_wit_norm, float("inf"))
    mean_w = torch.where(torch.isposinf(v_wit_norm), inf, p_hat * v_wit_norm).sum(dim=-1)
    return spread + mean_w


def tv_distance(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Total variation ``0.5 * sum |p - q|`` over the last dim."""
    return 0.5 * (p - q).abs().sum(dim=-1)
