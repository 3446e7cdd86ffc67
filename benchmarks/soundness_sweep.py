"""Adversarial soundness sweep: every path's certificates against the exact TV.

For each path (``ref``: the reference on every token-granular compressor and radius;
``native``: the C path; ``triton`` and ``cuda``: the GPU decode kernels, the interpreter for
``triton`` on a CPU; ``triton_extend``: the tensor-core extend, one sequence's compressed
prefix plus exact new tokens, tests/soundness_extend_cases.py (``triton_extend_fp16`` /
``triton_extend_bf16``: its queries and new tokens in that type, so their q.k on tensor cores;
bf16's falls back to fp32 dots under the interpreter); ``native_extend``: the C
extend the same way, its default fp32 dots, on pools without outlier bypass;
``native_extend_bf16``: the same with bf16 operands and enough new tokens for its bf16-pair
dots, where the CPU has AVX512-BF16) and each family
of adversarial inputs (docs/PROOFS.md section 5.6),
it writes the exact keys into a pool, decodes with the path, takes the logits the path
used, and checks ``0 <= cert``, ``cert`` never NaN, and ``cert >= TV(p, p_used)`` with
``p = softmax(sm q.k)`` of the exact keys, computed exactly (tests/fpexact.py). Counts every
(sequence, query head) certificate; prints a table; exits 1 on any violation.

Usage: python benchmarks/soundness_sweep.py --paths ref native [--cases 100000] [--max-seconds S] [--out FILE]
(paths: ref, native, triton, cuda, triton_extend, triton_extend_fp16, triton_extend_bf16, native_extend,
native_extend_bf16)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

if any(a.startswith("triton") for a in sys.argv) and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from soundness_cases import FAMILIES, check_case, configs  # noqa: E402
from soundness_extend_cases import check_extend_case  # noqa: E402

def sweep(path: str, *, cases: int, device, gen, max_seconds: float = float("inf")) -> dict:
    """Sweeps until ``cases`` certificates were checked or ``max_seconds`` passed (then the
    table says how many were checked: ``certs``)."""
    t0 = time.time()
    stats = dict(path=path, certs=0, violations=0, nan=0, negative=0, inf=0, nan_out=0, worst_ratio=0.0)
    shape = dict(B=64, N=24, hq=4, hkv=2, D=64) if device == "cpu" else dict(B=256, N=40, hq=8, hkv=2, D=128)
    cfgs = configs("triton" if path.startswith("triton_extend") else path)
    if path in ("native_extend", "native_extend_bf16"):  # the C extend: pools without bypass
        cfgs = [(q, c) for q, c in configs("native") if not q.outliers]
    i = 0
    while stats["certs"] < cases and time.time() - t0 < max_seconds:
        fam = FAMILIES[i % len(FAMILIES)]
        quant, cert = cfgs[(i // len(FAMILIES)) % len(cfgs)]
        i += 1
        if fam == "massive_bypass" and (path in ("native_extend", "native_extend_bf16") or (
                not quant.outliers and path != "ref" and not path.startswith("triton_extend"))):
            continue
        if path.startswith("triton_extend"):  # _fp16 / _bf16: q and the new tokens in that type
            st = check_extend_case(path.replace("_extend", ""), fam, quant, cert, gen=gen, device=device,
                                   **(dict(n_prefix=12, T=5, hq=4, hkv=2, D=64) if device == "cpu"
                                      else dict(n_prefix=100, T=40, hq=8, hkv=2, D=128)))
        elif path == "native_extend_bf16":  # bf16 operands, 3 work items: the bf16-pair dots
            st = check_extend_case("native_bf16", fam, quant, cert, gen=gen, n_prefix=12, T=40,
                                   hq=8, hkv=1, D=64)
        elif path == "native_extend":
            st = check_extend_case("native", fam, quant, cert, gen=gen, n_prefix=12, T=5, hq=4,
                                   hkv=2, D=64)
        else:
            st = check_case(path, fam, quant, cert, gen=gen, device=device, **shape)
        for key in ("certs", "violations", "nan", "negative", "inf", "nan_out"):
            stats[key] += st[key]
        stats["worst_ratio"] = max(stats["worst_ratio"], st["worst_ratio"])
        if st["violations"]:
            print(f"  VIOLATION {path} {fam} {quant.method} b{quant.dither_bits} {cert.radius}: {st['examples']}",
                  flush=True)
    return stats


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--paths", nargs="+", default=["ref", "native"],
                    choices=["ref", "native", "triton", "cuda", "triton_extend", "triton_extend_fp16",
                             "triton_extend_bf16", "native_extend", "native_extend_bf16"])
    ap.add_argument("--cases", type=int, default=100_000, help="certificates per path (at least)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-seconds", type=float, default=float("inf"),
                    help="stop each path after this long and report the certificates checked so far")
    args = ap.parse_args()
    rows = []
    for path in args.paths:
        gpu_path = path in ("triton", "cuda") or path.startswith("triton_extend")
        device = "cuda" if gpu_path and torch.cuda.is_available() else "cpu"
        t0 = time.time()
        st = sweep(path, cases=args.cases, device=device, gen=torch.Generator().manual_seed(args.seed),
                   max_seconds=args.max_seconds)
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
