"""Where the CUDA write kernel's time goes: write.cu and measurement-only builds of it, timed
against a device copy and the Triton kernel in the same run (T = 65536 tokens, Hkv 8, D 128, b = 16
and 8, groups of 32, fp16 inputs).

Each ablation replaces one piece of ``witcert/kernels/cuda/write.cu`` (``nodiv``: the quotient
x / s (three operations after a reciprocal per thread) by one multiply; ``nof64``: the witness's float64 error sum in fp32; ``nophilox``: the Philox
words by the counter itself; ``all3``: all three). Their stored values are wrong on purpose: they
price each piece of the bitwise contract (``ch8``: 8 channels per thread at b = 16, one Philox
call, instead of 16, is a layout with the same values; at b = 8 it is the shipped layout). The shipped build is checked bitwise against the
reference writer first. Usage: python benchmarks/ablate_write_cuda.py [--out FILE] [--prev OLD/write.cu ...]
(``--prev``: earlier versions of write.cu, each with its common.cuh beside it, timed in the same run
and checked bitwise against the reference writer)
(``--profile BITS``: three launches of the shipped kernel only, for Nsight Compute)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile

import torch

from bench_decode import bench_us, copy_bandwidth, kv_like, make_layer, print_table

from witcert.kernels import cuda as wc_cuda
from witcert.kernels.write import write_kv_
from witcert.ref.pool import write_

SRC = wc_cuda._WRITE_SRC.read_text()
NODIV = ("div_fast(x[i], s, rs)", "__fmul_rn(x[i], rs)")
NOF64 = [("double ss = 0.0;", "float ss = 0.0f;"),
         ("const double e = bad ? 0.0 : __dsub_rn((double)xhat, (double)x[i]);",
          "const float e = bad ? 0.0f : __fsub_rn(xhat, x[i]);"),
         ("ss = __dadd_rn(ss, __dmul_rn(e, e));", "ss = __fadd_rn(ss, __fmul_rn(e, e));"),
         ("ss = __dadd_rn(ss, __shfl_xor_sync(FULL, ss, o));", "ss = __fadd_rn(ss, __shfl_xor_sync(FULL, ss, o));")]
NOPHILOX = ("philox(word0, c1, (side << 31) | (uint32_t)(sub * CALLS + c), epoch, k0, k1)",
            "make_uint4(word0, c1, (side << 31) | (uint32_t)(sub * CALLS + c), epoch)")
CH8 = ("constexpr int CALLS = 16 / CPC;", "constexpr int CALLS = 8 / CPC > 0 ? 8 / CPC : 1;")
VARS = {"nodiv": [NODIV], "nof64": NOF64, "nophilox": [NOPHILOX], "all3": [NODIV, *NOF64, NOPHILOX],
        "ch8": [CH8]}
T, HKV, D = 65536, 8, 128


def variant(name: str, reps) -> str:
    src = SRC
    for a, b in reps:
        assert a in src, (name, a)
        src = src.replace(a, b)
    d = tempfile.mkdtemp()
    path = os.path.join(d, "write.cu")
    with open(path, "w") as f:
        f.write(src)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    ap.add_argument("--prev", nargs="*", default=[], metavar="WRITE_CU",
                    help="earlier versions of write.cu (each with its common.cuh beside it), timed beside the "
                         "shipped one and checked bitwise against the reference writer, named by their folder")
    ap.add_argument("--profile", type=int, default=0, metavar="BITS",
                    help="only launch the shipped kernel three times at these dither bits (for ncu)")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    if args.profile:
        layer = make_layer(hkv=HKV, d=D, num_slots=2 * T, bits=args.profile, outliers=0, device="cuda",
                           gen=torch.Generator().manual_seed(T))
        k, v = kv_like(T, HKV, D, gen=gen), kv_like(T, HKV, D, gen=gen)
        slots = torch.randperm(2 * T, device="cuda", generator=gen)[:T]
        for _ in range(3):
            write_kv_(layer, k, v, slots=slots, impl="cuda")
        torch.cuda.synchronize()
        return
    copy_bps = copy_bandwidth()
    rows = [dict(case="device copy 1 GiB", us="", pct_copy=100)]
    k = kv_like(T, HKV, D, gen=gen)
    v = kv_like(T, HKV, D, gen=gen)
    slots = torch.randperm(2 * T, device="cuda", generator=gen)[:T]
    nbytes = 2 * T * HKV * D * 2 + T * 16 + 2 * T * HKV * (D + 2 * (D // 32) * 2)
    for bits in (16, 8):
        layer = make_layer(hkv=HKV, d=D, num_slots=2 * T, bits=bits, outliers=0, device="cuda",
                           gen=torch.Generator().manual_seed(T))
        ref = make_layer(hkv=HKV, d=D, num_slots=2 * T, bits=bits, outliers=0, device="cuda",
                         gen=torch.Generator().manual_seed(T))
        write_(ref, k[:512], v[:512], slots=slots[:512])
        def bitwise_with(src):  # the first 512 tokens through a build, against the reference writer
            out = make_layer(hkv=HKV, d=D, num_slots=2 * T, bits=bits, outliers=0, device="cuda",
                             gen=torch.Generator().manual_seed(T))
            with wc_cuda.built_from(src) if src else contextlib.nullcontext():
                write_kv_(out, k[:512], v[:512], slots=slots[:512], impl="cuda")
            return all(torch.equal(getattr(out, s)[n], getattr(ref, s)[n]) for s in "kv" for n in out.k)
        same = bitwise_with(None)
        cases = [("cuda", None, "cuda", same), ("triton", None, "triton", "")] + \
            [(f"cuda {os.path.basename(os.path.dirname(p))}", p, "cuda", bitwise_with(p)) for p in args.prev] + \
            [(f"cuda {n}", variant(n, r), "cuda", "layout" if n == "ch8" else "n/a") for n, r in VARS.items()]
        for name, src, impl, bitwise in cases:
            def run():
                write_kv_(layer, k, v, slots=slots, impl=impl)
            if src is None:
                us = bench_us(run)
            else:
                with wc_cuda.built_from(src):
                    us = bench_us(run)
            rows.append(dict(case=f"{name} b{bits}", us=round(us, 1), bitwise=bitwise,
                             pct_copy=round(100 * nbytes / (us * 1e-6) / copy_bps)))
            print(rows[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print_table(rows, ["case", "us", "bitwise", "pct_copy"])


if __name__ == "__main__":
    main()
