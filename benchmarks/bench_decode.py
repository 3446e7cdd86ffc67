"""Decode attention with certificate vs torch SDPA fp16, on one GPU.

Counts the bytes a step must read (codes, scales, witnesses when the certificate is on,
epochs, block table) and reports GB/s and the ratio to SDPA fp16 measured in the same run
(> 1: faster than SDPA). Variants cost each part: dither bits 8 / 16, Philox 7 / 10 rounds,
certificate on / off, query digits, tiles and warps (``DecodePlan``).
Usage: python benchmarks/bench_decode.py [--quick] [--out FILE]   (default: the default plan, ``auto``)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
import triton.testing

from witcert.config import CertConfig, QuantConfig
from witcert.kernels.decode import decode_attention
from witcert.kernels.plan import DecodePlan, decode_plan
from witcert.kernels.write import write_kv_

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from cases import make_layer  # noqa: E402  (the tests' shared case generator)


def bench_us(fn, *, graph: bool = True) -> float:
    """Median microseconds; replayed from a CUDA graph (launch gaps removed) when possible."""
    fn()
    torch.cuda.synchronize()
    if graph:
        try:
            return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median")
        except Exception as e:  # noqa: BLE001  (fall back, but say so)
            print(f"  [cudagraph timing failed: {type(e).__name__}: {e}; using do_bench]")
    return 1e3 * triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy, bytes read + written per second (the ceiling)."""
    a = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    b = torch.empty_like(a)
    us = bench_us(lambda: b.copy_(a), graph=False)
    return 2 * nbytes / (us * 1e-6)


def kv_like(n: int, hkv: int, d: int, *, gen: torch.Generator, dtype=torch.float16) -> torch.Tensor:
    """Model-like keys on the GPU: unit noise times per-channel scales (a few large channels)."""
    chan = torch.exp(torch.randn(1, hkv, d, device="cuda", generator=gen))
    return (torch.randn(n, hkv, d, device="cuda", generator=gen) * chan).to(dtype)


