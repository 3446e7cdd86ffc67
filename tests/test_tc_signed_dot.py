"""A probe of the tensor cores' signed fp32 accumulation, for the exact new tokens' q.k (issue 19).

The Triton kernel of the extend's exact new tokens forms q.k as fp32 ``ieee`` dots on CUDA cores,
so that ``gamma_{D+2}`` (PROOFS 5.4) covers them. fp16 and bf16 values multiply exactly in fp32
(11 + 11 or 8 + 8 significant bits), so a tensor-core dot of those inputs is exact up to its
accumulation. NVIDIA does not specify that accumulation. The measured behaviour of earlier
generations (products exact; each step adds a block of ``n_b`` products to the accumulator after
aligning them to the largest exponent, bits shifted out truncated, at least 24 bits kept; the sum
normalized by truncation) loses less than ``(n_b + 2) 2^-23`` of the block's sum of magnitudes per
step, so a dot of ``K`` products, in ``K / n_b`` steps on one accumulator that starts at 0, loses at
most

    (K + 2 K / n_b) 2^-23 (1 + 2^-10) sum_i |a_i b_i|  <=  3 K 2^-23 (1 + 2^-10) sum_i |a_i b_i|

for any block size ``n_b >= 1`` (each step's accumulator is at most the sum of the magnitudes before
it, times ``1 + 2^-10`` while ``3 K 2^-23 <= 2^-11``). That bound, ``beta_K = 3 K 2^-23``, is the
*signed accumulation model* this file checks on the GPU through ``tl.dot`` itself (the instruction
Triton picks for the shape: ``mma.sync`` at 16 x 16, ``wgmma`` where a warp group fits), for fp16
and bf16 inputs whose products are 0 or normal fp32 numbers, and accumulators chained over chunks
of the channels as the kernel does. The extend's exact new tokens stand on it where their q and
keys are 16-bit (``NEW_TC``, ``witcert.ref.arith.tc_dot_slack``, docs/PROOFS.md 5.4). A GPU whose
tensor cores broke the model fails here. CPU: skipped (the Triton interpreter does not
emulate tensor cores); the model's own bound is checked on the CPU in exact arithmetic.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

GPU = torch.cuda.is_available()
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")


@triton.jit
def _dot_probe(A, B, C, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr, KC: tl.constexpr):
    """One program per p: C[p] = A[p] [M, K] . B[p] [K, N], tl.dot over chunks of KC channels."""
    p = tl.program_id(0).to(tl.int64)
    rm, rn = tl.arange(0, M), tl.arange(0, N)
    acc = tl.zeros([M, N], tl.float32)
    for c0 in tl.static_range(0, K, KC):
        rk = c0 + tl.arange(0, KC)
        x = tl.load(A + p * M * K + rm[:, None] * K + rk[None, :])
        y = tl.load(B + p * K * N + rk[:, None] * N + rn[None, :])
        acc = tl.dot(x, y, acc)
    tl.store(C + p * M * N + rm[:, None] * N + rn[None, :], acc)


def beta(k: int) -> float:
    """The model's bound on |tl.dot - exact| over sum |a_i b_i| for k products (module docstring)."""
    return 3 * k * 2.0 ** -23 * (1 + 2.0 ** -10)


def probe(a: torch.Tensor, b: torch.Tensor, *, kc: int, num_warps: int) -> torch.Tensor:
    """``a`` [P, M, K] and ``b`` [P, K, N] (fp16 or bf16, on the GPU) -> [P, M, N] fp32: one program
    per p, ``acc = tl.dot(a[:, chunk], b[chunk, :], acc)`` over chunks of ``kc`` channels from 0."""
    P, M, K = a.shape
    N = b.shape[-1]
    c = torch.empty(P, M, N, device=a.device, dtype=torch.float32)
    _dot_probe[(P,)](a.contiguous(), b.contiguous(), c, M=M, N=N, K=K, KC=kc, num_warps=num_warps)
    return c


