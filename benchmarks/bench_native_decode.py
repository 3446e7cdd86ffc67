"""Per-layer cost of the vLLM plugin's decode and write on CPU: native C vs the torch path.

``decode_batched`` (one decode query per sequence, certificate included) with
``native="on"`` (witcert.native, one C pass) and ``native="off"`` (the torch reference
path: the reference's torch Philox), on the same pool, in the same run;
plus the write of one new token per sequence (``witcert.native.write.write_`` vs
``witcert.ref.pool.write_``). Default shape: SmolLM2's attention (Hq 9, Hkv 3, D 64),
batch 8 x 100 context tokens, page 16, preset ``default`` (8-bit dither, radius min; ``--bits``).
Prints the best-of-repeats ms per layer, the ratio, and the GB/s of packed K/V read.

    python benchmarks/bench_native_decode.py [--batch 8] [--context 100] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from witcert.config import CertConfig, QuantConfig
from witcert.integrations.vllm.attend import anytime_delta, decode_batched
from witcert.native import write as native_write
from witcert.ref.pool import write_

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from cases import make_case  # noqa: E402  (the tests' shared case generator)


def best_ms(fn, *, number: int, repeats: int) -> float:
    fn()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - t0) / number * 1e3)
    return min(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=100)
    ap.add_argument("--hq", type=int, default=9)
    ap.add_argument("--hkv", type=int, default=3)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--bits", type=int, default=QuantConfig.dither_bits)
    ap.add_argument("--radius", default="min")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args()
    torch.set_num_threads(1)  # vLLM's CPU worker on this machine runs torch on one thread

    B, N, D = a.batch, a.context, a.head_dim
    lkv, q, bt, sl, _ = make_case(seq_lens=(N,) * B, hq=a.hq, hkv=a.hkv, d=D, page=a.page,
                                  bits=a.bits)
    cert = CertConfig(radius=a.radius, allocation="anytime")
    dl = anytime_delta(cert, num_layers=30, num_q_heads=a.hq, positions=sl)
    q = q.bfloat16()
    kw = dict(page_size=a.page, sm_scale=D ** -0.5, cert=cert, delta_loc=dl)
    t_torch = best_ms(lambda: decode_batched(q, lkv, bt, sl, **kw, native="off"),
                      number=10, repeats=a.repeats)
    t_nat = best_ms(lambda: decode_batched(q, lkv, bt, sl, **kw, native="on",
                                           num_threads=a.threads), number=100, repeats=a.repeats)
    packed = 2 * B * N * a.hkv * (D + 4 * D // lkv.quant.group_size)  # codes + fp16 scale + wit
    print(f"decode  B={B} N={N} Hq={a.hq} Hkv={a.hkv} D={D} P={a.page} b={a.bits} "
          f"radius={a.radius} threads={a.threads}")
    print(f"  torch path  {t_torch:8.3f} ms/layer")
    print(f"  native      {t_nat:8.3f} ms/layer  ({packed / t_nat / 1e6:.2f} GB/s of packed K/V)")
    print(f"  speed-up    {t_torch / t_nat:8.1f}x")

    k = torch.randn(B, a.hkv, D).bfloat16()
    v = torch.randn(B, a.hkv, D).bfloat16()
    slots = torch.arange(B, dtype=torch.int64) * a.page  # one new token per sequence
    w_torch = best_ms(lambda: write_(lkv, k, v, slots=slots), number=20, repeats=a.repeats)
    w_nat = best_ms(lambda: native_write.write_(lkv, k, v, slots=slots), number=200,
                    repeats=a.repeats)
    print(f"write   {B} new tokens: torch path {w_torch:.3f} ms/layer, native {w_nat:.3f} "
          f"ms/layer, speed-up {w_torch / w_nat:.1f}x")


if __name__ == "__main__":
    main()
