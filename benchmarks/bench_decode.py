"""Decode attention with certificate vs torch SDPA fp16, on one GPU.

Counts the bytes a step must read (codes, scales, witnesses if the certificate is on,
epochs, block table) and reports GB/s and the speed-up over SDPA fp16 measured in the
same run. Variants cost each stage: no dither / dither 8, 16, 24 bits / cert off, on.
The kernel runs with the launcher's default tiles (benchmarks/tune_decode.py sweeps them).
Usage: python benchmarks/bench_decode.py [--quick] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
import triton.testing

from witcert.config import CertConfig
from witcert.kernels.decode import decode_attention
from witcert.kernels.write import write_kv_

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from test_kernels_write import make_layer  # noqa: E402  (the tests' own pool generator)


def bench_us(fn, *, graph: bool = True) -> float:
    """Median microseconds; replayed from a CUDA graph (launch gaps removed) when possible."""
    fn()
    torch.cuda.synchronize()
    if graph:
        try:
            return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=200, return_mode="median")
        except Exception as e:  # noqa: BLE001  (fall back, but say so)
            print(f"  [cudagraph timing failed: {type(e).__name__}: {e}; using do_bench]")
    return 1e3 * triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")


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


def print_table(rows: list[dict], cols: list[str], *, file=None) -> None:
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    line = " | ".join(c.ljust(widths[c]) for c in cols)
    print(line, file=file)
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


def build(B, hq, hkv, S, page, bits, gen):
    """Pool of B sequences of S tokens (pages shuffled), the exact fp16 K/V, q."""
    pages = B * S // page
    layer = make_layer(hkv=hkv, d=D, num_slots=pages * page, bits=bits, device="cuda",
                       gen=torch.Generator().manual_seed(bits))
    perm = torch.randperm(pages, device="cuda", generator=gen).to(torch.int32)
    bt = perm.view(B, S // page).contiguous()
    k = kv_like(B * S, hkv, D, gen=gen)
    v = kv_like(B * S, hkv, D, gen=gen)
    t = torch.arange(S, device="cuda")
    slots = (bt[:, t // page].long() * page + t % page).reshape(-1)
    for i in range(0, B * S, 1 << 16):
        write_kv_(layer, k[i:i + (1 << 16)], v[i:i + (1 << 16)], slots=slots[i:i + (1 << 16)])
    q = torch.randn(B, hq, D, device="cuda", generator=gen)
    sl = torch.full((B,), S, dtype=torch.int32, device="cuda")
    # SDPA layout [B, H, S, D] in token order of each sequence
    kk = k.view(B, S, hkv, D).transpose(1, 2).contiguous()
    vv = v.view(B, S, hkv, D).transpose(1, 2).contiguous()
    return layer, q, bt, sl, kk, vv


def step_bytes(B, hkv, S, *, cert: bool, page: int) -> int:
    ng = D // 32
    per_tok_head = 2 * D + 2 * ng * 2 + (2 * ng * 2 if cert else 0)  # codes, scales, wit
    return B * S * (hkv * per_tok_head + 8 + 4 // page)  # + epoch (int64), block table


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="first shape, few variants")
    ap.add_argument("--out", default=None, help="write rows as JSON lines here")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    shapes = SHAPES[:1] if args.quick else SHAPES
    builds = [(16, 16), (16, 8), (16, 24), (1, 16)]  # (page, bits)
    for B, hq, hkv, S in shapes:
        for page, bits in builds:
            layer, q, bt, sl, kk, vv = build(B, hq, hkv, S, page, bits, gen)
            base = dict(shape=f"B{B} Hq{hq} Hkv{hkv} S{S}", page=page)

            def run(cert, nod=False, chunk=None, bn=None, nw=None):
                return decode_attention(q, layer, bt, sl, page_size=page, sm_scale=D ** -0.5, cert=cert,
                                        delta_loc=1e-9, num_splits=None, block_n=bn, num_warps=nw,
                                        chunk_qk=chunk, _bench_no_dither=nod)

            if (page, bits) == (16, 16):
                qq = q.to(torch.float16)[:, :, None]
                sdpa_us = bench_us(lambda: F.scaled_dot_product_attention(qq, kk, vv, enable_gqa=True))
                rows.append(dict(base, variant="sdpa fp16", us=round(sdpa_us, 1),
                                 GBps=round(2 * kk.numel() * 2 / sdpa_us * 1e-3), x_sdpa=1.0))
                variants = [("cert on (min)", CertConfig(), False, None),
                            ("cert off", CertConfig(enabled=False), False, None),
                            ("cert on (det)", CertConfig(radius="det"), False, None),
                            ("no dither, cert off", CertConfig(enabled=False), True, None),
                            ("no dither, cert on", CertConfig(), True, None),
                            ]
            elif page == 16 and bits == 8:
                variants = [("cert on (min)", CertConfig(), False, None),
                            ("cert off", CertConfig(enabled=False), False, None)]
            else:
                variants = [("cert on (min)", CertConfig(), False, None)]
                if page == 1:
                    variants.append(("cert off", CertConfig(enabled=False), False, None))
            for name, cert, nod, chunk in variants:
                us = bench_us(lambda cert=cert, nod=nod, chunk=chunk: run(cert, nod, chunk))
                nbytes = step_bytes(B, hkv, S, cert=cert.enabled, page=page)
                rows.append(dict(base, variant=f"b{bits} {name}", us=round(us, 1),
                                 GBps=round(nbytes / us * 1e-3), x_sdpa=round(sdpa_us / us, 2)))
                print(rows[-1], flush=True)
            del layer, kk, vv
            torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print_table(rows, ["shape", "page", "variant", "us", "GBps", "x_sdpa"])


if __name__ == "__main__":
    main()
