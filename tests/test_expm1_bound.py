"""expm1_up_exp (common.cuh; PROOFS 5.5): the CUDA extend's certificate term bound by the exp route
alone, (exp_acc(u) - 1) (1 + 2^-12) + 2^-20 in one fma, >= expm1(u) for every u >= 0.

On the CPU: the derivation on a model of the device's arithmetic (ex2.approx within 2^-21 of 2^x,
either sign at every point, fp32 roundings). On the GPU: the kernel's own instructions
(``wc_expm1_probe`` of extend.cu) on two million points against float64 expm1.
"""

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

GPU = torch.cuda.is_available()
ETA = 2.0 ** -21  # ex2.approx.ftz.f32's relative error with room (witcert.kernels.decode.EXP_ETA)
L1, L2 = np.float32(1.44269502162933349609375), np.float32(1.92596298909109e-08)


def points() -> np.ndarray:
    """fp32 radii u >= 0: 0, subnormal and tiny values, a log grid to 88, every fp32 value within
    64 ulp of 1/16 (where expm1_up changes route) and of ln 2 (where exp_acc(u) - 1 stops being
    exact), large values and +inf."""
    gen = np.random.default_rng(20261205)
    edges = []
    for c in (0.0625, math.log(2.0), 1.0):
        c = np.float32(c)
        edges.append(c + np.arange(-64, 65, dtype=np.float32) * np.spacing(c))
    return np.concatenate([
        np.array([0.0, 1e-45, 1e-38, 2.0 ** -30, 2.0 ** -24, 2.0 ** -21, 2.0 ** -20, 88.0, 88.7, np.inf],
                 dtype=np.float32),
        np.exp(gen.uniform(math.log(2.0 ** -40), math.log(88.0), 400_000)).astype(np.float32),
        gen.uniform(0.0, 0.0625, 100_000).astype(np.float32), *edges]).astype(np.float32)


def model(u: np.ndarray, theta: float, c: float) -> np.ndarray:
    """expm1_up_exp on the model: the argument fma(u, L1, u L2) rounded to fp32 (float64 holds
    the product exactly, then one rounding), ex2 within theta relative, rounded to fp32; E - 1 and
    the final fma each one fp32 rounding of the float64 value (exact before it: E - 1 has at most
    25 bits, times 1 + 2^-12 at most 38)."""
    with np.errstate(over="ignore", invalid="ignore"):
        arg = (u.astype(np.float64) * float(L1) + (u * L2).astype(np.float64)).astype(np.float32)
        e = (np.exp2(arg.astype(np.float64)) * (1.0 + theta)).astype(np.float32)
        x = (e.astype(np.float64) - 1.0).astype(np.float32)
        return (x.astype(np.float64) * 1.000244140625 + c).astype(np.float32)


