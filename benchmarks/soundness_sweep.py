"""Adversarial soundness sweep: every path's certificates against the exact TV.

For each path (``ref``: the reference on every token-granular compressor and radius;
``native``: the C path; ``triton`` and ``cuda``: the GPU kernels, the interpreter for
``triton`` on a CPU) and each family of adversarial inputs (docs/PROOFS.md section 5.6),
it writes the exact keys into a pool, decodes with the path, takes the logits the path
used, and checks ``0 <= cert``, ``cert`` never NaN, and ``cert >= TV(p, p_used)`` with
``p = softmax(sm q.k)`` of the exact keys, computed exactly (tests/fpexact.py). Counts every
(sequence, query head) certificate; prints a table; exits 1 on any violation.

Usage: python benchmarks/soundness_sweep.py --paths ref native [--cases 100000] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

if "triton" in sys.argv and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import fpexact  # noqa: E402

from witcert.config import CertConfig, QuantConfig  # noqa: E402
from witcert.ref import attention as ref_attn  # noqa: E402
from witcert.ref.logits import logits_f32  # noqa: E402
from witcert.ref.pool import LayerKV, gather, write_  # noqa: E402
from witcert.ref.types import K_SIDE  # noqa: E402

FAMILIES = ("normal", "huge_logits", "rounding_edge", "tiny_q", "huge_q", "peaked_long",
            "massive_bypass", "fp16_edge_scales", "overflow")


def family_case(name: str, *, B: int, N: int, hq: int, hkv: int, D: int, gen: torch.Generator):
    """Exact k, v [B, N, Hkv, D] (fp16 or fp32 values), q f32 [B, Hq, D], sm_scale."""
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    k = r(B, N, hkv, D)
    v = r(B, N, hkv, D)
    q = r(B, hq, D)
    sm = D ** -0.5
    if name == "huge_logits":  # logits 1e3 .. 1e9 (a legal query: det holds for every query)
        mag = 10.0 ** (3 + 6 * torch.rand(B, 1, 1, generator=gen))
        q = q * mag
        k = k * 8.0
    elif name == "rounding_edge":  # keys on a coarse grid: tiny errors, witnesses near their norm
        k = torch.round(k * 4) / 4
        q = q * 10.0 ** (1 + 4 * torch.rand(B, 1, 1, generator=gen))
    elif name == "tiny_q":
        q = q * 10.0 ** (-7 - 13 * torch.rand(B, 1, 1, generator=gen))
    elif name == "huge_q":  # |q_c| ~ 1e20 on a few channels
        q = q * 1e-3
        q[:, :, :4] = 1e20 * torch.sign(r(B, hq, 4))
    elif name == "peaked_long":  # one token dominates (large gap), long context
        k[:, 7] = k[:, 7] * 20
        q = q * 3
    elif name == "massive_bypass":  # fp16-exact 60000 in channel 0 (bypassed when outliers are on)
        k[:, :, :, 0] = 60000.0 * torch.sign(r(B, N, hkv))
        q[:, :, 0] = 1.0
    elif name == "fp16_edge_scales":  # values near fp16's max and min normal
        k = k * torch.where(torch.rand(B, 1, 1, 1, generator=gen) < 0.5, 6e4 / 4.0, 2.0**-14)
    elif name == "overflow":  # finite query whose logits overflow fp32
        q = q * 1e35
    return k.to(torch.float16).float(), v.to(torch.float16).float(), q, sm


def make_pool(quant: QuantConfig, *, B: int, N: int, hkv: int, D: int, device, writer):
    pages = B * N
    epochs = torch.zeros(pages, dtype=torch.int64, device=device)
    outl = None
    if quant.outliers:
        outl = torch.stack([torch.arange(2 * quant.outliers) for _ in range(hkv)]).to(device)
    layer = LayerKV.allocate(num_slots=pages, num_kv_heads=hkv, head_dim=D, quant=quant, layer=1,
                             seed=1234567, epochs=epochs, device=device, k_outlier_idx=outl,
                             v_outlier_idx=outl)
    return layer


def run_path(path, layer, q, bt, sl, *, sm, cert, dl):
    """(cert [B, Hq], used logits [B, Hq, N] f64, out [B, Hq, D])."""
    dbg = {}
    if path == "ref":
        res = ref_attn.decode_attention(q, layer, bt, sl, page_size=1, sm_scale=sm, cert=cert, delta_loc=dl)
        B, hq = q.shape[:2]
        used = torch.full((B, hq, bt.shape[1]), float("nan"), dtype=torch.float64)
        for b in range(B):
            slots = bt[b, :int(sl[b])].long()
            kh, _ = gather(layer, K_SIDE, slots)
            kbad = ~torch.isfinite(gather(layer, K_SIDE, slots)[1]["wit"].float()).all(-1)
            kh = torch.where(kbad[..., None] | ~torch.isfinite(kh), 0.0, kh)
            kvh = torch.arange(hq) // (hq // layer.num_kv_heads)
            qb = torch.where(torch.isfinite(q[b]), q[b], 0.0)
            l, _, _ = logits_f32(qb, kh[:, kvh].transpose(0, 1), sm_scale=sm)
            used[b, :, :l.shape[-1]] = l.double()
        return res.cert, used, res.out
    if path == "native":
        from witcert.native.decode import decode_attention_full
        out, _, c, _ = decode_attention_full(q, layer, bt, sl, page_size=1, sm_scale=sm, radius=cert.radius,
                                             delta_loc=torch.full((q.shape[0],), dl, dtype=torch.float64),
                                             debug=dbg)
        return c, dbg["logits"], out
    from witcert.kernels.decode import decode_attention
    from witcert.kernels.plan import decode_plan
    plan = decode_plan("cuda:0" if q.is_cuda else "cpu").replace(impl="cuda" if path == "cuda" else "triton")
    res = decode_attention(q, layer, bt, sl, page_size=1, sm_scale=sm, cert=cert, delta_loc=dl, num_splits=None,
                           plan=plan, debug=dbg)
    return res.cert, dbg["logits"].double(), res.out


def configs(path):
    """(QuantConfig, CertConfig) pairs a path serves."""
    out = []
    for bits in (8, 16):
        for radius in ("det", "prob", "min"):
            out.append((QuantConfig(dither_bits=bits, seed=7), CertConfig(radius=radius)))
    if path in ("ref", "triton", "native"):
        out.append((QuantConfig(outliers=2, seed=7), CertConfig(radius="min")))
    if path == "ref":
        for m in ("rtn8", "rtn4", "sr8", "fp8", "fp8_scaled", "fp16"):
            out.append((QuantConfig(method=m, seed=7), CertConfig(radius="det")))
    return out


def sweep(path: str, *, cases: int, device, gen) -> dict:
    from witcert import backend
    stats = dict(path=path, certs=0, violations=0, nan=0, negative=0, inf=0, nan_out=0, worst_ratio=0.0)
    B, N, hq, hkv, D = (64, 24, 4, 2, 64) if device == "cpu" else (256, 40, 8, 2, 128)
    cfgs = configs(path)
    i = 0
    while stats["certs"] < cases:
        fam = FAMILIES[i % len(FAMILIES)]
        quant, cert = cfgs[(i // len(FAMILIES)) % len(cfgs)]
        i += 1
        if fam == "massive_bypass" and not quant.outliers and path != "ref":
            continue
        n = N * 4 if fam == "peaked_long" else N
        k, v, q, sm = family_case(fam, B=B, N=n, hq=hq, hkv=hkv, D=D, gen=gen)
        layer = make_pool(quant, B=B, N=n, hkv=hkv, D=D, device=device, writer=None)
        bt = torch.arange(B * n, dtype=torch.int32).view(B, n)
        sl = torch.randint(1, n + 1, (B,), generator=gen, dtype=torch.int32)
        slots = bt.reshape(-1).long()
        kk, vv = k.reshape(-1, hkv, D), v.reshape(-1, hkv, D)
        if device == "cpu":
            write_(layer, kk, vv, slots=slots)
        else:
            backend.write_kv_(layer, kk.to(device), vv.to(device), slots=slots.to(device))
        c, used, out = run_path(path, layer, q.to(device), bt.to(device), sl.to(device), sm=sm, cert=cert,
                                dl=1e-6)
        c = c.double()
        used = used.to(c.device)
        if used.shape[-1] < n:  # a path's debug logits stop at the longest sequence
            used = torch.nn.functional.pad(used, (0, n - used.shape[-1]), value=float("nan"))
        kvh = torch.arange(hq) // (hq // hkv)
        tok = torch.arange(n)
        mask = (tok[None, :] < sl[:, None]).to(c.device)[:, None, :].expand(B, hq, n)
        qf = torch.where(torch.isfinite(q), q, 0.0).to(c.device)
        kx = k[:, :, kvh].permute(0, 2, 1, 3).to(c.device)  # [B, Hq, N, D]
        fin_k = torch.isfinite(kx).all(-1) | ~mask  # exact keys finite where attended
        z = fpexact.exact_shifted_logits(qf, torch.where(torch.isfinite(kx), kx, 0.0), sm_scale=sm, mask=mask)
        u = torch.where(mask, used[:, :, :n], torch.full_like(used[:, :, :n], float("-inf")))
        tv = fpexact.tv(z, u, c, mask=mask)
        no_exact = ~fin_k.all(-1)  # an attended exact key is inf/NaN: only +inf is a valid answer
        ok = torch.where(no_exact, torch.isposinf(c), c >= tv)
        stats["certs"] += B * hq
        stats["nan"] += int(torch.isnan(c).sum())
        stats["negative"] += int((c < 0).sum())
        stats["inf"] += int(torch.isinf(c).sum())
        stats["violations"] += int((~ok).sum())
        fin = torch.isfinite(c) & (c > 0) & ~no_exact
        if fin.any():
            stats["worst_ratio"] = max(stats["worst_ratio"], float((tv[fin] / c[fin]).max()))
        if (~ok).any():
            print(f"  VIOLATION {path} {fam} {quant.method} b{quant.dither_bits} {cert.radius}: "
                  f"cert {c[~ok][:4].tolist()} tv {tv[~ok][:4].tolist()}", flush=True)
        stats["nan_out"] += int(torch.isnan(out).sum())
    return stats


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--paths", nargs="+", default=["ref", "native"],
                    choices=["ref", "native", "triton", "cuda"])
    ap.add_argument("--cases", type=int, default=100_000, help="certificates per path (at least)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rows = []
    for path in args.paths:
        device = "cuda" if path in ("triton", "cuda") and torch.cuda.is_available() else "cpu"
        t0 = time.time()
        st = sweep(path, cases=args.cases, device=device, gen=torch.Generator().manual_seed(args.seed))
        st["seconds"] = round(time.time() - t0, 1)
        st["device"] = torch.cuda.get_device_name() if device == "cuda" else "cpu"
        rows.append(st)
        print(st, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    print(f"{'path':8s} {'device':22s} {'certs':>8s} {'viol':>5s} {'NaN':>4s} {'neg':>4s} {'+inf':>6s} "
          f"{'NaN out':>7s} {'max TV/cert':>11s} {'s':>7s}")
    for r in rows:
        print(f"{r['path']:8s} {r['device'][:22]:22s} {r['certs']:8d} {r['violations']:5d} {r['nan']:4d} "
              f"{r['negative']:4d} {r['inf']:6d} {r['nan_out']:7d} {r['worst_ratio']:11.4f} {r['seconds']:7.1f}")
    return 1 if any(r["violations"] or r["nan"] or r["negative"] or r["nan_out"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
