"""The arithmetic of the path that computes the logits (docs/PROOFS.md section 5).

The certificate lemma needs ``|d_t| <= u_t`` for the logit the path *used*, not for the
exact ``sm * q.k^_t``. Every path (reference, Triton kernels, native C, engine plugins)
therefore adds to the compression radius ``u_quant`` an arithmetic term

    u_arith_t = rel_l * |l_t| + rel_s * sm * S_t + abs_err + softmax

where ``l_t`` is the logit the path used, ``S_t >= sum_i |q_i| |k^_{t,i}|`` a bound on the
absolute dot product, ``rel_l`` the final rounding of the logit into its format, ``rel_s``
the rounding of the dot and of the scale products, ``abs_err`` the underflow floor, and
``softmax`` the logit-equivalent error of the softmax weights the path computed
(exponent argument, ``exp`` itself, rescales). A path's ``LogitModel`` holds these
constants; each is derived in docs/PROOFS.md section 5 from a stated rounding model.

The certificate ratio ``sum_t w_t expm1(u_t) / sum_t w_t`` is then computed with rounding
and inflated by ``1 + sum_rel``; tokens whose weight underflowed (the *tail*, weights
below ``exp(-tail_gap)``) are covered by the additive term ``N exp(2 U - tail_gap)``
with ``U`` the largest radius (``tail_bound``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

U32 = 2.0**-24  # unit roundoff of fp32 (round to nearest)
U64 = 2.0**-53  # unit roundoff of fp64
F32_MAX = float(torch.finfo(torch.float32).max)
# fp32 weights exp(x) are normal for x >= -87.33; below, the relative error is unbounded
F32_TAIL_GAP = 87.0
F64_TAIL_GAP = 700.0


def gamma(n: int, unit: float) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: a sum of ``n`` products in ANY order (with or
    without FMA) is within ``gamma_n * sum |x_i y_i|`` of the exact value (no underflow)."""
    if n < 0 or n * unit >= 0.5:
        raise ValueError(f"gamma: n={n} too large for unit {unit}")
    return n * unit / (1.0 - n * unit)


def tc_beta(d: int) -> float:
    """The signed accumulation model of a tensor-core dot of ``d`` exact products into fp32
    accumulators chained from 0 (docs/PROOFS.md 5.4; checked on the GPU by
    tests/test_tc_signed_dot.py): the result is within ``beta_d sum |q_i k_i|`` of the exact sum,
    ``beta_d = 3 d 2^-23 (1 + 2^-10)``."""
    return 3 * d * 2.0**-23 * (1 + 2.0**-10)


def tc_dot_slack(d: int, sm_scale: float) -> tuple[float, float]:
    """The slack of a logit ``fl(sm * dot)`` whose dot of ``d`` products runs on tensor cores with
    fp16 (or bf16) inputs as given: exact products, fp32 accumulators chained from 0 (docs/PROOFS.md
    5.4, "the exact new tokens on tensor cores"). Returns ``(rel, abs)`` with ``|z - sm q.k| <= rel
    sm sum |q_i k_i| + abs``. rel: the signed accumulation model ``beta_d = 3 d 2^-23 (1 + 2^-10)``
    (checked on the GPU by tests/test_tc_signed_dot.py) and the scale's rounding; abs: the products
    and partial sums below fp32's normal range, if the hardware flushes them (at most ``2 d + 2``
    flushes of less than ``2^-126`` each), times ``sm``; both rounded up for their fp32 use, abs at
    least ``2^-126`` so that it stays a normal fp32 number."""
    beta = tc_beta(d)
    rel = (beta + U32 * (1 + beta)) * (1 + 2.0**-20)
    return rel, max((2 * d + 2) * 2.0**-126 * sm_scale * (1 + 2.0**-20), 2.0**-126)


@dataclass(frozen=True)
class LogitModel:
    """Rounding constants of one path (see the module docstring for the formula).

    name: the path. rel_l: coefficient of |l|. rel_s: coefficient of sm * S.
    abs_err: absolute floor covering underflow of the logit arithmetic.
    softmax: logit-equivalent error of every softmax weight of the path (uniform over
        tokens whose weight is normal). tail_gap: weights below exp(-tail_gap) form the tail.
    sum_rel: relative error bound of the computed certificate ratio.
    """

    name: str
    rel_l: float
    rel_s: float
    abs_err: float
    softmax: float
    tail_gap: float
    sum_rel: float

    def __post_init__(self) -> None:
        for f in ("rel_l", "rel_s", "abs_err", "softmax", "sum_rel"):
            v = getattr(self, f)
            if not (math.isfinite(v) and v >= 0.0):
                raise ValueError(f"LogitModel.{f}: {v} must be finite and >= 0")
        if not self.tail_gap > 0.0:
            raise ValueError(f"LogitModel.tail_gap: {self.tail_gap} must be > 0")


def reference_model(head_dim: int) -> LogitModel:
    """The reference (``witcert.ref.attention``): ``l = fl32(fl64(sm * fl64(q.k^)))``, softmax,
    output and certificate sums in float64 (PROOFS 5.2)."""
    return LogitModel(name="reference", rel_l=U32 * (1.0 + 2.0**-20),
                      rel_s=2.0 * gamma(head_dim + 2, U64), abs_err=2.0**-148,
                      softmax=2.0**-40, tail_gap=F64_TAIL_GAP, sum_rel=2.0**-20)