def exact(u: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.expm1(u.astype(np.float64))


def test_the_bound_holds_on_the_model_at_either_sign_of_the_exp_error():
    """>= expm1(u) at every point with the exp's error -2^-21, 0 or +2^-21 (float64 expm1 within
    2^-52 relative, so a margin of 2^-50 of it decides); without the constant 2^-20 it fails
    below 1/16, where the exp's error is not relative to expm1(u), so the test can fail."""
    u = points()
    ex = exact(u)
    worst = 0.0
    for theta in (-ETA, 0.0, ETA):
        got = model(u, theta, 2.0 ** -20).astype(np.float64)
        ok = got >= ex * (1.0 + 2.0 ** -50)
        assert ok.all(), f"theta {theta:.3g}: u {u[~ok][:5]} gives {got[~ok][:5]} < expm1 {ex[~ok][:5]}"
        fin = np.isfinite(ex)
        # the price: at most 2^-11 relative plus 2^-19 absolute (the constant and the exp's error)
        worst = max(worst, float(((got[fin] - ex[fin]) / (ex[fin] * 2.0 ** -11 + 2.0 ** -19)).max()))
        without = model(u, theta, 0.0).astype(np.float64)
        if theta < 0:
            assert (without < ex).any(), "the additive constant is needed where the exp errs low"
    assert worst <= 1.0, worst


def device_probe(name: str, u: torch.Tensor) -> np.ndarray:
    """y = the function the extend.cu probe ``name`` wraps (``wc_expm1_probe``: expm1_up_exp,
    ``wc_expm1_poly_probe``: expm1_up_poly), at the fp32 points u, on the GPU."""
    import ctypes

    from witcert.kernels import cuda as wc_cuda
    from witcert.kernels.launch import _arch

    lib = wc_cuda.library(qgp=4, group=32, bits=16, rounds=10, arch=_arch(torch.device("cuda")), kind="extend")
    ud, yd = u.cuda(), torch.empty(u.numel(), device="cuda")
    rc = getattr(lib, name)(ctypes.c_void_p(ud.data_ptr()), ctypes.c_void_p(yd.data_ptr()), u.numel(),
                            ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    assert rc == 0
    return yd.cpu().numpy()


@pytest.mark.skipif(not GPU, reason="the probe of the kernel's instructions needs a GPU")
def test_the_bound_holds_on_the_devices_instructions():
    """The same points through expm1_up_exp compiled in extend.cu (``wc_expm1_probe``): never
    below float64 expm1 of the fp32 u, and within 2^-11 relative or 2^-19 absolute of it."""
    u = torch.from_numpy(points())
    got, ex = device_probe("wc_expm1_probe", u).astype(np.float64), exact(u.numpy())
    ok = got >= ex * (1.0 + 2.0 ** -50)
    assert ok.all(), f"u {u.numpy()[~ok][:5]} gives {got[~ok][:5]} < expm1 {ex[~ok][:5]}"
    fin = np.isfinite(ex)
    assert (got[fin] <= ex[fin] * (1.0 + 2.0 ** -11) + 2.0 ** -19).all()
    assert np.isinf(got[~fin]).all()
    below = (u.numpy() < 0.0625) & (ex > 0)
    print(f"smallest margin below 1/16: {(got[below] - ex[below]).min():.3g} (absolute); "
          f"largest relative looseness above: {((got - ex) / ex)[~below & fin & (ex > 0)].max():.3g}")


# ---- expm1_up_poly (common.cuh; PROOFS 5.5): the MUFU-free bound on [0, 1] -------------------------
POLY = (0.2182818353176116943359375, 0.5, 1.0)  # C3 (the least fp32 value >= e - 5/2), then 1/2, 1


def _up32(x: Fraction) -> float:
    """The least fp32 value >= the rational x (round toward +inf; finite, normal or subnormal)."""
    f = np.float32(float(x))  # nearest; then step up if it fell below
    if Fraction(float(f)) < x:
        f = np.nextafter(f, np.float32(np.inf))
    return float(f)


def horner_up(u: Fraction, c3: float = POLY[0]) -> Fraction:
    """expm1_up_poly's value at u in exact arithmetic: each fma and the product rounded toward +inf
    in fp32 (_up32 of the exact rational), the coefficients POLY with C3 = c3."""
    h = Fraction(_up32(Fraction(c3) * u + Fraction(POLY[1])))
    for c in POLY[2:]:
        h = Fraction(_up32(h * u + Fraction(c)))
    return Fraction(_up32(h * u))


def poly_points() -> np.ndarray:
    """fp32 u in [0, 1]: 0, the smallest subnormals and normals, every value within 64 ulp of 1, a
    log grid from 2^-149 and a uniform grid."""
    gen = np.random.default_rng(20261207)
    one = np.float32(1.0)
    near_one = one - np.arange(0, 65, dtype=np.float32) * np.spacing(np.float32(0.99))
    return np.concatenate([
        np.array([0.0, 1e-45, 2e-45, 1.1754944e-38, 2.0 ** -30, 2.0 ** -12, 0.5, 1.0], dtype=np.float32), near_one,
        np.exp(gen.uniform(math.log(2.0 ** -149), 0.0, 3000)).astype(np.float32),
        gen.uniform(0.0, 1.0, 3000).astype(np.float32)]).astype(np.float32)


def test_the_polynomials_constants_cover_the_taylor_tail_on_the_unit_interval():
    """C3 >= e - 5/2 = sum_{k >= 3} 1/k! (e bounded above by its series to 1/40! plus 2/41!), and
    the other coefficients are 1/2 and 1 exactly: what the proof's u^3 sum_{k >= 3} u^(k-3) / k! <=
    C3 u^3 on [0, 1] needs."""
    e_up = sum(Fraction(1, math.factorial(k)) for k in range(41)) + Fraction(2, math.factorial(41))
    assert Fraction(POLY[0]) >= e_up - Fraction(5, 2)
    assert POLY[1:] == (0.5, 1.0)
    assert POLY[0] == _up32(e_up - Fraction(5, 2))  # the least such fp32 value: no looser than it must be


def test_the_polynomial_bound_holds_in_exact_arithmetic_with_upward_roundings():
    """Horner's steps each rounded toward +inf in fp32 (exactly: rationals), at every point: the result is
    >= expm1(u) (decided in rationals against an upper bound of expm1: sum_{k<=25} u^k / k! + 2 u^26 /
    26!), and at most 0.63% relative above it (the degree-3 polynomial's own excess, largest near u =
    0.64, and its roundings; at a subnormal u one subnormal step, 2^-149, at most). A C3 of 1/6 (the
    next Taylor term alone) fails near 1, so the test can fail."""

    def expm1_upper(u: Fraction) -> Fraction:
        s, term = Fraction(0), Fraction(1)
        for k in range(1, 26):
            term = term * u / k
            s += term
        return s + 2 * term * u / 26  # the tail beyond k = 25 is below twice its first term (u <= 1)

    pts = poly_points()
    sub = pts[np.r_[0:80, 80:pts.size:24]]  # every edge point, a 24th of the grids: exact arithmetic is slow
    worst = 0.0
    for uf in sub:
        u = Fraction(float(uf))
        got = horner_up(u)
        ex = expm1_upper(u)
        assert got >= ex, f"u {float(uf)!r}: {float(got)!r} < expm1 {float(ex)!r}"
        if u >= Fraction(2) ** -126:  # below, the final product's rounding up is a subnormal step
            worst = max(worst, float((got - ex) / ex))
        else:
            assert got - ex <= Fraction(2) ** -149
    assert worst <= 0.0063, worst
    one = Fraction(1)
    assert horner_up(one, _up32(Fraction(1, 6))) < Fraction(math.e) - 1 - Fraction(1, 10 ** 9), \
        "a smaller C3 falls short at 1"


@pytest.mark.skipif(not GPU, reason="the probe of the kernel's instructions needs a GPU")
def test_the_polynomial_bound_is_the_devices_bits():
    """expm1_up_poly compiled in extend.cu (``wc_expm1_poly_probe``) gives, at every point of [0, 1],
    exactly the bits of the upward-rounded Horner scheme the CPU test proves (horner_up)."""
    u = torch.from_numpy(poly_points())
    got = device_probe("wc_expm1_poly_probe", u)
    want = np.array([float(horner_up(Fraction(float(x)))) for x in u.numpy()], dtype=np.float32)
    bad = got != want
    assert not bad.any(), f"u {u.numpy()[bad][:5]}: device {got[bad][:5]}, model {want[bad][:5]}"
    assert (got.astype(np.float64) >= exact(u.numpy())).all()
