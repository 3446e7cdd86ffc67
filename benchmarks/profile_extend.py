"""Run the extend a few times on one shape, for a profiler (Nsight Compute) to attach.

    ncu --kernel-name wc_extend_prefix --launch-skip 1 --launch-count 1 \
        python benchmarks/profile_extend.py --shape 4096,512,32,8

No timing here: the profiler measures. Shapes as in bench_extend.py (Np, T, Hq, Hkv), D 128.
``--src FILE.cu`` runs the CUDA prefix kernel built from another extend.cu (same launcher; e.g.
a measurement-only variant of floor_variants.py).
"""

from __future__ import annotations

import torch

from bench_extend import D, build
from profile_decode import profiler_parser, use_src
from witcert.config import CertConfig
from witcert.kernels.extend import extend_attention


def main() -> None:
    ap = profiler_parser(shape="4096,512,32,8", bits=16, reps=3, kernel="extend.cu")
    ap.add_argument("--kernels", action="store_true",
                    help="print each GPU kernel's time over the calls (torch.profiler), no profiler needed")
    args = ap.parse_args()
    use_src(args.src)
    np_, T, hq, hkv = (int(x) for x in args.shape.split(","))
    gen = torch.Generator(device="cuda").manual_seed(0)
    layer, slots, q, kn, vn, _, _ = build(np_, T, hq, hkv, args.bits, gen)
    cert = CertConfig(radius="min") if args.cert == "on" else None
    def run():
        for _ in range(args.reps):
            extend_attention(q, kn, vn, layer, slots, sm_scale=D ** -0.5, cert=cert, delta_loc=1e-9)
        torch.cuda.synchronize()

    if args.kernels:
        run()  # builds and autotuning outside the trace
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run()
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15))
    else:
        run()
    print("done", args)


if __name__ == "__main__":
    main()
