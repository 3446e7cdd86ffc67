"""CPU throughput of the pure-torch reference: Philox words/s, dither8 encode/decode tokens/s.

    python benchmarks/bench_cpu_ref.py [--repeats 5] [--tokens 4096] [--threads N]

The reference is the specification, not the fast path; these numbers say how large a
test or offline evaluation can be, and give the napkin-math baseline for the kernels.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from witcert.ref.philox import dither, philox4x32_10
from witcert.ref.quant import DitherInt8
from witcert.ref.types import EncodeCtx


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--counters", type=int, default=1 << 20)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    T, H, D, R = args.tokens, args.heads, args.head_dim, args.repeats

    g = torch.Generator().manual_seed(0)
    ctr = torch.randint(0, 2**32, (args.counters, 4), generator=g)
    key = torch.tensor([0x12345678, 0x9ABCDEF0])
    rows = []
    t = median_seconds(lambda: philox4x32_10(ctr, key), R)
    rows.append(("philox4x32_10", f"{args.counters} counters", 4 * args.counters / t, "words/s",
                 16 * args.counters / t / 1e9))

    x = torch.randn(T, H, D, generator=g).to(torch.float16)
    ctx = EncodeCtx.simple(num_tokens=T, num_heads=H, seed=1)
    for bits in (8, 16, 24):
        t = median_seconds(lambda: dither(seed=1, layer=0, kv_heads=ctx.kv_heads, side=0, slots=ctx.slots,
                                          epochs=ctx.epochs, head_dim=D, bits=bits), R)
        rows.append((f"dither b={bits}", f"T={T} H={H} D={D}", T / t, "tokens/s", T * H * D * 4 / t / 1e9))
    comp = DitherInt8(group_size=32, bits=16)
    packed = comp.encode(x, ctx=ctx)
    t = median_seconds(lambda: comp.encode(x, ctx=ctx), R)
    rows.append(("dither8 encode b=16", f"T={T} H={H} D={D}", T / t, "tokens/s", T * H * D * 2 / t / 1e9))
    t = median_seconds(lambda: comp.decode(packed, ctx=ctx), R)
    rows.append(("dither8 decode b=16", f"T={T} H={H} D={D}", T / t, "tokens/s",
                 T * H * comp.bytes_per_token_head(D) / t / 1e9))

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {R}")
    print(f"{'op':<22}{'size':<22}{'rate':>14}  {'unit':<9}{'GB/s':>8}")
    for name, size, rate, unit, gbs in rows:
        print(f"{name:<22}{size:<22}{rate:>14,.0f}  {unit:<9}{gbs:>8.3f}")
    print("GB/s: philox = output words; dither = f32 xi written; encode = fp16 input read; "
          "decode = packed bytes read.")


if __name__ == "__main__":
    main()
