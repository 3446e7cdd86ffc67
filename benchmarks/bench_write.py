"""Write kernels (quantize + dither + witness + store K and V, one launch) vs device copy:
the CUDA kernel (write.cu, the default where it serves the pool) and the Triton kernel.

GB/s counts bytes read (fp16 K and V, slots, epochs) plus bytes stored (codes, scales,
witnesses, outliers); the ratio is to a device-to-device copy measured in the same run
(also read + written). Usage: python benchmarks/bench_write.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json

import torch

from bench_decode import bench_us, copy_bandwidth, kv_like, make_layer, print_table

from witcert.kernels.write import write_kv_

HKV, D = 8, 128


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    copy_bps = copy_bandwidth()
    rows = [dict(case="device copy 1 GiB", GBps=round(copy_bps / 1e9), pct_copy=100)]
    cases = [(16, 16, 0, 8, 2, impl) for impl in ("cuda", "triton")] + \
        [(4096, 16, 0, 8, 2, impl) for impl in ("cuda", "triton")] + \
        [(65536, 16, 0, 8, 2, impl) for impl in ("cuda", "triton")] + \
        [(65536, 8, 0, 8, 2, impl) for impl in ("cuda", "triton")] + \
        [(65536, 16, 0, 16, 4, "triton"), (65536, 24, 0, 8, 2, "triton"), (65536, 16, 4, 8, 2, "triton")]
    for T, bits, m, br, nw, impl in cases:
        num_slots = 2 * T
        layer = make_layer(hkv=HKV, d=D, num_slots=num_slots, bits=bits, outliers=m, device="cuda",
                           gen=torch.Generator().manual_seed(T))
        k = kv_like(T, HKV, D, gen=gen)
        v = kv_like(T, HKV, D, gen=gen)
        slots = torch.randperm(num_slots, device="cuda", generator=gen)[:T]
        us = bench_us(lambda: write_kv_(layer, k, v, slots=slots, block_rows=br, num_warps=nw, impl=impl))
        ng = D // 32
        stored = 2 * T * HKV * (D + 2 * ng * 2 + 2 * m * 2)
        read = 2 * T * HKV * D * 2 + T * 16
        tiles = "" if impl == "cuda" else f" rows={br} warps={nw}"
        rows.append(dict(case=f"{impl} T={T} Hkv{HKV} D{D} b{bits} m{m}{tiles}", us=round(us, 1),
                         GBps=round((read + stored) / us * 1e-3),
                         stored_GBps=round(stored / us * 1e-3),
                         pct_copy=round(100 * (read + stored) / (us * 1e-6) / copy_bps)))
        print(rows[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print_table(rows, ["case", "us", "GBps", "stored_GBps", "pct_copy"])


if __name__ == "__main__":
    main()
