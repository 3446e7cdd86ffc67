"""Extend (chunked prefill over a compressed prefix) with a certificate per new token vs torch
SDPA fp16, on one GPU.

For each (prefix, new tokens) shape, D 128, Hq 32, Hkv 8 (and a GQA-7 shape): the extend at its
default plan (the prefix phase in the CUDA kernel extend.cu) and with the Triton kernel alone
(certificate on and off; Triton plan variants) against ``F.scaled_dot_product_attention`` in
fp16 on the same exact prefix + new tokens with the bottom-right causal mask, timed in the
same run (``triton.testing.do_bench`` medians). Ratios > 1: faster than SDPA.
Usage: python benchmarks/bench_extend.py [--quick] [--queued] [--out FILE] [--variants] [--plans 32,32,8 16,32,4]
       [--auto-plans 64,32,8] [--cuda-regs 168 128] [--cuda-warps 8] [--cuda-tiles 64]
       [--shapes 0,1] [--prev OLD_EXTEND_PY] [--cuda-prev OLD_EXTEND_CU [MORE_CU ...]]
       [--workspace-mib 64 4096] [--prefix-splits 1 4] [--no-triton]
``--plans`` times Triton-only tile variants, ``--auto-plans`` the tiles of the Triton kernel that runs
the exact new tokens behind the CUDA prefix phase (the default impl). ``--cuda-prev`` times earlier
extend.cu files (e.g. ``git show REV:witcert/kernels/cuda/extend.cu``,
built through the same launcher with the current common.cuh, or the measurement-only variants of
``floor_variants.py``, which bring their own) at the default plan and at each ``--cuda-warps``, same
run. ``--cuda-tiles`` times the package's CUDA prefix phase built with other prefix tiles
(``ExtendPlan.cuda_tile``) at 4 warps and at each ``--cuda-warps``. ``--workspace-mib`` times the
CUDA prefix phase under other workspace caps (a prefix past the cap runs in chunks), ``--prefix-splits``
with the prefix split across that many CTAs (1: not split; the default plan splits small grids).
``--queued`` adds each cell's GPU and host microseconds per call (``queued_us``), the ratio of the
GPU times against SDPA's, and which pace the cell's median read: ``gpu``, or ``host`` where the
host's launches set it (``table_lines``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton.testing

from witcert.config import CertConfig, QuantConfig
from witcert.kernels.extend import extend_attention
from witcert.kernels.plan import ExtendPlan
from witcert.kernels.write import write_kv_

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from cases import make_layer  # noqa: E402  (the tests' shared case generator)

D = 128
SHAPES = [  # (Np, T, Hq, Hkv)
    (4096, 512, 32, 8),
    (32768, 512, 32, 8),
    (4096, 2048, 32, 8),
    (32768, 512, 28, 4),
    (131072, 512, 32, 8),  # its one-pass workspace (768 MiB) passes the default cap: 3 chunks
    (32768, 16, 32, 8),  # a short turn: one CTA per KV head (8 CTAs), the prefix walked by each
    (32768, 128, 32, 8),  # ExtendPlan.prefix_build: 64 CTAs at 4 warps (32-token tiles), 32 at 8
    (32768, 256, 32, 8),  # 128 CTAs at 4 warps (the last grid below 132 SMs), 64 at 8
    (4096, 16, 32, 8),  # a short turn over a short prefix (ExtendPlan.split_count: 8 CTAs, 128 tiles)
]


def bench_us(fn) -> float:
    """Median microseconds of fn, after 100 ms of warm-up calls (the first call may build a library
    or compile a Triton kernel). The first witcert cell of a run that builds the library can still
    read 1.3-1.4x slow (BENCHMARKS.md 13ae, 13af: with 5 ms or 100 ms of warm-up alike): take the
    table from a second run."""
    fn()
    torch.cuda.synchronize()
    return 1e3 * triton.testing.do_bench(fn, warmup=100, rep=40, return_mode="median")


def queued_us(fn, n: int = 20) -> tuple[float, float]:
    """(GPU, host) microseconds per call of fn with the host's launches kept off the GPU's time: a
    sleep kernel of about 30 ms holds the stream while the host enqueues ``n`` calls between two
    events, so the events time the calls' kernels back to back (GPU) and the clock on the host the
    launches alone (host). Where the median of ``bench_us`` is well above the GPU figure, the host's
    launches, not the kernels, set the pace."""
    fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu, host = [], []
    for _ in range(3):
        torch.cuda._sleep(60_000_000)  # cycles: about 30 ms at 2 GHz
        e0.record()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        e1.record()
        torch.cuda.synchronize()
        gpu.append(1e3 * e0.elapsed_time(e1) / n)
        host.append(1e6 * (t1 - t0) / n)
    return sorted(gpu)[1], sorted(host)[1]


def queued_row(fn) -> dict:
    """``queued_us`` as a table row's two fields (``gpu_us``, ``host_us``)."""
    g, h = queued_us(fn)
    return dict(gpu_us=round(g, 1), host_us=round(h, 1))


