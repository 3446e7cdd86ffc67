"""The certificate lemma (docs/MATH.md §1) and its exact worst case, in float64."""

from __future__ import annotations

import itertools
import math

import pytest
import zlib

import torch

from witcert.ref.cert import block_contributions, certificate, tv_distance
from witcert.report.worstcase import exact_worst_tv, worst_tv_lower

F64 = torch.float64


def _cases(gen: torch.Generator, rows: int, n: int):
    """Logits of several sharpness scales and radii from tiny to vacuous, per row."""
    z_scale = torch.tensor([0.1, 1.0, 4.0, 12.0], dtype=F64)[torch.randint(0, 4, (rows, 1), generator=gen)]
    u_scale = torch.tensor([1e-4, 1e-2, 0.3, 2.0], dtype=F64)[torch.randint(0, 4, (rows, 1), generator=gen)]
    z = torch.randn(rows, n, generator=gen, dtype=F64) * z_scale
    u = torch.rand(rows, n, generator=gen, dtype=F64) * u_scale
    return z, u


def _tv_at(z_hat, d):
    return tv_distance(torch.softmax(z_hat + d, -1), torch.softmax(z_hat, -1))


def test_tv_never_exceeds_cert_at_random_vertices_and_interior_points():
    gen = torch.Generator().manual_seed(1)
    for n in (1, 2, 5, 33, 200):
        z, u = _cases(gen, 1000, n)
        _, cert = certificate(z, u)
        signs = torch.randint(0, 2, z.shape, generator=gen).to(F64) * 2 - 1
        interior = torch.rand(z.shape, generator=gen, dtype=F64) * 2 - 1
        for d in (signs * u, interior * u, u, -u):
            tv = _tv_at(z, d)
            assert bool((tv <= cert * (1 + 1e-12) + 1e-15).all()), float((tv - cert).max())


def test_tv_never_exceeds_cert_at_adversarial_vertices():
    # The best interval/complement vertex is the strongest cheap attack; the exact worst
    # vertex (N <= 12) is the strongest possible one.
    gen = torch.Generator().manual_seed(2)
    z, u = _cases(gen, 1500, 40)
    _, cert = certificate(z, u)
    assert bool((worst_tv_lower(z, u) <= cert * (1 + 1e-12)).all())
    z, u = _cases(gen, 300, 9)
    _, cert = certificate(z, u)
    assert bool((exact_worst_tv(z, u) <= cert * (1 + 1e-12)).all())


def _brute_force(z: torch.Tensor, u: torch.Tensor) -> float:
    """Max TV over all 2^n vertices, written independently of the module under test."""
    p = [math.exp(v) for v in (z - z.max()).tolist()]
    s = sum(p)
    p = [v / s for v in p]
    best = 0.0
    for signs in itertools.product((-1.0, 1.0), repeat=len(p)):
        w = [pi * math.exp(sg * ui) for pi, sg, ui in zip(p, signs, u.tolist())]
        tot = sum(w)
        best = max(best, 0.5 * sum(abs(wi / tot - pi) for wi, pi in zip(w, p)))
    return best


@pytest.mark.parametrize("kind", ["random", "ties", "peaked", "wide_u"])
def test_exact_worst_case_matches_brute_force(kind):
    gen = torch.Generator().manual_seed(zlib.crc32(kind.encode()) % 1000)  # stable across runs
    for _ in range(25):
        n = int(torch.randint(1, 11, (1,), generator=gen))
        z = torch.randn(n, generator=gen, dtype=F64) * (8.0 if kind == "peaked" else 2.0)
        if kind == "ties":  # tied radii make the choice a subset-sum problem
            u = torch.tensor([0.1, 1.0, 3.0], dtype=F64)[torch.randint(0, 3, (n,), generator=gen)]
        else:
            u = torch.rand(n, generator=gen, dtype=F64) * (6.0 if kind == "wide_u" else 1.5)
        exact = float(exact_worst_tv(z, u))
        assert exact == pytest.approx(_brute_force(z, u), rel=1e-12, abs=1e-14)
        assert float(worst_tv_lower(z, u)) <= exact + 1e-14


def test_exact_worst_case_at_twelve_tokens_matches_brute_force():
    gen = torch.Generator().manual_seed(12)
    z = torch.randn(12, generator=gen, dtype=F64) * 3
    u = torch.rand(12, generator=gen, dtype=F64)
    assert float(exact_worst_tv(z, u)) == pytest.approx(_brute_force(z, u), rel=1e-12)


def _best_prefix(z, u):
    order = torch.argsort(u, descending=True)
    best = 0.0
    for k in range(len(u) + 1):
        d = -u.clone()
        d[order[:k]] = u[order[:k]]
        best = max(best, float(_tv_at(z, d)))
    return best


def test_threshold_sets_in_u_are_not_always_optimal():
    # The counterexample stated in worstcase.py: the smaller-u token must go up.
    p = torch.tensor([0.01, 0.99], dtype=F64)
    z, u = p.log(), torch.tensor([1.0, 1.1], dtype=F64)
    exact = float(exact_worst_tv(z, u))
    assert exact == pytest.approx(float(_tv_at(z, torch.tensor([1.0, -1.1], dtype=F64))), rel=1e-12)
    assert exact > 5 * _best_prefix(z, u)


