"""Compile the Triton decode split kernel for sm_90 on any machine (no GPU needed) and report
registers, spills and the SASS instruction mix: a static view of where the kernel's work goes.

Usage: python benchmarks/sass_decode.py [--qg 4] [--bits 8] [--block-n 64] [--warps 4]
       [--stages 2] [--cert 1] [--dump DIR]
Run it with the Triton version of the GPU machine (e.g. a venv with ``triton==3.6.0``): other
versions compile the same source differently (BENCHMARKS.md 4f). ``--dump`` writes the TTGIR,
PTX and SASS.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

PTR = {"Q": "*bf16", "KCodes": "*i8", "VCodes": "*i8", "KScales": "*fp16", "VScales": "*fp16",
       "KWit": "*fp16", "VWit": "*fp16", "KOutl": "*fp16", "VOutl": "*fp16", "KBypPos": "*i32",
       "VBypPos": "*i32", "Epochs": "*i64", "Positions": "*i64", "BlockTable": "*i32", "SeqLens": "*i32",
       "DeltaLoc": "*fp32"}
DIV16 = {"stride_qb", "stride_qh", "stride_rb", "stride_rh", "stride_bt"}
FLOATS = {"delta_scalar", "sm_scale", "bias_coef", "arith_gamma", "byp_gamma", "arith_abs"}


def compile_kernel(kernel, constexprs: dict, *, warps: int, stages: int):
    sig = {}
    for name in kernel.arg_names:
        if name in constexprs:
            sig[name] = "constexpr"
        elif name in PTR:
            sig[name] = PTR[name]
        elif name[0].isupper():
            sig[name] = "*fp32"
        elif name in FLOATS:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    # as the launcher's JIT specializes them: pointers and the strides that are multiples of 16
    # carry divisibility 16, a unit stride is a constant
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names)
             if sig[n].startswith("*") or n in DIV16}
    src = ASTSource(fn=kernel, signature=sig, attrs=attrs,
                    constexprs={(kernel.arg_names.index(k),): v for k, v in constexprs.items()})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))


def sass_mix(cubin: bytes) -> tuple[collections.Counter, str, str]:
    """(opcode counts, SASS text, resource usage line) of a cubin, with the cuobjdump that
    ships with Triton."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
        res = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    usage = " ".join(m for m in re.findall(r"(REG:\d+|STACK:\d+|SHARED:\d+|LOCAL:\d+)", res))
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m:
            ops[m.group(1)] += 1
    return ops, sass, usage


def loop_body(sass: str) -> collections.Counter:
    """Opcode counts of the longest backward branch's body (the token-tile loop)."""
    ins = [(int(m.group(1), 16), m.group(2).strip()) for m in
           re.finditer(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    best = (0, 0, -1)
    for addr, text in ins:
        if "BRA" in text:
            tgt = re.search(r"0x([0-9a-f]+)", text.split("BRA")[1])
            if tgt and int(tgt.group(1), 16) < addr and addr - int(tgt.group(1), 16) > best[0]:
                best = (addr - int(tgt.group(1), 16), int(tgt.group(1), 16), addr)
    ops = collections.Counter()
    for addr, text in ins:
        if best[1] <= addr <= best[2]:
            ops[re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]] += 1
    return ops


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--qg", type=int, default=4)
    ap.add_argument("--bits", type=int, default=8)
    ap.add_argument("--block-n", type=int, default=64)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--cert", type=int, default=1)
    ap.add_argument("--qdig", type=int, default=3)
    ap.add_argument("--dump", default=None)
    ap.add_argument("--extra", default="", help="k=v,... more constexprs")
    args = ap.parse_args()
    from witcert.kernels.decode import _decode_split_kernel as kern
    D, G = 128, 32
    ng = D // G
    rows = max(16, triton.next_power_of_2(args.qg * ng))
    cx = dict(HQ=args.qg * 8, HKV=8, QG=args.qg, BLOCK_H=rows // ng, NG=ng, ROWS=rows, D=D, G=G, KM2=0, VM2=0,
              P=16, BITS=args.bits, CPC={8: 16, 16: 8, 24: 4}[args.bits], ROUNDS=10, QDIG=args.qdig,
              BLOCK_N=args.block_n, HAS_CERT=bool(args.cert), RADIUS_DET=bool(args.cert),
              RADIUS_PROB=bool(args.cert), RETURN_RADIUS=False, RETURN_LOGITS=False, DELTA_PTR=False,
              HAS_POS=False)
    for kv in filter(None, args.extra.split(",")):
        k, v = kv.split("=")
        cx[k] = int(v)
    cx["stride_qd"] = 1
    cx = {k: v for k, v in cx.items() if k in kern.arg_names}
    ck = compile_kernel(kern, cx, warps=args.warps, stages=args.stages)
    ops, sass, usage = sass_mix(ck.asm["cubin"])
    body = loop_body(sass)
    print(f"{usage}; static SASS instructions {sum(ops.values())}, tile loop body {sum(body.values())}; "
          f"layout conversions in the TTGIR {ck.asm['ttgir'].count('convert_layout')}")
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
        for key in ("ttgir", "ptx"):
            with open(os.path.join(args.dump, f"decode.{key}"), "w") as f:
                f.write(ck.asm[key])
        with open(os.path.join(args.dump, "decode.sass"), "w") as f:
            f.write(sass)
    print("loop body:", ", ".join(f"{op} {n}" for op, n in body.most_common(30)))


if __name__ == "__main__":
    main()