HOST_BOUND = 1.15  # a cell whose median is this much above its queued GPU time read the host's pace


def table_lines(rows: list[dict], *, queued: bool) -> list[str]:
    """The printed table of ``rows`` (shape, variant, us, x_sdpa; with ``queued`` also gpu_us, host_us).
    With ``queued``, two more columns: ``x SDPA GPU``, the ratio of the queued GPU times (the shape's
    SDPA row against the cell: what the kernels alone give), and ``read``, ``host`` where the cell's
    median is more than HOST_BOUND times its GPU time (the launches set its pace, e.g. BENCHMARKS.md
    13ay's run 1), else ``gpu``."""
    w = max(len(r["variant"]) for r in rows)
    more = f" {'GPU us':>8s} {'host us':>8s} {'x SDPA GPU':>10s} {'read':>5s}" if queued else ""
    out = [f"{'shape':28s} {'variant':{w}s} {'us':>10s} {'x SDPA':>8s}{more}"]
    sdpa_gpu = {r["shape"]: r.get("gpu_us") for r in rows if r["variant"].startswith("sdpa")}
    for r in rows:
        more = ""
        if queued:
            g, base = r.get("gpu_us"), sdpa_gpu.get(r["shape"])
            ok = isinstance(g, (int, float)) and g > 0 and isinstance(r["us"], (int, float))
            ratio = round(base / g, 3) if ok and isinstance(base, (int, float)) else ""
            read = ("host" if r["us"] > HOST_BOUND * g else "gpu") if ok else ""
            more = f" {str(g or ''):>8s} {str(r.get('host_us', '')):>8s} {str(ratio):>10s} {read:>5s}"
        out.append(f"{r['shape']:28s} {r['variant']:{w}s} {str(r['us']):>10s} {str(r['x_sdpa']):>8s}{more}")
    return out


def build(np_, T, hq, hkv, bits, gen):
    layer = make_layer(hkv=hkv, d=D, num_slots=np_ + 16, bits=bits, device="cuda",
                       gen=torch.Generator().manual_seed(bits))
    slots = torch.randperm(np_ + 16, device="cuda", generator=gen)[:np_]
    chan = torch.exp(torch.randn(1, hkv, D, device="cuda", generator=gen))
    kp = (torch.randn(np_, hkv, D, device="cuda", generator=gen) * chan).half()
    vp = torch.randn(np_, hkv, D, device="cuda", generator=gen).half()
    for i in range(0, np_, 1 << 15):
        write_kv_(layer, kp[i:i + (1 << 15)], vp[i:i + (1 << 15)], slots=slots[i:i + (1 << 15)])
    kn = (torch.randn(T, hkv, D, device="cuda", generator=gen) * chan).half()
    vn = torch.randn(T, hkv, D, device="cuda", generator=gen).half()
    q = torch.randn(T, hq, D, device="cuda", generator=gen).half()
    return layer, slots, q, kn, vn, kp, vp