def finish(rows: list[dict], cols: list[str], *, out: str | None) -> None:
    """Write the rows as JSON lines to ``out`` (if given) and print the table."""
    if out:
        with open(out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print_table(rows, cols)


def print_table(rows: list[dict], cols: list[str], *, file=None) -> None:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    print(" | ".join(c.ljust(widths[c]) for c in cols), file=file)
    print("-|-".join("-" * widths[c] for c in cols), file=file)
    for r in rows:
        print(" | ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols), file=file)


D = 128
SHAPES = [  # (B, Hq, Hkv, S)
    (16, 32, 8, 4096),
    (4, 32, 8, 32768),
    (1, 28, 4, 131072),
    (64, 32, 8, 512),  # short context: B=64 keeps the pool larger than L2
]


def build(B, hq, hkv, S, page, bits, gen, *, rounds=10):
    """Pool of B sequences of S tokens (pages shuffled), the exact fp16 K/V, q (bf16)."""
    pages = B * S // page
    layer = make_layer(hkv=hkv, d=D, num_slots=pages * page, bits=bits, device="cuda",
                       gen=torch.Generator().manual_seed(bits), rounds=rounds)
    perm = torch.randperm(pages, device="cuda", generator=gen).to(torch.int32)
    bt = perm.view(B, S // page).contiguous()
    k = kv_like(B * S, hkv, D, gen=gen)
    v = kv_like(B * S, hkv, D, gen=gen)
    t = torch.arange(S, device="cuda")
    slots = (bt[:, t // page].long() * page + t % page).reshape(-1)
    for i in range(0, B * S, 1 << 16):
        write_kv_(layer, k[i:i + (1 << 16)], v[i:i + (1 << 16)], slots=slots[i:i + (1 << 16)])
    q = torch.randn(B, hq, D, device="cuda", generator=gen).to(torch.bfloat16)
    sl = torch.full((B,), S, dtype=torch.int32, device="cuda")
    kk = k.view(B, S, hkv, D).transpose(1, 2).contiguous()
    vv = v.view(B, S, hkv, D).transpose(1, 2).contiguous()
    return layer, q, bt, sl, kk, vv


def step_bytes(B, hkv, S, *, cert: bool, page: int) -> int:
    ng = D // 32
    per_tok_head = 2 * D + 2 * ng * 2 + (2 * ng * 2 if cert else 0)  # codes, scales, wit (K and V)
    return B * S * (hkv * per_tok_head + 8 + 4 // page)  # + epoch (int64), block table


def variants(base_plan: DecodePlan, quick: bool):
    """(name, bits, rounds, cert, plan) rows to time on each shape, grouped by pool build (bits,
    rounds). ``cuda``: the CUDA C++ tensor-core kernel (the Triton kernel serves the shapes it
    does not: GQA 7 here); ``regN``: its register cap."""
    on, off = CertConfig(), CertConfig(enabled=False)
    # the Triton kernel with its own measured split (512 tokens, BENCHMARKS.md 4e)
    tri = base_plan.replace(impl="triton", min_tokens_per_split=512)
    cu = base_plan.replace(impl="cuda")
    b0 = QuantConfig.dither_bits  # the default's dither bits, then the other of 8 / 16
    b1 = 16 if b0 == 8 else 8
    rows = [(f"default b{b0} r10 cert on", b0, 10, on, base_plan), (f"default b{b0} r10 cert off", b0, 10, off, base_plan),
            (f"triton b{b0} r10 cert on", b0, 10, on, tri), (f"triton b{b0} r10 cert off", b0, 10, off, tri)]
    if not quick:
        rows += [(f"cuda b16 r10 cert on reg{r}", 16, 10, on, cu.replace(max_registers=r)) for r in (168, 128)]
    rows += [(f"cuda b{b1} r10 cert on", b1, 10, on, cu), (f"cuda b{b1} r10 cert off", b1, 10, off, cu),
             (f"triton b{b1} r10 cert on", b1, 10, on, tri)]
    if not quick:
        rows += [(f"cuda b8 r10 cert on reg{r}", 8, 10, on, cu.replace(max_registers=r)) for r in (168, 128)]
        rows += [(f"cuda b8 r10 cert on split{s}", 8, 10, on, cu.replace(min_tokens_per_split=s))
                 for s in (512, 2048)]
        rows += [("cuda b8 r7 cert on", 8, 7, on, cu)]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="the main variants only")
    ap.add_argument("--out", default=None, help="write rows as JSON lines here")
    ap.add_argument("--budget-s", type=float, default=300.0, help="stop adding shapes after this long")
    args = ap.parse_args()
    t_start = time.time()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    base_plan = decode_plan("cuda:0")
    print("default plan:", base_plan, flush=True)
    print(f"copy bandwidth: {copy_bandwidth() / 1e12:.2f} TB/s (read + write)", flush=True)
    shapes = SHAPES
    for B, hq, hkv, S in shapes:
        if time.time() - t_start > args.budget_s:
            print(f"budget reached: skipping B{B} S{S}")
            continue
        page = 16
        shape = f"B{B} Hq{hq} Hkv{hkv} S{S}"
        built = {}
        sdpa_us = None
        for name, bits, rounds, cert, plan in variants(base_plan, args.quick):
            if (bits, rounds) not in built:
                built.clear()
                torch.cuda.empty_cache()
                built[(bits, rounds)] = build(B, hq, hkv, S, page, bits, gen, rounds=rounds)
            layer, q, bt, sl, kk, vv = built[(bits, rounds)]
            if sdpa_us is None:
                qq = q.to(torch.float16)[:, :, None]
                sdpa_us = bench_us(lambda: F.scaled_dot_product_attention(qq, kk, vv, enable_gqa=True))
                rows.append(dict(shape=shape, variant="sdpa fp16", us=round(sdpa_us, 1),
                                 GBps=round(2 * kk.numel() * 2 / sdpa_us * 1e-3), x_sdpa=1.0))
                print(rows[-1], flush=True)
            try:
                us = bench_us(lambda: decode_attention(q, layer, bt, sl, page_size=page, sm_scale=D ** -0.5,
                                                       cert=cert, delta_loc=1e-9, num_splits=None, plan=plan))
            except Exception as e:  # noqa: BLE001  (a variant that does not compile is reported)
                rows.append(dict(shape=shape, variant=name, us="ERR", GBps=repr(e)[:80]))
                print(rows[-1], flush=True)
                continue
            nbytes = step_bytes(B, hkv, S, cert=cert.enabled, page=page)
            rows.append(dict(shape=shape, variant=name, us=round(us, 1), GBps=round(nbytes / us * 1e-3),
                             x_sdpa=round(sdpa_us / us, 3)))
            print(rows[-1], flush=True)
        built.clear()
        torch.cuda.empty_cache()
    finish(rows, ["shape", "variant", "us", "GBps", "x_sdpa"], out=args.out)


if __name__ == "__main__":
    main()
