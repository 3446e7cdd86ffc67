"""Radii (docs/MATH.md §2) and the risk budget (docs/MATH.md §4)."""

from __future__ import annotations

import math

import pytest
import torch

from witcert.config import TOKEN_METHODS, QuantConfig
from witcert.ref.cert import combine_radius, delta_local, radius_det, radius_prob
from witcert.ref.types import EncodeCtx

compressors = pytest.importorskip("witcert.ref.compressors", reason="compressors.py not landed")

F64 = torch.float64
D = 128
SM = 1.0 / math.sqrt(D)


def _keys(gen, T, H, dtype):
    """Exact keys as the model stores them: fp16/bf16/fp32, with a few outlier channels."""
    x = torch.randn(T, H, D, generator=gen) * torch.tensor([0.05, 1.0, 30.0])[torch.randint(0, 3, (T, H, 1), generator=gen)]
    x[..., 7] *= 20.0
    return x.to(dtype)


def _roundtrip(quant, x, *, outlier_idx=None, seed=11):
    comp = compressors.get_compressor(quant)
    ctx = EncodeCtx.simple(num_tokens=x.shape[0], num_heads=x.shape[1], seed=seed, outlier_idx=outlier_idx)
    packed = comp.encode(x, ctx=ctx)
    return comp.decode(packed, ctx=ctx).to(F64), packed


def _check_det(q, x, xhat, wit, bypass=None):
    """q float64 [Q, H, D]; |d| <= u_det for every (query, token, head)."""
    err = xhat - x.to(F64)  # [T, H, D]
    d = SM * torch.einsum("qhd,thd->qht", q, err)
    u = radius_det(q, wit.permute(1, 0, 2).unsqueeze(0), sm_scale=SM, group_size=D // wit.shape[-1],
                   bypass=bypass)
    assert u.shape == d.shape
    assert bool((d.abs() <= u).all()), float((d.abs() - u).max())


@pytest.mark.parametrize("method", TOKEN_METHODS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_det_radius_bounds_logit_error_for_every_compressor(method, dtype):
    gen = torch.Generator().manual_seed(3)
    x = _keys(gen, 64, 3, dtype)
    xhat, packed = _roundtrip(QuantConfig(method=method), x)
    q = torch.randn(40, 3, D, generator=gen, dtype=F64) * 4
    _check_det(q, x, xhat, packed["wit"])


@pytest.mark.parametrize("method", TOKEN_METHODS)
def test_det_radius_holds_for_adaptive_queries_aligned_with_the_error(method):
    # The query is built from the error itself (what an adversary seeing the dither could do):
    # Cauchy-Schwarz is then tight per group, so a witness rounded down would fail here.
    gen = torch.Generator().manual_seed(4)
    x = _keys(gen, 48, 2, torch.float16)
    xhat, packed = _roundtrip(QuantConfig(method=method), x)
    err = xhat - x.to(F64)
    for t in range(0, 48, 5):
        q = err[t][None].clone()  # [1, H, D]
        _check_det(q, x, xhat, packed["wit"])
        _check_det(-q.sign(), x, xhat, packed["wit"])


def test_det_radius_with_outlier_bypass_excludes_exact_channels():
    gen = torch.Generator().manual_seed(5)
    x = _keys(gen, 64, 2, torch.float16)
    idx = torch.tensor([[6, 7, 40, 41], [0, 1, 100, 101]], dtype=torch.int64)
    xhat, packed = _roundtrip(QuantConfig(outliers=2), x, outlier_idx=idx)
    bypass = torch.zeros(2, D, dtype=torch.bool).scatter_(1, idx, True)
    assert bool((xhat[:, bypass] == x.to(F64)[:, bypass]).all())  # bypassed channels are exact
    q = torch.randn(20, 2, D, generator=gen, dtype=F64)
    q[..., 7] = 1e6  # a huge query on an exact channel must not inflate the radius
    _check_det(q, x, xhat, packed["wit"], bypass=bypass)
    u_by = radius_det(q, packed["wit"].permute(1, 0, 2).unsqueeze(0), sm_scale=SM, group_size=32, bypass=bypass)
    assert float(u_by[:, 0].max()) < 1e3


def test_flagged_token_has_infinite_radius_even_for_a_zero_query():
    wit = torch.tensor([[0.1, 0.2], [float("inf"), float("inf")]], dtype=torch.float16)
    q = torch.zeros(64, dtype=torch.float32)
    u = radius_det(q, wit, sm_scale=0.125, group_size=32)
    assert u[0] == 0 and u[1] == math.inf
    up = radius_prob(q, wit, sm_scale=0.125, group_size=32, bits=16, n_tokens=2, delta_loc=0.1)
    assert up[0] == 0 and up[1] == math.inf
    assert not bool(combine_radius(u, up, "min").isnan().any())


def test_prob_and_min_radius_need_a_probabilistic_radius():
    u = torch.ones(3)
    with pytest.raises(ValueError, match="prob"):
        combine_radius(u, None, "prob")
    with pytest.raises(ValueError, match="min"):
        combine_radius(u, None, "min")
    assert torch.equal(combine_radius(u, 0.5 * u, "min"), 0.5 * u)


def _adversarial_keys(bits: int, T: int) -> torch.Tensor:
    """Every token the same key whose channels sit at fraction 2^-(b+1) of the scale,
    where the b-bit dither's mean error is largest (|mu| = 2^-(b+1))."""
    s = 2.0**-6
    n = torch.arange(D) % 60 * 2  # even integers, so round-half-even ties bias one way
    x = s * (n + 2.0 ** -(bits + 1))
    x[::32] = s * 126.5  # fixes each group's scale to exactly s
    return x.to(torch.float32).expand(T, 1, D).contiguous()


def _clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    """One-sided Clopper-Pearson upper bound: the p with P(Bin(n, p) <= k) = alpha (the CDF
    summed in log space, bisection on p)."""
    def cdf(p: float) -> float:
        logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                + i * math.log(p) + (n - i) * math.log1p(-p) for i in range(k + 1)]
        top = max(logs)
        return math.exp(top) * sum(math.exp(v - top) for v in logs)

    lo, hi = k / n, 1.0 - 1e-12
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) > alpha else (lo, mid)
    return hi