def test_interval_sets_in_u_are_not_always_optimal_either():
    gen = torch.Generator().manual_seed(5)
    gaps = []
    for _ in range(200):
        z = torch.randn(8, generator=gen, dtype=F64) * 3
        u = torch.tensor([0.1, 0.5, 1.0, 3.0], dtype=F64)[torch.randint(0, 4, (8,), generator=gen)]
        u = u + torch.rand(8, generator=gen, dtype=F64) * 1e-3
        gaps.append(float(exact_worst_tv(z, u) - worst_tv_lower(z, u)))
    assert max(gaps) > 1e-3 and min(gaps) >= -1e-14


@pytest.mark.parametrize("u0", [1e-3, 0.1, 0.7, 2.0, 5.0])
def test_uniform_radius_worst_case_is_tanh_half_u(u0):
    t = math.tanh(u0 / 2)
    pstar = 1.0 / (1.0 + math.exp(u0))  # mass of the raised set at the optimum
    p = torch.tensor([pstar, (1 - pstar) * 0.3, (1 - pstar) * 0.7], dtype=F64)
    u = torch.full((3,), u0, dtype=F64)
    assert float(exact_worst_tv(p.log(), u)) == pytest.approx(t, rel=1e-10)
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(50, 10, generator=gen, dtype=F64)
    assert bool((exact_worst_tv(z, torch.full_like(z, u0)) <= t * (1 + 1e-12)).all())


def test_cert_is_never_nan_and_flags_give_inf():
    z = torch.tensor([[0.0, 1.0, 2.0], [0.0, 1.0, 2.0], [0.0, -math.inf, 2.0],
                      [0.0, 1.0, 2.0], [5.0, 5.0, 5.0]], dtype=torch.float32)
    u = torch.tensor([[0.0, math.inf, 0.1], [0.0, 0.0, 500.0], [0.1, math.inf, 0.1],
                      [0.1, 0.1, 0.1], [math.inf, 0.0, 0.0]], dtype=torch.float32)
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 1, 1], [0, 0, 0], [0, 1, 1]], dtype=torch.bool)
    a, cert = certificate(z, u, mask=mask)
    assert not bool(cert.isnan().any()) and not bool(a.isnan().any())
    assert cert[0] == math.inf and cert[1] == math.inf  # flagged token; exp overflow
    assert math.isfinite(cert[2])  # the -inf logit is not attended: its inf u is irrelevant
    assert cert[3] == 0.0 and a[3] == 1.0  # nothing attended
    assert cert[4] == pytest.approx(0.0, abs=1e-7)  # masked flagged token excluded


@pytest.mark.parametrize("u0", [1e-9, 1e-6, 1e-3])
def test_tiny_cert_keeps_its_relative_accuracy_in_float32(u0):
    # A - 1 by subtraction would round a 1e-9 cert to 0 in float32, below the true TV
    # (about u0 / 2 here); the excess form keeps it.
    gen = torch.Generator().manual_seed(8)
    z = torch.randn(64, 300, generator=gen) * 5
    u = torch.full_like(z, u0) * (1 + torch.rand(z.shape, generator=gen))
    _, cert = certificate(z, u)
    ref = (torch.softmax(z.double(), -1) * torch.expm1(u.double())).sum(-1)
    assert torch.allclose(cert.double(), ref, rtol=1e-5, atol=0)


def test_cert_matches_direct_formula():
    gen = torch.Generator().manual_seed(4)
    z, u = _cases(gen, 200, 30)
    a, cert = certificate(z, u)
    direct = (torch.softmax(z, -1) * torch.exp(u)).sum(-1)
    # certificate() inflates the float64 ratio by 1 + 2^-20 to cover its own rounding
    assert (a >= direct * (1 - 1e-15)).all() and torch.allclose(a, direct, rtol=2e-6)
    assert (cert >= (direct - 1) * (1 - 1e-9)).all()
    assert torch.allclose(cert, direct - 1, rtol=2e-6, atol=1e-15)


def test_zeroing_one_blocks_radii_lowers_a_by_its_contribution():
    gen = torch.Generator().manual_seed(6)
    z, u = _cases(gen, 50, 97)
    contrib = block_contributions(z, u, block_tokens=16)
    assert contrib.shape == (50, 7)
    a, _ = certificate(z, u)
    for j in range(7):
        u2 = u.clone()
        u2[:, j * 16:(j + 1) * 16] = 0
        a2, _ = certificate(z, u2)
        # equal up to certificate()'s own 1 + 2^-20 rounding allowance
        assert torch.allclose(a - a2, contrib[:, j], rtol=2e-6, atol=1e-13)
    assert torch.allclose(contrib.sum(-1), a - 1, rtol=2e-6, atol=1e-13)


def test_split_partials_merged_with_lse_weights_give_the_global_a():
    gen = torch.Generator().manual_seed(7)
    z, u = _cases(gen, 100, 97)
    a_ref, _ = certificate(z, u)
    for splits in (2, 3, 7):
        chunk = -(-97 // splits)
        lses, parts = [], []
        for s in range(splits):
            zs, us = z[:, s * chunk:(s + 1) * chunk], u[:, s * chunk:(s + 1) * chunk]
            parts.append(certificate(zs, us)[0])
            lses.append(torch.logsumexp(zs, -1))
        w = torch.softmax(torch.stack(lses, -1), -1)
        assert torch.allclose((w * torch.stack(parts, -1)).sum(-1), a_ref, rtol=1e-12)