def main() -> None:
    from torch.nn.attention.bias import causal_lower_right

    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="the first shape only")
    ap.add_argument("--prev", default=None,
                    help="a file holding an older witcert/kernels/extend.py, timed in the same run")
    ap.add_argument("--shapes", default=None, help="indices into SHAPES to run, e.g. 0,1 (default: all)")
    ap.add_argument("--variants", action="store_true", help="also time tile / warp variants")
    ap.add_argument("--plans", nargs="*", default=None,
                    help="tile / warp variants to time, each block_m,block_n,warps (replaces --variants' list)")
    ap.add_argument("--auto-plans", nargs="*", default=[],
                    help="tiles of the Triton kernel behind the CUDA prefix phase (the default impl), each "
                         "block_m,block_n,warps")
    ap.add_argument("--bits", type=int, default=QuantConfig.dither_bits)
    ap.add_argument("--cuda-regs", type=int, nargs="*", default=[],
                    help="also time the CUDA prefix kernel with these register caps (e.g. 168 128)")
    ap.add_argument("--cuda-warps", type=int, nargs="*", default=[],
                    help="also time the CUDA prefix kernel with these warps per CTA (4, 8)")
    ap.add_argument("--cuda-tiles", type=int, nargs="*", default=[],
                    help="also time the CUDA prefix phase with these prefix tiles (ExtendPlan.cuda_tile)")
    ap.add_argument("--cuda-prev", nargs="+", default=[],
                    help="earlier (or measurement-only) extend.cu files, each timed in the same run")
    ap.add_argument("--workspace-mib", type=int, nargs="*", default=[],
                    help="also time the CUDA prefix phase with these workspace caps (MiB; default plan: 256)")
    ap.add_argument("--prefix-splits", type=int, nargs="*", default=[],
                    help="also time the CUDA prefix phase with these prefix splits (ExtendPlan.prefix_splits; 1: none)")
    ap.add_argument("--no-triton", action="store_true", help="leave out the Triton kernel alone (a shorter run)")
    ap.add_argument("--queued", action="store_true",
                    help="also each cell's GPU and host microseconds per call (queued_us: the launches off the GPU's time)")
    ap.add_argument("--radii", nargs="+", default=["min"], choices=("min", "det", "prob"),
                    help="the radii timed with the certificate on (default min, the default certificate's; "
                         "its cells read 'cert on', the others 'cert det' / 'cert prob')")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    # the default (the CUDA prefix phase where it serves the shape) and the Triton kernel alone
    plans = {"default": ExtendPlan()} if args.no_triton else {"default": ExtendPlan(), "triton": ExtendPlan(impl="triton")}
    for r in args.cuda_regs:
        plans[f"cuda r{r}"] = ExtendPlan(impl="cuda", max_registers=r)
    for w in args.cuda_warps:
        plans[f"cuda w{w}"] = ExtendPlan(impl="cuda", cuda_warps=w)
    for t in args.cuda_tiles:
        for w in [4, *args.cuda_warps]:
            plans[f"cuda t{t} w{w}"] = ExtendPlan(impl="cuda", cuda_tile=t, cuda_warps=w)
    for n in args.prefix_splits:
        plans[f"cuda s{n}"] = ExtendPlan(impl="cuda", prefix_splits=n)
    for mib in args.workspace_mib:
        plans[f"cuda ws{mib}MiB"] = ExtendPlan(impl="cuda", workspace_mib=mib)
    fns = {"": extend_attention}
    if args.cuda_prev:
        from witcert.kernels import cuda as wc_cuda
    for i, src in enumerate(args.cuda_prev):
        def prev_cuda(*a, _src=Path(src), **kw):
            with wc_cuda.built_from(_src):
                return extend_attention(*a, **kw)

        # a measurement-only variant (floor_variants.py: DIR/NAME/extend.cu) is named by its folder
        tag = f"cuda {Path(src).parent.name} " if Path(src).name == "extend.cu" \
            else ("cuda-prev " if i == 0 else f"cuda-prev{i} ")
        fns[tag] = prev_cuda
    if args.prev:  # e.g. git show REV:witcert/kernels/extend.py > old_extend.py
        spec = importlib.util.spec_from_file_location("witcert_prev_extend", args.prev)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        fns["prev "] = mod.extend_attention
    extra = args.plans if args.plans is not None else (["64,32,4", "64,64,4", "16,32,4"] if args.variants else [])
    for v in extra:
        bm, bn, w = (int(x) for x in v.split(","))
        plans[f"m{bm} n{bn} w{w}"] = ExtendPlan(impl="triton", block_m=bm, block_n=bn, num_warps=w)
    for v in args.auto_plans:
        bm, bn, w = (int(x) for x in v.split(","))
        plans[f"auto m{bm} n{bn} w{w}"] = ExtendPlan(block_m=bm, block_n=bn, num_warps=w)
    shapes = SHAPES[:1] if args.quick else SHAPES
    if args.shapes:
        shapes = [SHAPES[int(i)] for i in args.shapes.split(",")]
    for np_, T, hq, hkv in shapes:
        shape = f"Np{np_} T{T} Hq{hq} Hkv{hkv}"
        layer, slots, q, kn, vn, kp, vp = build(np_, T, hq, hkv, args.bits, gen)
        qq = q.transpose(0, 1)[None]  # [1, Hq, T, D]
        kk = torch.cat([kp, kn]).transpose(0, 1)[None]
        vv = torch.cat([vp, vn]).transpose(0, 1)[None]
        mask = causal_lower_right(T, np_ + T)
        def sdpa_call():
            return F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, enable_gqa=True)

        sdpa = bench_us(sdpa_call)
        rows.append(dict(shape=shape, variant="sdpa fp16 (causal lower right)", us=round(sdpa, 1), x_sdpa=1.0))
        if args.queued:
            rows[-1].update(queued_row(sdpa_call))
        print(rows[-1], flush=True)
        for (tag, fn), (name, plan) in ((f, p) for f in fns.items() for p in plans.items()):
            if tag and name != "default" and not name.startswith("cuda w"):
                continue  # the previous kernel at its default plan and the --cuda-warps plans only
            for cert in [CertConfig(radius=r) for r in args.radii] + [None]:
                on = "off" if cert is None else "on" if cert.radius == "min" else cert.radius
                label = f"witcert {tag}b{args.bits} {name} cert {on}"
                def call(fn=fn, cert=cert, plan=plan):
                    return fn(q, kn, vn, layer, slots, sm_scale=D ** -0.5, cert=cert, delta_loc=1e-9, plan=plan)

                try:
                    us = bench_us(call)
                except Exception as e:  # noqa: BLE001  (a variant that does not compile is reported)
                    rows.append(dict(shape=shape, variant=label, us="ERR", x_sdpa=repr(e)[:100]))
                    print(rows[-1], flush=True)
                    continue
                rows.append(dict(shape=shape, variant=label, us=round(us, 1), x_sdpa=round(sdpa / us, 3)))
                if args.queued:
                    rows[-1].update(queued_row(call))
                print(rows[-1], flush=True)
    if args.out:
        with open(args.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print("\n".join(table_lines(rows, queued=args.queued)))


if __name__ == "__main__":
    main()