def native_model(head_dim: int) -> LogitModel:
    """The native C path (``witcert/native/decode.c``): logits, softmax and sums all in
    float64 (PROOFS 5.3). The certificate sum runs over N < 2^22 tokens."""
    return LogitModel(name="native", rel_l=0.0, rel_s=2.0 * gamma(head_dim + 2, U64),
                      abs_err=2.0**-1000, softmax=2.0**-40, tail_gap=F64_TAIL_GAP,
                      sum_rel=2.0**-28)


def native_f32_model(head_dim: int) -> LogitModel:
    """The native C extend's fp32 arithmetic (``witcert/native/extend.c``, ``arith32``; PROOFS
    5.3): each logit is ``fl64(sm * dot32)``, ``dot32`` the fp32 sum of the ``D`` fp32 products
    in eight partial sums of ``D/8`` terms each, combined as a balanced tree (at most ``D/8 + 4``
    roundings per term: ``gamma_{D/8+4}(u)``; the float64 product by ``sm``, relative ``2^-53``,
    within ``gamma_{D/8+5}(u)``), plus the products' underflow, ``sm D 2^-150 <= 2^-100`` for
    the scales ``sm <= 2^40`` the C code runs in fp32 (larger scales take the float64 dots,
    inside these constants). Softmax and sums in float64 as ``native_model``."""
    return LogitModel(name="native-f32", rel_l=0.0, rel_s=gamma(head_dim // 8 + 5, U32),
                      abs_err=2.0**-100, softmax=2.0**-40, tail_gap=F64_TAIL_GAP,
                      sum_rel=2.0**-28)


def native_bf16_model(head_dim: int) -> LogitModel:
    """The native C extend's bf16-pair dots of the exact new tokens (``witcert/native/extend_math.h``
    ``dotsbf_tile16``, AVX512-BF16; PROOFS 5.3): taken where every query of a work item and key
    of a tile is a bf16 number with no subnormal and ``sm <= 2^16``. Each logit is ``fl64(sm *
    dot)``, ``dot`` four fp32 partial sums of ``D/8`` vdpbf16ps steps (a step adds two exact
    products, rounding to nearest after each) combined as a balanced tree: at most ``D/4 + 2``
    roundings per term, ``gamma_{D/4+3}(u)`` with the float64 product by ``sm``. The instruction
    flushes results below ``2^-126`` to zero: at most ``2 D`` flushes per dot, ``sm 2 D 2^-126 <=
    2^-101`` within ``abs_err``. Softmax and sums as ``native_f32_model``."""
    return replace(native_f32_model(head_dim), name="native-bf16",
                   rel_s=gamma(head_dim // 4 + 3, U32))


def round_up_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Smallest value of ``dtype`` >= x, elementwise (x float64; NaN -> +inf, never NaN).
    float64 is returned as is."""
    x = x.to(torch.float64)
    if dtype == torch.float64:
        return torch.where(torch.isnan(x), torch.full_like(x, float("inf")), x)
    f = x.to(dtype)
    low = f.to(torch.float64) < x
    f = torch.where(low, torch.nextafter(f, torch.full_like(f, float("inf"))), f)
    return torch.where(torch.isnan(x), torch.full_like(f, float("inf")), f)


def f32_round_up(x: torch.Tensor) -> torch.Tensor:
    """Smallest float32 >= x, elementwise (x float64; NaN -> +inf, never NaN)."""
    return round_up_to(x, torch.float32)


def logits_f64_to_f32(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Round float64 logits to the fp32 values a path uses; ``(l f32, overflow bool)``.

    A logit that is not finite in fp32 (overflow of finite inputs, or NaN from inf - inf)
    is replaced by a finite value (clamped to +-FLT_MAX, NaN -> 0) so the softmax stays
    finite, and reported in ``overflow``: its radius must be ``+inf`` ("no guarantee").
    """
    l = y.to(torch.float32)
    bad = ~torch.isfinite(l)
    l = torch.where(torch.isnan(l), torch.zeros((), dtype=l.dtype, device=l.device),
                    l.clamp(-F32_MAX, F32_MAX))
    return l, bad


def logit_slack(l: torch.Tensor, dot_bound: torch.Tensor, *, sm_scale: float,
                model: LogitModel) -> torch.Tensor:
    """``u_arith`` (float64, same shape as ``l``): the bound on |logit used - sm q.k^| plus
    the softmax weights' logit-equivalent error. ``dot_bound`` >= sum_i |q_i k^_i| (float64)."""
    l64 = l.to(torch.float64).abs()
    return model.rel_l * l64 + (model.rel_s * sm_scale) * dot_bound.to(torch.float64) \
        + (model.abs_err + model.softmax)


def tail_bound(n_tokens, umax: torch.Tensor, *, model: LogitModel) -> torch.Tensor:
    """Mass the lemma does not see: tokens whose weight underflowed (gap > tail_gap) carry
    true probability at most ``exp(-tail_gap + u_t + u_max_token)``; summed over at most N
    tokens this is ``N exp(2 U - tail_gap)`` with U the largest radius (float64)."""
    u = umax.to(torch.float64)
    n = torch.as_tensor(n_tokens, dtype=torch.float64, device=u.device)
    expo = torch.clamp(2.0 * u - model.tail_gap, max=800.0)
    return torch.where(torch.isposinf(u), torch.full_like(u, float("inf")), n * torch.exp(expo))
