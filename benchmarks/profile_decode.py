"""Run the decode kernel a few times on one shape, for a profiler (Nsight Compute) to attach.

    ncu --kernel-name regex:_decode_split --launch-skip 2 --launch-count 1 \
        python benchmarks/profile_decode.py --shape 16,32,8,4096 --bits 8

No timing here: the profiler measures. Shapes as in bench_decode.py (B, Hq, Hkv, S), D 128.
``--src OLD.cu`` runs the CUDA kernel built from another version of decode.cu (same launcher).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from bench_decode import D, build
from witcert.config import CertConfig
from witcert.kernels import cuda as wc_cuda
from witcert.kernels.decode import decode_attention


def profiler_parser(*, shape: str, bits: int, reps: int, kernel: str) -> argparse.ArgumentParser:
    """The options of the profiling scripts (this one and profile_extend.py): shape, dither bits,
    certificate on / off, calls, and another source of the CUDA kernel (``kernel``: its file)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default=shape)
    ap.add_argument("--bits", type=int, default=bits)
    ap.add_argument("--cert", choices=["on", "off"], default="on")
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--src", default=None, help=f"another {kernel} to build the CUDA kernel from")
    return ap


def use_src(src: str | None) -> None:
    """Build the CUDA kernel of ``src`` (same launcher; its file name says which: decode.cu,
    extend.cu or write.cu) from now on, the other kernels from the shipped sources; None: all shipped."""
    if not src:
        return
    path, shipped = Path(src), wc_cuda.library
    if path.stem not in ("decode", "extend", "write"):
        raise SystemExit(f"--src {src}: the file must be named decode.cu, extend.cu or write.cu")

    def library(**kw):
        return shipped(**(kw | {"src": path} if kw.get("kind", "decode") == path.stem else kw))
    wc_cuda.library = library


def main() -> None:
    args = profiler_parser(shape="16,32,8,4096", bits=8, reps=4, kernel="decode.cu").parse_args()
    use_src(args.src)
    B, hq, hkv, S = (int(x) for x in args.shape.split(","))
    gen = torch.Generator(device="cuda").manual_seed(0)
    layer, q, bt, sl, _, _ = build(B, hq, hkv, S, 16, args.bits, gen)
    cert = CertConfig(enabled=args.cert == "on")
    for _ in range(args.reps):
        decode_attention(q, layer, bt, sl, page_size=16, sm_scale=D ** -0.5, cert=cert, delta_loc=1e-9,
                         num_splits=None)
    torch.cuda.synchronize()
    print("done", args)


if __name__ == "__main__":
    main()
