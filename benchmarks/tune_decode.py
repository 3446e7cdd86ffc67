"""Tuning sweep of the decode kernel on one GPU: tile, warps, q.k chunking, FMA vs tl.dot.

For each variant: registers and spills of the split kernel, median microseconds (CUDA
graph replay), the ratio to torch SDPA fp16 measured in the same run, and the largest
difference of out / cert to the reference decode (same splits) on the same pool.
Usage: python benchmarks/tune_decode.py [--shape B,Hq,Hkv,S] [--grid fma|dot,full|chunk,BN,W]
[--out FILE]; ``--grid`` (repeatable) replaces the default grid (the launcher default
is always timed first).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from bench_decode import D, bench_us, build, print_table
from witcert.config import CertConfig
from witcert.kernels.decode import decode_attention, plan_splits
from witcert.ref import attention as ref_attn

GRID = [  # (fma_dot, chunk_qk, block_n, num_warps): None = the launcher's default
    (None, None, None, None), (True, False, 16, 2), (True, True, 8, 2), (False, True, 16, 4),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", action="append", default=None, help="B,Hq,Hkv,S (repeatable)")
    ap.add_argument("--bits", type=int, default=16)
    ap.add_argument("--grid", action="append", default=None,
                    help="fma|dot,full|chunk,BLOCK_N,num_warps (repeatable; replaces the grid)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    grid = GRID
    if args.grid:
        grid = [(None, None, None, None)]
        for g in args.grid:
            kind, qk, bn, nw = g.split(",")
            assert kind in ("fma", "dot") and qk in ("full", "chunk"), f"bad --grid {g!r}"
            grid.append((kind == "fma", qk == "chunk", int(bn), int(nw)))
    shapes = [tuple(int(x) for x in s.split(",")) for s in (args.shape or ["16,32,8,4096"])]
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for B, hq, hkv, S in shapes:
        page = 16
        layer, q, bt, sl, kk, vv = build(B, hq, hkv, S, page, args.bits, gen)
        qq = q.to(torch.float16)[:, :, None]
        sdpa = bench_us(lambda: F.scaled_dot_product_attention(qq, kk, vv, enable_gqa=True))
        shape = f"B{B} Hq{hq} Hkv{hkv} S{S} b{args.bits}"
        rows.append(dict(shape=shape, variant="sdpa fp16", us=round(sdpa, 1), x_sdpa=1.0))
        splits = plan_splits(S)
        kw = dict(page_size=page, sm_scale=D ** -0.5, delta_loc=1e-9, num_splits=splits)
        ref = ref_attn.decode_attention(q, layer, bt, sl, cert=CertConfig(), **kw)
        for fma, chunk, bn, nw in grid:
            name = ("default" if fma is None else
                    f"{'fma' if fma else 'dot'} {'chunk' if chunk else 'full'} BN{bn} w{nw}")
            for cert in (CertConfig(), CertConfig(enabled=False)):
                info = {}
                try:
                    def run(cert=cert, info=info):
                        return decode_attention(q, layer, bt, sl, cert=cert, block_n=bn, num_warps=nw,
                                                chunk_qk=chunk, fma_dot=fma, _launch_info=info, **kw)
                    res = run()
                    us = bench_us(run)
                except Exception as e:  # noqa: BLE001  (a variant may not compile: report it)
                    rows.append(dict(shape=shape, variant=name, error=f"{type(e).__name__}: {str(e)[:80]}"))
                    print(rows[-1], flush=True)
                    break
                row = dict(shape=shape, variant=name + (" cert" if cert.enabled else " nocert"),
                           us=round(us, 1), x_sdpa=round(sdpa / us, 3), regs=info.get("n_regs"),
                           spills=info.get("n_spills"),
                           d_out=f"{(res.out - ref.out).abs().max().item():.2e}")
                if cert.enabled:
                    row["d_cert_rel"] = f"{((res.cert - ref.cert).abs() / ref.cert.abs().clamp_min(1e-6)).max().item():.2e}"
                rows.append(row)
                print(row, flush=True)
        del layer, kk, vv
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print_table(rows, ["shape", "variant", "us", "x_sdpa", "regs", "spills", "d_out", "d_cert_rel", "error"])


if __name__ == "__main__":
    main()
