"""Bitwise A/B of the CUDA decode kernel against an earlier version of its source (GPU only).

Usage: python scripts/gpu_decode_ab.py OLD_decode.cu

A restructure that keeps every value's operations and their order (e.g. the K / V warp pairs
of BENCHMARKS.md 4m) must give the same bits: out, lse, cert, vbound, radius and the logits the
kernel used, on ragged lengths (1 token, a partial tile, several splits), GQA 1-8, b 8 / 16,
groups of 32 / 64 / 128, every radius mode, the certificate off, position-keyed dither, and
non-finite inputs (an inf scale, a NaN / huge query). Prints one line per case and exits 1 on
any difference.

``--only out,lse,logits``: compare those outputs bitwise (a change to the radius's arithmetic
alone must leave them equal; ``vbound`` is ``2 min(cert, 1) vmax + ...`` and moves with the
certificate) and print the largest relative change of the certificate, the radius and the value bound (finite
entries) and of the output (its largest change over its largest entry).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from cases import make_layer  # noqa: E402

from witcert.config import CertConfig  # noqa: E402
from witcert.kernels import cuda as wc_cuda  # noqa: E402
from witcert.kernels.decode import decode_attention  # noqa: E402
from witcert.kernels.plan import decode_plan  # noqa: E402
from witcert.kernels.write import write_kv_  # noqa: E402

D, P = 128, 16


def bits_of(x):
    return None if x is None else x.contiguous().view(torch.int32)


def run(src, layer, q, bt, sl, cert, plan):
    """The outputs' bits with the kernel built from ``src`` (None: the package's decode.cu)."""
    with wc_cuda.built_from(src) if src else contextlib.nullcontext():
        dbg = {}
        o = decode_attention(q, layer, bt, sl, page_size=P, sm_scale=D ** -0.5, cert=cert, delta_loc=1e-6,
                             num_splits=None, return_radius=cert.enabled, plan=plan, debug=dbg)
        torch.cuda.synchronize()
        return [bits_of(o.out), bits_of(o.lse), bits_of(o.cert), bits_of(o.vbound), bits_of(o.radius),
                bits_of(dbg.get("logits"))]


FIELDS = ("out", "lse", "cert", "vbound", "radius", "logits")


def main() -> int:
    old = Path(sys.argv[1])
    only = sys.argv[3].split(",") if len(sys.argv) > 3 and sys.argv[2] == "--only" else list(FIELDS)
    if not set(only) <= set(FIELDS):
        raise SystemExit(f"--only: {only} must be among {FIELDS}")
    worst = {"cert": 0.0, "radius": 0.0, "vbound": 0.0, "out": 0.0}  # out: max |diff| / max |old|
    gen = torch.Generator(device="cuda").manual_seed(7)
    bad = n = 0
    # (hq, hkv, bits, group): every library configuration class (QGP 1 / 2 / 4 / 8, packed and
    # not, groups of 32 / 64 / 128, b 8 / 16) without building all 24
    cases = [(4, 1, 16, 32), (4, 1, 8, 32), (8, 2, 16, 64), (7, 1, 16, 32), (7, 1, 8, 64), (2, 1, 16, 128),
             (1, 1, 8, 32), (32, 8, 16, 32), (28, 4, 8, 32), (8, 1, 16, 32), (4, 1, 16, 128), (8, 1, 8, 64)]
    for i, (hq, hkv, bits, group) in enumerate(cases):
        lens = [1, 15, 17, 300, 2100, 5000][: 3 + i % 4]
        B = len(lens)
        pages = max(lens) // P + 1
        layer = make_layer(hkv=hkv, d=D, num_slots=B * pages * P, bits=bits, group=group, device="cuda",
                           gen=torch.Generator().manual_seed(i))
        if i % 3 == 1:  # position-keyed dither: the counter's first word from a positions table
            layer = dataclasses.replace(layer, positions=torch.randint(
                0, 2**31, (B * pages * P,), device="cuda", generator=gen, dtype=torch.int64))
        bt = torch.randperm(B * pages, device="cuda", generator=gen).to(torch.int32).view(B, pages)
        chan = torch.exp(torch.randn(1, hkv, D, device="cuda", generator=gen))
        for b, L in enumerate(lens):
            t = torch.arange(L, device="cuda")
            slots = bt[b, t // P].long() * P + t % P
            k = (torch.randn(L, hkv, D, device="cuda", generator=gen) * chan).half()
            v = (torch.randn(L, hkv, D, device="cuda", generator=gen) * chan).half()
            if i % 4 == 2 and L > 20:
                k[L // 2, 0, 3] = float("inf")  # a flagged token (inf scale)
            write_kv_(layer, k, v, slots=slots)
        q = torch.randn(B, hq, D, device="cuda", generator=gen)
        if i % 5 == 3:
            q[0, 0, 5] = 3e38  # a huge query row
        if i % 7 == 4:
            q[-1, -1, 9] = float("nan")
        q = q.to(torch.bfloat16) if i % 2 else q
        sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
        plan = dataclasses.replace(decode_plan("cuda"), impl="cuda")
        for cert in (CertConfig(radius="min"), CertConfig(radius="det"), CertConfig(radius="prob"),
                     CertConfig(enabled=False)):
            a, b_ = run(None, layer, q, bt, sl, cert, plan), run(old, layer, q, bt, sl, cert, plan)
            same = all((x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
                       for f, x, y in zip(FIELDS, a, b_) if f in only)
            for f in worst:
                x, y = a[FIELDS.index(f)], b_[FIELDS.index(f)]
                if x is not None and y is not None:
                    x, y = x.view(torch.float32).double(), y.view(torch.float32).double()
                    fin = torch.isfinite(x) & torch.isfinite(y) & (y.abs() > 0)
                    if fin.any() and f == "out":
                        worst[f] = max(worst[f], ((x - y)[fin].abs().max() / y[fin].abs().max()).item())
                    elif fin.any():
                        worst[f] = max(worst[f], ((x - y).abs() / y.abs())[fin].max().item())
            n += 1
            bad += not same
            print(f"GQA {hq // hkv} hkv {hkv} b{bits} G{group} lens {lens} radius "
                  f"{cert.radius if cert.enabled else 'off'}: {'same bits' if same else 'DIFFERENT'}", flush=True)
    print(f"{n - bad} of {n} cases bitwise equal in {','.join(only)}; largest relative change: "
          + ", ".join(f"{k} {v:.3g}" for k, v in worst.items()))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