def families(P: int, M: int, N: int, K: int, dtype: torch.dtype, gen: torch.Generator) -> dict:
    """Adversarial inputs [P, M, K], [P, K, N] whose products are 0 or normal fp32 numbers."""
    top = 2.0 - 2.0 ** -(10 if dtype == torch.float16 else 7)  # the largest significand
    lo, hi = (-12, 12) if dtype == torch.float16 else (-50, 50)

    def mant(*s):
        return 1.0 + torch.rand(*s, generator=gen)

    def p2(a, b, *s):
        return torch.exp2(torch.randint(a, b, s, generator=gen).float())

    def sign(*s):
        return torch.where(torch.rand(*s, generator=gen) < 0.5, -1.0, 1.0)

    fam = {"spread": (sign(P, M, K) * mant(P, M, K) * p2(lo, hi, P, M, K),
                      sign(P, K, N) * mant(P, K, N) * p2(lo, hi, P, K, N))}
    # one dominant product per (row, column), the others 2^-26 .. 2^-18 of it with mixed signs:
    # truncation at the alignment edge is the model's worst case
    a = sign(P, M, K) * top * p2(-13, -9, P, M, K) * mant(P, M, K)
    a[:, :, 0] = top
    b = sign(P, K, N) * top * p2(-13, -9, P, K, N) * mant(P, K, N)
    b[:, 0, :] = top
    fam["alignment edge"] = (a, b)
    # the grid's edge: a product 1, then products just below its 24-bit grid (2^-23): a truncating
    # alignment loses every one of them (a third of beta over K terms)
    a = torch.full((P, M, K), 2.0 ** -12)
    a[:, :, 0] = 1.0
    b = torch.full((P, K, N), 2.0 ** -11 * top / 2)
    b[:, 0, :] = 1.0
    fam["grid edge"] = (a, b)
    # near-cancellation: pairs of equal and opposite large products, plus small ones
    a = mant(P, M, K) * p2(0, 6, P, M, K)
    a[:, :, 1::2] = a[:, :, 0::2]
    b = mant(P, K, N) * p2(0, 6, P, K, N)
    b[:, 1::2, :] = -b[:, 0::2, :]
    a[:, :, -8:] *= 2.0 ** -14  # the last 8 products small and of one sign: what the sum is left with
    b[:, -8:, :] = b[:, -8:, :].abs()
    fam["cancellation"] = (a, b)
    # full significands that carry, signs mostly alike
    fam["carries"] = ((top - mant(P, M, K) * 2.0 ** -8) * torch.where(torch.rand(P, M, K, generator=gen) < 0.9, 1.0, -1.0),
                      top - mant(P, K, N) * 2.0 ** -8)
    # half the entries 0, the rest across the range
    z = torch.rand(P, M, K, generator=gen) < 0.5
    fam["zeros"] = (torch.where(z, 0.0, sign(P, M, K) * mant(P, M, K) * p2(lo, hi, P, M, K)),
                    sign(P, K, N) * mant(P, K, N) * p2(lo, hi, P, K, N))
    return {k: (x.to(dtype), y.to(dtype)) for k, (x, y) in fam.items()}


def _exponent(x: Fraction) -> int:
    """e with 2^e <= |x| < 2^(e+1), exactly (x != 0; log2 of a float only guesses it)."""
    e = math.floor(math.log2(abs(x)))
    e += 1 if abs(x) >= Fraction(2) ** (e + 1) else 0
    return e - 1 if abs(x) < Fraction(2) ** e else e


def _trunc(x: Fraction, keep: int = 24) -> Fraction:
    """x truncated toward 0 to ``keep`` significant bits."""
    if x == 0:
        return x
    q = Fraction(2) ** (_exponent(x) - keep + 1)
    return math.trunc(x / q) * q


def _model_dot(a: list, b: list, n_b: int) -> Fraction:
    """The accumulation model of the module docstring, exactly: blocks of n_b exact products added
    to the accumulator after aligning every term to the largest one's exponent (truncated to its
    24-bit grid), the sum normalized by truncation to 24 bits."""
    c = Fraction(0)
    for i in range(0, len(a), n_b):
        terms = [c] + [Fraction(x) * Fraction(y) for x, y in zip(a[i:i + n_b], b[i:i + n_b])]
        top = max(abs(t) for t in terms)
        if top == 0:
            continue
        q = Fraction(2) ** (_exponent(top) - 23)
        c = _trunc(sum((math.trunc(t / q) * q for t in terms), Fraction(0)))
    return c