@pytest.mark.parametrize("bits", [8, 16, 24])
@pytest.mark.parametrize("keys", ["random", "adversarial"])
@pytest.mark.parametrize("delta", [0.2, 0.01])
def test_prob_radius_violation_rate_stays_below_delta(bits, keys, delta):
    # Claim (docs/MATH.md §2b): for a query fixed before the dither, P(|d_t| > u_prob_t) <=
    # delta_loc / N. One fixed key repeated over T slots = T independent dither draws (distinct
    # counters). With N = 1 the bound is delta_loc itself: the one-sided Clopper-Pearson upper
    # bound of the miss rate (confidence 1 - 1e-6) must stay below it. A radius too small by 2x
    # would give a rate near 0.28 at delta 0.2 (Gaussian tail at 1.07 sigma), so this can fail.
    T = 8000
    gen = torch.Generator().manual_seed(bits)
    if keys == "random":
        x = (torch.randn(1, 1, D, generator=gen) * 3).expand(T, 1, D).contiguous()
        q = torch.randn(D, generator=gen, dtype=F64)
    else:
        x = _adversarial_keys(bits, T)
        q = torch.ones(D, dtype=F64)  # aligns the bias of every channel
    xhat, packed = _roundtrip(QuantConfig(dither_bits=bits), x, seed=1234 + bits)
    d = SM * ((xhat - x.to(F64))[:, 0] @ q)
    u = radius_prob(q, packed["scales"][:, 0], sm_scale=SM, group_size=32, bits=bits, n_tokens=1,
                    delta_loc=delta)
    misses = int((d.abs() > u).sum())
    assert _clopper_pearson_upper(misses, T, 1e-6) <= delta, (misses, T, delta)
    # sanity: the radius is not vacuous; the error reaches a good fraction of it
    assert float((d.abs() / u).max()) > 0.5


def test_prob_radius_is_much_smaller_than_det_for_long_contexts():
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(256, 1, D, generator=gen)
    xhat, packed = _roundtrip(QuantConfig(), x)
    q = torch.randn(D, dtype=F64, generator=gen)
    ud = radius_det(q, packed["wit"][:, 0], sm_scale=SM, group_size=32)
    up = radius_prob(q, packed["scales"][:, 0], sm_scale=SM, group_size=32, bits=16, n_tokens=4096,
                     delta_loc=1e-6)
    assert float((up / ud).median()) < 0.7


@pytest.mark.parametrize("allocation", ["fixed", "anytime"])
def test_risk_budget_sums_to_at_most_delta(allocation):
    L, H, T, delta = 32, 28, 512, 1e-2
    if allocation == "fixed":
        per_step = [delta_local(delta=delta, num_layers=L, num_q_heads=H, allocation="fixed",
                                horizon=T, step=s) for s in range(1, T + 1)]
    else:
        per_step = [delta_local(delta=delta, num_layers=L, num_q_heads=H, allocation="anytime",
                                step=s) for s in range(1, 200_001)]
    total = math.fsum(per_step) * L * H
    assert total <= delta * (1 + 1e-12)
    assert total >= delta * (0.99999 if allocation == "anytime" else 1 - 1e-12)


def test_risk_budget_rejects_bad_arguments():
    with pytest.raises(ValueError, match="horizon"):
        delta_local(delta=0.01, num_layers=1, num_q_heads=1, allocation="fixed")
    with pytest.raises(ValueError, match="step"):
        delta_local(delta=0.01, num_layers=1, num_q_heads=1, allocation="anytime", step=0)
    with pytest.raises(ValueError, match="delta"):
        delta_local(delta=1.5, num_layers=1, num_q_heads=1, allocation="anytime", step=1)
