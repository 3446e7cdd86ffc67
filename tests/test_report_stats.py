"""Statistics of the report: paired bootstrap CI and McNemar's exact test."""

from __future__ import annotations

import math

import pytest
import torch

from witcert.report.stats import mcnemar, paired_bootstrap


def test_bootstrap_ci_covers_known_difference_at_nominal_rate():
    # paired data with true mean difference 0.3; a 95% CI must contain it ~95% of the time
    g = torch.Generator().manual_seed(0)
    hits, trials = 0, 60
    for t in range(trials):
        base = torch.randn(80, generator=g, dtype=torch.float64)
        other = base + 0.3 + 0.5 * torch.randn(80, generator=g, dtype=torch.float64)
        ci = paired_bootstrap(other, base, resamples=2000, seed=t)
        hits += ci["lo"] <= 0.3 <= ci["hi"]
    # Binomial(60, 0.95): P(hits < 50) < 0.2%; the percentile bootstrap is slightly liberal at n=80
    assert hits >= 50, hits


def test_bootstrap_interval_excludes_zero_for_a_clear_difference_and_is_reproducible():
    a = torch.ones(50)
    b = torch.cat([torch.ones(25), torch.zeros(25)])
    ci = paired_bootstrap(a, b)
    assert ci["resamples"] == 10_000 and ci["n"] == 50
    assert ci["diff"] == pytest.approx(0.5)
    assert 0.3 < ci["lo"] < 0.5 < ci["hi"] < 0.7
    assert paired_bootstrap(a, b) == ci  # fixed generator seed


def test_bootstrap_of_identical_arms_is_degenerate_at_zero():
    x = torch.randn(30)
    ci = paired_bootstrap(x, x)
    assert ci["lo"] == ci["hi"] == ci["diff"] == 0.0


def test_bootstrap_rejects_unpaired_input():
    with pytest.raises(ValueError):
        paired_bootstrap([1.0, 2.0], [1.0])


def test_mcnemar_matches_hand_computed_exact_p_value():
    # 10 pairs: a right / b wrong in 6 (n10), a wrong / b right in 1 (n01), 3 concordant.
    a = [1, 1, 1, 1, 1, 1, 0, 1, 0, 0]
    b = [0, 0, 0, 0, 0, 0, 1, 1, 0, 0]
    r = mcnemar(a, b)
    assert (r["n10"], r["n01"]) == (6, 1)
    # two-sided exact: 2 * P(X <= 1), X ~ Bin(7, 1/2) = 2 * (1 + 7) / 128 = 0.125
    assert r["p"] == pytest.approx(0.125)


def test_mcnemar_without_discordant_pairs_has_p_one_and_caps_at_one():
    assert mcnemar([1, 0, 1], [1, 0, 1])["p"] == 1.0
    r = mcnemar([1, 0], [0, 1])  # n01 = n10 = 1: 2 * P(X <= 1 | n=2) = 1.5 -> 1
    assert r["p"] == 1.0


def test_mcnemar_symmetry():
    a = [1, 1, 1, 0, 0, 1, 0, 1]
    b = [0, 0, 1, 1, 0, 0, 0, 0]
    r1, r2 = mcnemar(a, b), mcnemar(b, a)
    assert (r1["n01"], r1["n10"]) == (r2["n10"], r2["n01"])
    assert math.isclose(r1["p"], r2["p"])
