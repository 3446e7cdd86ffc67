"""The CUDA tensor-core decode kernel against an earlier version of its source, the Triton kernel
and torch SDPA fp16, in one run (CUDA-graph medians, D 128, q bf16, certificate on unless noted).

Usage: python benchmarks/bench_decode_cuda_prev.py --prev OLD.cu [OTHER.cu ...] [--shapes 0 2] [--bits 16 8]
       [--maxreg 255] [--per-split 512 2048] [--shape B,HQ,HKV,S ...] [--no-triton] [--out FILE]
``--maxreg R`` adds the current source built with ``DecodePlan(max_registers=R)`` (255: no cap
below the hardware's, i.e. without the source's own launch bounds); ``--per-split N`` the current
source with ``DecodePlan(min_tokens_per_split=N)`` (the default plan's is 1024 on the H200).
Each ``--prev`` file is a variant named by its file name (``cuda OLD.cu b16``; the first one is also
timed with the certificate off); ``OLD.cu`` is e.g. ``git show REV:witcert/kernels/cuda/decode.cu``;
it is built through the same launcher (``witcert.kernels.cuda.library(src=...)``). A version that
does not serve a shape (it fails to build) is reported as such.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import torch
import torch.nn.functional as F

from bench_decode import D, SHAPES, bench_us, build, finish

from witcert.config import CertConfig
from witcert.kernels import cuda as wc_cuda
from witcert.kernels.decode import decode_attention
from witcert.kernels.plan import decode_plan


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prev", required=True, nargs="+")
    ap.add_argument("--out", default=None)
    ap.add_argument("--shapes", type=int, nargs="*", default=None, help="indices into bench_decode.SHAPES")
    ap.add_argument("--bits", type=int, nargs="*", default=[16, 8])
    ap.add_argument("--maxreg", type=int, nargs="*", default=[])
    ap.add_argument("--per-split", type=int, nargs="*", default=[])
    ap.add_argument("--shape", action="append", default=[], metavar="B,HQ,HKV,S",
                    help="a shape besides --shapes (repeatable)")
    ap.add_argument("--no-triton", action="store_true", help="leave the Triton kernel's row out")
    ap.add_argument("--off-all", action="store_true",
                    help="time every --prev file with the certificate off too, at every --bits (default: the "
                         "first, at b 16)")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    base = decode_plan("cuda:0")
    cu, tri = base.replace(impl="cuda"), base.replace(impl="triton", min_tokens_per_split=512)
    on, off = CertConfig(), CertConfig(enabled=False)
    # named by file, or by folder for the measurement-only variants (floor_variants.py); None: now
    prev_srcs = [(Path(f).name if Path(f).name != "decode.cu" else Path(f).parent.name, Path(f))
                 for f in args.prev]
    now_src = None
    rows = []
    shapes = [SHAPES[i] for i in args.shapes] if args.shapes is not None else ([] if args.shape else SHAPES)
    shapes += [tuple(int(x) for x in sh.split(",")) for sh in args.shape]
    for B, hq, hkv, S in shapes:
        shape = f"B{B} Hq{hq} Hkv{hkv} S{S}"
        sdpa = None
        for bits in args.bits:
            layer, q, bt, sl, kk, vv = build(B, hq, hkv, S, 16, bits, gen)
            if sdpa is None:
                qq = q.to(torch.float16)[:, :, None]
                sdpa = bench_us(lambda: F.scaled_dot_product_attention(qq, kk, vv, enable_gqa=True))
                rows.append(dict(shape=shape, variant="sdpa fp16", us=round(sdpa, 1), x_sdpa=1.0))
            kw = dict(page_size=16, sm_scale=D ** -0.5, delta_loc=1e-9, num_splits=None)
            variants = [(f"cuda now b{bits}", on, cu, now_src)]
            variants += [(f"cuda {name} b{bits}", on, cu, src) for name, src in prev_srcs]
            variants += [(f"cuda now b{bits} maxreg {r}", on, cu.replace(max_registers=r), now_src)
                         for r in args.maxreg]
            variants += [(f"cuda now b{bits} split {n}", on, cu.replace(min_tokens_per_split=n), now_src)
                         for n in args.per_split]
            if bits == 16 or args.off_all:  # the certificate off: at b 16, or at every b with --off-all
                variants += [(f"cuda now b{bits} cert off", off, cu, now_src)]
                variants += [(f"cuda {name} b{bits} cert off", off, cu, src)
                             for name, src in (prev_srcs if args.off_all else prev_srcs[:1])]
            if bits == 16 and not args.no_triton:
                variants += [("triton b16", on, tri, now_src)]
            for name, cert, plan, src in variants:
                try:
                    with wc_cuda.built_from(src) if src else contextlib.nullcontext():
                        us = bench_us(lambda: decode_attention(q, layer, bt, sl, cert=cert, plan=plan, **kw))
                    rows.append(dict(shape=shape, variant=name, us=round(us, 1), x_sdpa=round(sdpa / us, 3)))
                except Exception as e:  # noqa: BLE001  (a version that does not build this shape)
                    rows.append(dict(shape=shape, variant=name, us="ERR", x_sdpa=repr(e)[:70]))
                print(rows[-1], flush=True)
            torch.cuda.empty_cache()
    finish(rows, ["shape", "variant", "us", "x_sdpa"], out=args.out)


if __name__ == "__main__":
    main()