@pytest.mark.parametrize("n_b", [1, 4, 8, 16, 128])
def test_the_model_bound_holds_for_every_block_size(n_b):
    """The derivation of beta_K (module docstring), checked on the model itself in exact rational
    arithmetic: 200 dots of 128 fp16 products (random signs and exponents, one dominant product
    with the others at its alignment edge, near cancellation, and the truncation's worst case,
    which loses a third of beta: more than an IEEE sum's gamma_128 would), every block size, each within
    beta_128 sum |a_i b_i|; and tc_dot_slack's relative term is at least beta_D plus the scale's
    rounding, its absolute term a normal fp32 number."""
    from witcert.ref.arith import tc_dot_slack
    gen = torch.Generator().manual_seed(n_b)
    worst = 0.0
    for fam in range(200):
        sgn = torch.where(torch.rand(2, 128, generator=gen) < 0.5, -1.0, 1.0)
        mag = (1 + torch.rand(2, 128, generator=gen)) * torch.exp2(torch.randint(-12, 12, (2, 128), generator=gen).float())
        if fam % 3 == 1:  # one dominant product, the others 2^-26 .. 2^-18 of it
            mag = (1 + torch.rand(2, 128, generator=gen)) * torch.exp2(torch.randint(-13, -9, (2, 128), generator=gen).float())
            mag[:, 0] = 2 - 2.0 ** -10
        x = (sgn * mag).half()
        if fam % 3 == 2:  # pairs of equal and opposite products
            x[0, 1::2], x[1, 1::2] = x[0, 0::2], -x[1, 0::2]
        if fam == 0:  # the truncation's worst case: a product 1, then 127 just below its grid (2^-23)
            x = torch.tensor([[1.0] + [2.0 ** -12] * 127, [1.0] + [2.0 ** -11 * (1 - 2.0 ** -10)] * 127]).half()
        a, b = x[0].tolist(), x[1].tolist()
        exact = sum(Fraction(p) * Fraction(r) for p, r in zip(a, b))
        mags = sum(abs(Fraction(p) * Fraction(r)) for p, r in zip(a, b))
        err = abs(_model_dot(a, b, n_b) - exact) / mags
        worst = max(worst, float(err))
        assert err <= Fraction(beta(128)), (fam, float(err), beta(128))
        if fam == 0:  # it loses every small product: more than an fp32 sum's gamma_128(2^-24) allows
            assert err > 128 * 2.0 ** -24
    print(f"n_b {n_b}: worst {worst / beta(128):.3g} of beta")
    for d in (64, 128, 256):
        rel, ab = tc_dot_slack(d, 0.125)
        f32 = torch.tensor([rel, ab], dtype=torch.float32).double()
        assert f32[0] >= beta(d) + 2.0 ** -24 * (1 + beta(d)) and f32[1] >= 2.0 ** -126
        assert tc_dot_slack(d, 2.0 ** 20)[1] >= (2 * d + 2) * 2.0 ** -126 * 2.0 ** 20


@pytest.mark.skipif(not GPU, reason="the tensor-core accumulation probe needs a GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M,N,K,kc,num_warps", [(16, 16, 128, 128, 4), (16, 16, 128, 32, 4), (64, 32, 128, 32, 4),
                                                (64, 64, 128, 64, 8)])
def test_tensor_core_dots_meet_the_signed_accumulation_model(dtype, M, N, K, kc, num_warps):
    """|tl.dot(a, b) - a.b| <= beta_K sum |a_i b_i| for every output, on six adversarial families
    (module docstring); the float64 reference is within K 2^-53 sum |a_i b_i| of the exact sum."""
    gen = torch.Generator().manual_seed(20261205 + M + kc)
    worst = {}
    for name, (a, b) in families(256, M, N, K, dtype, gen).items():
        got = probe(a.cuda(), b.cuda(), kc=kc, num_warps=num_warps).cpu().double()
        a64, b64 = a.double(), b.double()
        exact, mag = a64 @ b64, a64.abs() @ b64.abs()
        assert torch.isfinite(got).all(), name
        err = (got - exact).abs()
        ok = err <= (beta(K) + K * 2.0 ** -53) * mag
        ratio = (err / mag.clamp(min=1e-300)).max().item()
        worst[name] = ratio
        assert ok.all(), f"{name}: error {ratio:.3g} of sum |a_i b_i| against the model's {beta(K):.3g}"
    print({k: f"{v / beta(K):.3g} of beta" for k, v in worst.items()})
