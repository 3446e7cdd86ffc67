"""expm1_up_exp (common.cuh; PROOFS 5.5): the CUDA extend's certificate term bound by the exp route
alone, (exp_acc(u) - 1) (1 + 2^-12) + 2^-20 in one fma, >= expm1(u) for every u >= 0.

On the CPU: the derivation on a model of the device's arithmetic (ex2.approx within 2^-21 of 2^x,
either sign at every point, fp32 roundings). On the GPU: the kernel's own instructions
(``wc_expm1_probe`` of extend.cu) on two million points against float64 expm1.
"""

import math

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


@pytest.mark.skipif(not GPU, reason="the probe of the kernel's instructions needs a GPU")
def test_the_bound_holds_on_the_devices_instructions():
    """The same points through expm1_up_exp compiled in extend.cu (``wc_expm1_probe``): never
    below float64 expm1 of the fp32 u, and within 2^-11 relative or 2^-19 absolute of it."""
    import ctypes

    from witcert.kernels import cuda as wc_cuda
    from witcert.kernels.launch import _arch

    lib = wc_cuda.library(qgp=4, group=32, bits=16, rounds=10, arch=_arch(torch.device("cuda")), kind="extend")
    u = torch.from_numpy(points())
    ud, yd = u.cuda(), torch.empty(u.numel(), device="cuda")
    rc = lib.wc_expm1_probe(ctypes.c_void_p(ud.data_ptr()), ctypes.c_void_p(yd.data_ptr()), u.numel(),
                            ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    assert rc == 0
    got, ex = yd.cpu().double().numpy(), exact(u.numpy())
    ok = got >= ex * (1.0 + 2.0 ** -50)
    assert ok.all(), f"u {u.numpy()[~ok][:5]} gives {got[~ok][:5]} < expm1 {ex[~ok][:5]}"
    fin = np.isfinite(ex)
    assert (got[fin] <= ex[fin] * (1.0 + 2.0 ** -11) + 2.0 ** -19).all()
    assert np.isinf(got[~fin]).all()
    below = (u.numpy() < 0.0625) & (ex > 0)
    print(f"smallest margin below 1/16: {(got[below] - ex[below]).min():.3g} (absolute); "
          f"largest relative looseness above: {((got - ex) / ex)[~below & fin & (ex > 0)].max():.3g}")
