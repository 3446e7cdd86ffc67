"""Decode kernel plans (tiles, warps, stages) and a previous version of the kernel, timed
against torch SDPA fp16 in the same run (CUDA-graph medians; 8-bit dither, 10 rounds).

Usage: python benchmarks/bench_decode_plans.py [--prev MODULE_FILE] [--plans 64,4,2 128,8,2 64,4,2,168]
       [--out FILE]
``--prev`` names a file holding an older ``_decode_split_kernel`` / ``_decode_merge_kernel``
pair (e.g. ``git show REV:witcert/kernels/decode.py > old.py``), timed through the same
launcher for a same-run before/after. A plan is ``block_n,warps,stages[,max_registers]``.
"""

from __future__ import annotations

import argparse
import importlib.util

import torch
import torch.nn.functional as F

from bench_decode import D, SHAPES, bench_us, build, finish

from witcert.config import CertConfig
from witcert.kernels.decode import decode_attention
from witcert.kernels.launch import decode_launch
from witcert.kernels.plan import decode_plan


def load_prev(path: str):
    spec = importlib.util.spec_from_file_location("witcert_prev_decode", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod._decode_split_kernel, mod._decode_merge_kernel


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prev", default=None)
    ap.add_argument("--plans", nargs="*", default=["64,4,2", "64,4,3", "32,4,2", "128,8,2", "64,8,2"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    base = decode_plan("cuda:0")
    prev = load_prev(args.prev) if args.prev else None
    on, off = CertConfig(), CertConfig(enabled=False)
    rows = []
    for B, hq, hkv, S in SHAPES:
        shape = f"B{B} Hq{hq} Hkv{hkv} S{S}"
        layer, q, bt, sl, kk, vv = build(B, hq, hkv, S, 16, 8, gen)
        qq = q.to(torch.float16)[:, :, None]
        sdpa = bench_us(lambda: F.scaled_dot_product_attention(qq, kk, vv, enable_gqa=True))
        rows.append(dict(shape=shape, variant="sdpa fp16", us=round(sdpa, 1), x_sdpa=1.0))
        kw = dict(page_size=16, sm_scale=D ** -0.5, delta_loc=1e-9, num_splits=None)

        def timed(name, fn):
            try:
                us = bench_us(fn)
                rows.append(dict(shape=shape, variant=name, us=round(us, 1), x_sdpa=round(sdpa / us, 3)))
            except Exception as e:  # noqa: BLE001  (a plan that does not compile is reported)
                rows.append(dict(shape=shape, variant=name, us="ERR", x_sdpa=repr(e)[:60]))
            print(rows[-1], flush=True)

        for cert, tag in ((on, "on"), (off, "off")):
            timed(f"default cert {tag}", lambda: decode_attention(q, layer, bt, sl, cert=cert, plan=base, **kw))
            if prev:
                timed(f"prev cert {tag}", lambda: decode_launch(
                    q, layer, bt, sl, cert=cert, plan=base, return_radius=False, debug=None,
                    split_kernel=prev[0], merge_kernel=prev[1], **kw))
        for p in args.plans:
            bn, w, st, *reg = (int(x) for x in p.split(","))
            plan = base.replace(block_n=bn, num_warps=w, num_stages=st, max_registers=reg[0] if reg else 0)
            timed(f"bn{bn} w{w} s{st}{f' r{reg[0]}' if reg else ''} cert on", lambda: decode_attention(q, layer, bt, sl, cert=on, plan=plan, **kw))
    finish(rows, ["shape", "variant", "us", "x_sdpa"], out=args.out)


if __name__ == "__main__":
    main()
