"""Time measurement-only variants of witcert/kernels/extend.py (files given on the command line,
each loaded as its own module) at one extend shape, certificate on (and off for the first), in one
run, with each variant's Triton kernel's registers and spills. Used by scripts/gpu_call70.sh.

    python scripts/gpu_extend_variants.py --shape 4096,2048,32,8 A.py B.py ...
"""
import argparse
import importlib.util
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_extend import D, bench_us, build  # noqa: E402

from witcert.config import CertConfig  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--shape", default="4096,2048,32,8")
ap.add_argument("files", nargs="+")
args = ap.parse_args()
np_, T, hq, hkv = (int(x) for x in args.shape.split(","))
layer, slots, q, kn, vn, _, _ = build(np_, T, hq, hkv, 16, torch.Generator(device="cuda").manual_seed(0))
mods = {}
for f in args.files:
    spec = importlib.util.spec_from_file_location(f"ext_{Path(f).stem}", f)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    mods[Path(f).stem] = m
res = {}
for rnd in range(3):
    for name, m in mods.items():
        for on in ((True, False) if name == next(iter(mods)) else (True,)):
            cert = CertConfig(radius="min") if on else None
            us = bench_us(lambda: m.extend_attention(q, kn, vn, layer, slots, sm_scale=D ** -0.5, cert=cert,
                                                    delta_loc=1e-9))
            res.setdefault((name, on), []).append(us)
for name, m in mods.items():
    regs = []
    try:
        for cache in m._extend_kernel.device_caches.values():
            for k in cache[0].values():
                k._init_handles()
                regs.append((k.n_regs, k.n_spills, k.metadata.num_warps))
    except Exception as e:  # noqa: BLE001  (the cache's layout is Triton's own)
        regs = [repr(e)[:80]]
    for on in (True, False):
        if (name, on) in res:
            r = sorted(res[(name, on)])
            print(f"{args.shape} {name:10s} cert {'on ' if on else 'off'} median of 3 medians {r[1]:9.1f} us  "
                  f"(regs, spills, warps) {regs}")
