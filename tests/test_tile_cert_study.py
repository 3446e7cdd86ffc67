"""The tiled certificate sum (benchmarks/tile_cert_study.py, BENCHMARKS.md 13aw): a pricing study of
the certificate's per-token terms taken per tile. Each of its three steps is an upper bound, so every
tiled form must be at least the exact sum ``sum_j p_j expm1(min(d_j, r_j))``, the steps must only
loosen it, and a tile of one token must give the exact sum back (each step is then an equality)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from tile_cert_study import det_radius, prob_radius, row_forms, row_prob_per_tile  # noqa: E402

from witcert.ref.cert import prob_log_factor, radius_det, radius_prob  # noqa: E402


def _row(seed: int, n: int = 200, ng: int = 4, spread: float = 1.0):
    """A row's softmax over n tokens, its group norms and the tokens' witnesses and scales (float64);
    ``spread``: how far the tokens' scales differ (a few tokens 30x larger at 1.0, as sinks)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(ng, 32, generator=gen, dtype=torch.float64) * 2
    scales = torch.rand(n, ng, generator=gen, dtype=torch.float64) * 0.02 + 0.005
    scales[:: max(1, n // 7)] *= 1 + 29 * spread
    wit = scales * (0.5 + torch.rand(n, ng, generator=gen, dtype=torch.float64)) * 3
    p = torch.softmax(torch.randn(n, generator=gen, dtype=torch.float64) * 3, 0)
    return dict(p=p, qn2=q.norm(dim=-1), qn1=q.abs().sum(-1), wit=wit, scales=scales,
                sm=128 ** -0.5, lf=prob_log_factor(n_tokens=n, delta_loc=1e-6))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("tile", [64, 32, 0])
def test_every_step_is_an_upper_bound_and_only_loosens(seed, tile):
    a, b1, b2, b = row_forms(**_row(seed), tile=tile)
    assert a > 0
    assert a * (1 - 1e-12) <= b1 <= b2 * (1 + 1e-12) <= b * (1 + 1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_a_tile_of_one_token_is_the_exact_sum(seed):
    a, b1, b2, b = row_forms(**_row(seed, n=50), tile=1)
    assert b1 == pytest.approx(a, rel=1e-12)
    assert b2 == pytest.approx(a, rel=1e-12)
    assert b == pytest.approx(a, rel=1e-12)


def test_tokens_of_equal_scales_cost_only_step_one():
    """Equal witnesses and scales in a tile: the minimum and the root are exact per tile, so steps 2
    and 3 add nothing and step 1's factor is expm1(U) / U against each token's own radius U."""
    r = _row(7, n=128, spread=0.0)
    r["scales"][:] = 0.01
    r["wit"][:] = 0.03
    a, b1, b2, b = row_forms(**r, tile=64)
    assert b1 == pytest.approx(a, rel=1e-12)
    assert b == pytest.approx(a, rel=1e-12)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("tile", [8, 32, 0])
def test_prob_per_tile_is_an_upper_bound_and_exact_on_one_token_tiles(seed, tile):
    row = _row(seed)
    a = row_forms(**row, tile=1)[0]
    assert row_prob_per_tile(**row, tile=tile) >= a * (1 - 1e-12)
    assert abs(row_prob_per_tile(**row, tile=1) - a) <= 1e-12 * a


def test_the_study_radii_are_the_reference_formulas():
    """det_radius / prob_radius take the group norms the tiled sums need; on a row's tokens they give
    witcert.ref.cert's radius_det / radius_prob (b 8) within the reference's 2^-40 inflation."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(128, generator=gen, dtype=torch.float64) * 2
    wit = torch.rand(40, 4, generator=gen, dtype=torch.float64) * 0.05
    scales = torch.rand(40, 4, generator=gen, dtype=torch.float64) * 0.02
    qg, sm, lf = q.view(4, 32), 128 ** -0.5, prob_log_factor(n_tokens=40, delta_loc=1e-6)
    det = det_radius(wit, qg.norm(dim=-1), sm=sm)
    prob = prob_radius(scales, qg.norm(dim=-1), qg.abs().sum(-1), sm=sm, lf=lf)
    assert torch.allclose(det, radius_det(q, wit, sm_scale=sm, group_size=32), rtol=1e-11, atol=0)
    assert torch.allclose(prob, radius_prob(q, scales, sm_scale=sm, group_size=32, bits=8, n_tokens=40,
                                            delta_loc=1e-6), rtol=1e-11, atol=0)
