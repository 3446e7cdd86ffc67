"""The Triton kernel of the extend's exact new tokens, compiled for sm_90 without a GPU (issue 19).

Runs ``extend_attention`` on the CPU with the Triton launches captured instead of run, then compiles
the captured ``_extend_kernel`` for ``GPUTarget("cuda", 90, 32)`` as the GPU runs it behind the CUDA
prefix phase (``HAS_INIT``: this kernel takes only the exact new tokens), once per query / key dtype.
Prints per dtype and route (16-bit inputs on the fp32 ``ieee`` dots: what main's kernel does with
them): the tensor-core instructions in its PTX, its SASS size, registers and stack (spills),
from the cubin (nvdisasm, cuobjdump: PATH, CUDA_HOME or Triton's copies). ``NEW_TC`` is the route
a GPU takes for that dtype (bf16 included: on the CPU the launcher keeps bf16 on fp32 dots, because
the interpreter's bf16 dots are not the hardware's; the compile here is the GPU's). Code size, not
executed instructions, and this machine's Triton, not necessarily the GPU machine's.

    python benchmarks/sass_triton_extend.py [--tokens 64] [--hq 32] [--hkv 8]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

_DT = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.int8: "i8", torch.int32: "i32",
       torch.int64: "i64", torch.uint8: "u8", torch.int16: "i16", torch.float64: "fp64"}


def arg_type(v) -> str:
    """Triton's signature type of one captured launch argument."""
    if isinstance(v, torch.Tensor):
        return "*" + _DT[v.dtype]
    if isinstance(v, bool):
        return "i1"
    if isinstance(v, int):
        return "i64" if abs(v) >= 2**31 else "i32"
    if isinstance(v, float):
        return "fp32"
    raise TypeError(f"launch argument of type {type(v).__name__}")


def captured_launch(dtype: torch.dtype, *, tokens: int, hq: int, hkv: int) -> tuple[dict, dict]:
    """The arguments of the ``_extend_kernel`` launch an extend of ``tokens`` new tokens (no prefix)
    with q and keys in ``dtype`` makes (name -> value), and its launch options."""
    import witcert.kernels.extend as ke
    from cases import make_layer, random_kv
    from witcert.config import CertConfig

    seen = {}

    class Capture:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *a, **kw: seen.setdefault(self.name, (a, kw))

    from triton.runtime.jit import JITFunction
    kernels = {n: f for n, f in vars(ke).items() if isinstance(f, JITFunction)}
    for n in kernels:  # every launch in extend.py captured: nothing runs
        setattr(ke, n, Capture(n))
    try:
        gen = torch.Generator().manual_seed(0)
        d = 128
        layer = make_layer(hkv=hkv, d=d, num_slots=8, gen=gen, device="cpu")
        kn, vn = random_kv(tokens, hkv, d, gen=gen, device="cpu", dtype=dtype)
        q = torch.randn(tokens, hq, d, generator=gen).to(dtype)
        try:
            ke.extend_attention(q, kn, vn, layer, torch.zeros(0, dtype=torch.int64), sm_scale=d ** -0.5,
                                cert=CertConfig())
        except Exception:  # noqa: BLE001 (the launches did not run: what follows them may fail)
            if "_extend_kernel" not in seen:
                raise
    finally:
        for n, f in kernels.items():
            setattr(ke, n, f)
    a, kw = seen["_extend_kernel"]
    fn = kernels["_extend_kernel"]
    values = dict(zip(fn.arg_names, a)) | {k: v for k, v in kw.items() if k in fn.arg_names}
    return values, {k: kw[k] for k in ("num_warps", "num_stages") if k in kw}


def compile_for_sm90(values: dict, options: dict, *, new_tc: bool):
    """triton.compile of ``_extend_kernel`` with these arguments, HAS_INIT and NEW_TC set."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from witcert.kernels.extend import _extend_kernel as fn
    constexpr = {p.name for p in fn.params if p.is_constexpr}
    signature = {n: "constexpr" if n in constexpr else arg_type(values[n]) for n in fn.arg_names}
    consts = {n: values[n] for n in fn.arg_names if n in constexpr} | {"HAS_INIT": True, "NEW_TC": new_tc}
    return triton.compile(ASTSource(fn=fn, signature=signature, constexprs=consts),
                          target=GPUTarget("cuda", 90, 32), options=options)


def main() -> None:
    from sass_philox import find_tool

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--hq", type=int, default=32)
    ap.add_argument("--hkv", type=int, default=8)
    args = ap.parse_args()
    print("| q and keys | route | tensor-core instructions (PTX) | SASS instructions | registers | stack (bytes) |")
    print("|---|---|---|---|---|---|")
    for dtype, new_tc in ((torch.float32, False), (torch.float16, False), (torch.float16, True),
                          (torch.bfloat16, False), (torch.bfloat16, True)):
        values, options = captured_launch(dtype, tokens=args.tokens, hq=args.hq, hkv=args.hkv)
        k = compile_for_sm90(values, options, new_tc=new_tc)
        mma = {}
        for m in re.findall(r"\b((?:wg)?mma\.[\w.]+)", k.asm["ptx"]):
            mma[m] = mma.get(m, 0) + 1
        with tempfile.TemporaryDirectory() as tmp:
            cubin = Path(tmp) / "k.cubin"
            cubin.write_bytes(k.asm["cubin"])
            sass = subprocess.run([find_tool("nvdisasm"), "-c", str(cubin)], capture_output=True, text=True,
                                  check=True).stdout
            res = subprocess.run([find_tool("cuobjdump"), "--dump-resource-usage", str(cubin)], capture_output=True,
                                 text=True, check=True).stdout
        n = len(re.findall(r"/\*[0-9a-f]{4,}\*/\s+\S", sass))
        regs, stack = re.search(r"REG:(\d+)", res).group(1), re.search(r"STACK:(\d+)", res).group(1)
        forms = ", ".join(f"{m.split('.row.col.')[-1]} x{c}" for m, c in sorted(mma.items()))
        route = "tensor cores" if new_tc else "fp32 ieee"
        print(f"| {_DT[dtype]} | {route} | {forms} | {n} | {regs} | {stack} |")


if __name__ == "__main__":
    main()
