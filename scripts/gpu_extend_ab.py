"""Bitwise A/B of the CUDA extend's prefix kernel against an earlier version of its source (GPU only).

Usage: python scripts/gpu_extend_ab.py OLD/extend.cu [N] [--warps W] [--old-warps W2] [--chunked]
(the common.cuh beside OLD is built with it; N: only the first N cases, e.g. for a negative control
against a deliberately changed source; W: the package's kernel at W warps a CTA,
ExtendPlan.cuda_warps, against the old one at W2 (default 4): a row's values do not depend on the
rows a CTA holds (on branch i19-pairs, 8 builds K / V warp pairs); --chunked: the package's kernel
on the prefix in chunks of two tiles, ExtendPlan.prefix_chunk 64, bitwise one pass)

A change that keeps every value's operations and their order (e.g. where in the tile loop the next
tile's copies are issued, BENCHMARKS.md 13r) must give the same bits: out, lse, cert and,
with the debug outputs (the kernel's other instance), the logits and radii it used. Cases: GQA 1 / 4
/ 8, b 8 / 16, groups of 32 / 64, prefixes of one token to several tiles and chunks, the
certificate's three radius modes and off, queries scaled so that radii fall on both sides of 1/16
(the two branches of expm1_up), a flagged prefix token, a NaN query entry. Prints one line per case
and the share of radii at or above 1/16; exits 1 on any difference.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from cases import make_layer  # noqa: E402
from gpu_decode_ab import bits_of  # noqa: E402  (the decode's A/B, beside this script)

from witcert.config import CertConfig  # noqa: E402
from witcert.kernels import cuda as wc_cuda  # noqa: E402
from witcert.kernels.extend import extend_attention  # noqa: E402
from witcert.kernels.plan import ExtendPlan  # noqa: E402
from witcert.kernels.write import write_kv_  # noqa: E402

D = 128


def equal(x, y) -> bool:
    return (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))


def run(src, args, cert, debug, warps=4, chunk=0):
    """The outputs' bits with the kernel built from ``src`` (None: the package's extend.cu) at
    ``warps`` warps a CTA (and the prefix in chunks of ``chunk`` tokens, 0: from the workspace cap)."""
    q, kn, vn, layer, slots = args
    with wc_cuda.built_from(src) if src else contextlib.nullcontext():
        dbg = {} if debug else None
        o = extend_attention(q, kn, vn, layer, slots, sm_scale=D ** -0.5, cert=cert, delta_loc=1e-6,
                             debug=dbg, plan=ExtendPlan(impl="cuda", cuda_warps=warps, prefix_chunk=chunk))
        torch.cuda.synchronize()
        if dbg is not None and dbg.get("impl") != "cuda":
            raise SystemExit(f"the CUDA prefix kernel did not run: {dbg.get('impl')}")
        dbg = dbg or {}
        return ([bits_of(o.out), bits_of(o.lse), bits_of(o.cert), bits_of(dbg.get("logits")),
                 bits_of(dbg.get("radius"))], dbg.get("radius"))


FIELDS = ("out", "lse", "cert", "logits", "radius")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path)
    ap.add_argument("n", type=int, nargs="?")
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--old-warps", type=int, default=4)
    ap.add_argument("--chunked", action="store_true")
    opt = ap.parse_args()
    old, warps, chunk = opt.old, opt.warps, 64 if opt.chunked else 0
    gen = torch.Generator(device="cuda").manual_seed(11)
    bad = n = 0
    big = total = 0
    # (hq, hkv, bits, group, prefix, new tokens, query scale)
    # three library configurations (QGP 4 at b 16 and 8, QGP 8 with groups of 64): each is built twice
    cases = [(4, 1, 16, 32, 1, 5, 1.0), (32, 8, 16, 32, 300, 40, 30.0), (32, 8, 8, 32, 1000, 17, 30.0),
             (16, 2, 16, 64, 77, 33, 30.0), (4, 1, 8, 32, 2100, 16, 3.0), (8, 8, 16, 32, 65, 130, 100.0),
             (16, 2, 16, 64, 513, 9, 10.0)]
    cases = cases[: opt.n] if opt.n is not None else cases
    for i, (hq, hkv, bits, group, np_, T, qs) in enumerate(cases):
        layer = make_layer(hkv=hkv, d=D, num_slots=np_ + 64, bits=bits, group=group, device="cuda",
                           gen=torch.Generator().manual_seed(i))
        slots = torch.randperm(np_ + 64, device="cuda", generator=gen)[:np_]
        chan = torch.exp(torch.randn(1, hkv, D, device="cuda", generator=gen))
        k = (torch.randn(np_, hkv, D, device="cuda", generator=gen) * chan).half()
        v = (torch.randn(np_, hkv, D, device="cuda", generator=gen) * chan).half()
        if i % 3 == 1 and np_ > 20:
            k[np_ // 2, 0, 3] = float("inf")  # a flagged prefix token
        write_kv_(layer, k, v, slots=slots)
        q = torch.randn(T, hq, D, device="cuda", generator=gen) * qs
        if i % 4 == 2:
            q[-1, -1, 9] = float("nan")
        q = q.half() if i % 2 else q
        kn = (torch.randn(T, hkv, D, device="cuda", generator=gen) * chan).to(q.dtype)
        vn = torch.randn(T, hkv, D, device="cuda", generator=gen).to(q.dtype)
        args = (q, kn, vn, layer, slots)
        for cert in (CertConfig(radius="min"), CertConfig(radius="det"), CertConfig(radius="prob"),
                     CertConfig(enabled=False)):
            for debug in (False, True):
                (a, rad) = run(None, args, cert, debug, warps, chunk)
                (b_, _) = run(old, args, cert, debug, opt.old_warps)
                diff = [f for f, x, y in zip(FIELDS, a, b_) if not equal(x, y)]
                if rad is not None:
                    r = rad[:, :, :np_].float()
                    r = r[torch.isfinite(r) & (r > 0)]
                    big += int((r >= 0.0625).sum())
                    total += r.numel()
                n += 1
                bad += bool(diff)
                print(f"GQA {hq // hkv} hkv {hkv} b{bits} G{group} prefix {np_} new {T} q x{qs} radius "
                      f"{cert.radius if cert.enabled else 'off'} {'debug' if debug else 'plain'}: "
                      f"{'DIFFERENT ' + ','.join(diff) if diff else 'same bits'}",
                      flush=True)
    print(f"{n - bad} of {n} cases bitwise equal in {','.join(FIELDS)}; prefix radii >= 1/16: {big} of {total}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
