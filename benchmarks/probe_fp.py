"""Measure the floating-point facts the Triton certificate relies on, on this device.

docs/PROOFS.md section 5.5 models the kernel's ``exp_acc`` (``ex2.approx`` on NVIDIA GPUs) as
relative error <= 2^-21 plus the exponent argument's rounding (<= 2 |x| 2^-24), and
``expm1_up(u) >= expm1(u)``. This script evaluates both on a dense grid and on random
points and prints the largest error found next to the model's bound; it exits 1 when the
model is violated. Usage: python benchmarks/probe_fp.py [--n N]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from witcert.kernels.decode import EXP_ETA, exp_acc, expm1_up  # noqa: E402


@triton.jit
def _probe(X, E, M, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = o < n
    x = tl.load(X + o, mask=mask, other=0.0)
    tl.store(E + o, exp_acc(x), mask=mask)
    tl.store(M + o, expm1_up(-x), mask=mask)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1 << 22)
    args = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator().manual_seed(0)
    grid = -torch.linspace(0, 88.5, args.n // 2, dtype=torch.float64)
    rnd = -torch.rand(args.n // 2, generator=g, dtype=torch.float64) * 88.5
    small = -torch.rand(1 << 16, generator=g, dtype=torch.float64) * 0.0625
    x = torch.cat([grid, rnd, small]).to(torch.float32)
    e = torch.empty_like(x, device=dev)
    m = torch.empty_like(x, device=dev)
    xd = x.to(dev)
    _probe[(triton.cdiv(x.numel(), 1024),)](xd, e, m, x.numel(), BLOCK=1024)
    x64 = x.to(torch.float64)
    e64 = torch.exp(x64)
    # below exp(x) = 2^-126 the result may be flushed to zero (ex2.approx.ftz): those weights
    # are the certificate's tail term, so the relative model is checked on the normal range
    normal = e64 >= 2.0**-126
    ec = e.cpu().to(torch.float64)
    rel = torch.where(normal, ((ec - e64) / e64).abs(), torch.zeros_like(e64))
    bound = EXP_ETA + 2.0 * x64.abs() * 2.0**-24
    worst = (rel / bound).max().item()
    tail_ok = bool((ec[~normal] <= 2.0**-125).all())
    u = -x64
    em = torch.expm1(u)
    below = (m.cpu().to(torch.float64) < em).sum().item()
    over = ((m.cpu().to(torch.float64) - em) / em.clamp_min(1e-300)).max().item()
    print(f"device {torch.cuda.get_device_name() if dev == 'cuda' else 'cpu (interpreter)'}; "
          f"{x.numel()} points in [-88.5, 0]")
    print(f"exp_acc: max relative error {rel.max().item():.3e}; max error / model bound {worst:.3f} "
          f"(model: 2^-21 + 2|x| 2^-24)")
    print(f"exp_acc below the normal range: every weight <= 2^-125 (tail): {tail_ok}")
    print(f"expm1_up: {below} points below expm1 (must be 0); largest relative excess {over:.3e}")
    ok = worst <= 1.0 and below == 0 and tail_ok
    print("fp model:", "HOLDS" if ok else "VIOLATED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
