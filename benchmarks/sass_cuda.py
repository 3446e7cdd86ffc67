"""A static map of a CUDA kernel's SASS by source: where its instructions come from, no GPU needed.

Compiles ``witcert/kernels/cuda/decode.cu`` (or ``extend.cu`` / ``write.cu``) for sm_90 with the
package's flags and one configuration's defines (``witcert.kernels.cuda.config_defines``) plus
``-lineinfo``, disassembles it with line information (nvdisasm) and attributes every SASS
instruction to the innermost source line it came from. Lines are grouped into regions: a
function of ``common.cuh`` (Philox, the tensor-core wrappers, the exp bounds, ...) or a lambda of
the kernel file (``k_tile``, ``v_tile``, ...), each by its line range. Printed: registers and
spills (ptxas), the instruction count per region and opcode class, and the source lines with
the most instructions.

This counts code, not executed instructions: a loop body runs once per tile, a rare branch
rarely, and both sides of a branch on a launch argument (a page size that is a power of two or
not) are counted. Nsight Compute on the GPU measures the executed stream (BENCHMARKS.md 4l, 4m); this map
says which source a budget per (token, KV head) has to come from (4t, 4u).

Usage: python benchmarks/sass_cuda.py [--kernel decode] [--qgp 4] [--group 32] [--bits 16]
       [--rounds 10] [--few-ctas] [--top 30] [--dump FILE]
(nvcc on PATH or CUDA_HOME; nvdisasm on PATH, in CUDA_HOME or the one Triton ships.)
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import tempfile
from pathlib import Path

from sass_philox import SASS_OP, find_tool

CUDA_DIR = Path(__file__).resolve().parent.parent / "witcert" / "kernels" / "cuda"

_FUNC = re.compile(r"^(?:template <[^>]*>\s*)?(?:__device__|extern \"C\" __global__|static __device__)[^(]*?(\w+)\s*\(")
_LAMBDA = re.compile(r"^\s*auto (\w+) = \[&\]\(")


def regions(path: Path) -> list[tuple[int, int, str]]:
    """(first line, last line, name) of each function and multi-line lambda in one source file,
    by brace matching from the line that opens it (1-based, innermost first when nested)."""
    lines = path.read_text().split("\n")
    out = []
    for i, line in enumerate(lines):
        m = _FUNC.match(re.sub(r"__launch_bounds__\([^)]*\)", "", line)) or _LAMBDA.match(line)
        if not m:
            continue
        depth, opened = 0, False
        for j in range(i, len(lines)):
            depth += lines[j].count("{") - lines[j].count("}")
            opened = opened or "{" in lines[j]
            if opened and depth <= 0:
                break
        if j > i or _LAMBDA.match(line) is None:
            out.append((i + 1, j + 1, m.group(1)))
    return sorted(out, key=lambda r: r[1] - r[0])  # innermost (shortest) first


def opclass(op: str) -> str:
    base = op.split(".")[0]
    if base in ("HMMA", "IMMA"):
        return "mma"
    if base in ("IMAD", "IADD3", "LOP3", "SHF", "PRMT", "ISETP", "IABS", "IMNMX", "LEA", "VIADD", "SEL", "FLO", "POPC"):
        return "int"
    if base in ("FFMA", "FADD", "FMUL", "FMNMX", "FSETP", "FSEL", "FCHK", "FSWZADD"):
        return "fp32"
    if base in ("HADD2", "HFMA2", "HMUL2", "HSETP2", "HMNMX2"):
        return "fp16"
    if base in ("F2F", "I2F", "F2I", "I2FP", "F2FP", "I2I"):
        return "convert"
    if base in ("DADD", "DMUL", "DFMA", "DSETP"):
        return "fp64"
    if base == "MUFU":
        return "mufu"
    if base in ("LDG", "LDS", "STS", "STG", "LDSM", "LDC", "LDGSTS", "LDL", "STL", "ULDC", "CCTL", "ATOMS", "RED"):
        return "memory"
    if base in ("SHFL",):
        return "shuffle"
    if base in ("BAR", "BRA", "EXIT", "BSSY", "BSYNC", "WARPSYNC", "VOTE", "VOTEU", "CALL", "RET", "DEPBAR", "NANOSLEEP"):
        return "control"
    if base in ("MOV", "S2R", "CS2R", "S2UR", "R2UR", "UMOV", "R2P", "P2R", "PLOP3"):
        return "move"
    return "uniform" if base.startswith("U") else "other"


def build(kernel: str, defines: list[str], src: Path | None = None) -> tuple[str, str]:
    """(nvdisasm's listing with line info, ptxas's resource line) of one build of the package's
    ``kernel``.cu, or of ``src`` (another version, with the common.cuh beside it)."""
    src = src or CUDA_DIR / f"{kernel}.cu"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        res = subprocess.run([find_tool("nvcc"), "-O3", "-cubin", "-lineinfo", "-arch=sm_90", "--std=c++17",
                              f"-I{src.parent}", "-Xptxas", "-v", *defines, str(src), "-o", str(cubin)],
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"sass_cuda: nvcc failed:\n{res.stderr[-3000:]}")
        listing = subprocess.run([find_tool("nvdisasm"), "--print-line-info", "-c", str(cubin)],
                                 check=True, capture_output=True, text=True).stdout
    usage = " ".join(ln.strip() for ln in res.stderr.split("\n") if "registers" in ln or "spill" in ln)
    return listing, usage


def parse(listing: str) -> list[tuple[int, str, str, int]]:
    """(address, opcode, source file name, line) per instruction; the line is the innermost one
    (an instruction of an inlined function is attributed to the function's line)."""
    out, where = [], ("?", 0)
    line_re = re.compile(r'//## File "([^"]+)", line (\d+)')
    ins_re = re.compile(r"/\*([0-9a-f]{4,})\*/\s+" + SASS_OP)
    for ln in listing.split("\n"):
        m = line_re.search(ln)
        if m:
            where = (Path(m.group(1)).name, int(m.group(2)))
            continue
        m = ins_re.search(ln)
        if m and m.group(2) != "NOP":
            out.append((int(m.group(1), 16), m.group(2), where[0], where[1]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", default="decode", choices=["decode", "extend", "write"])
    ap.add_argument("--qgp", type=int, default=4)
    ap.add_argument("--group", type=int, default=32)
    ap.add_argument("--bits", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--few-ctas", action="store_true")
    ap.add_argument("--top", type=int, default=30, help="regions / lines to print")
    ap.add_argument("--dump", default=None, help="write the annotated listing here")
    args = ap.parse_args()
    defines = [f"-DWC_QGP={args.qgp}", f"-DWC_G={args.group}", f"-DWC_BITS={args.bits}",
               f"-DWC_ROUNDS={args.rounds}"] + (["-DWC_FEW_CTAS"] if args.few_ctas else [])
    listing, usage = build(args.kernel, defines)
    if args.dump:
        Path(args.dump).write_text(listing)
    ins = parse(listing)
    regs = {"common.cuh": regions(CUDA_DIR / "common.cuh"), f"{args.kernel}.cu": regions(CUDA_DIR / f"{args.kernel}.cu")}

    def region(fname: str, line: int) -> str:
        for lo, hi, name in regs.get(fname, []):
            if lo <= line <= hi:
                return f"{fname}:{name}"
        return f"{fname}:(line {line})" if fname in regs else fname

    print(f"{args.kernel}.cu {' '.join(defines)}: {usage}")
    print(f"{len(ins)} SASS instructions (no NOPs)")
    by_region = collections.Counter(region(f, ln) for _, _, f, ln in ins)
    by_class = collections.defaultdict(collections.Counter)
    for _, op, f, ln in ins:
        by_class[region(f, ln)][opclass(op)] += 1
    print("\n## instructions per source region (opcode classes)")
    print("| region | instructions | share | classes |")
    print("|---|---|---|---|")
    for name, n in by_region.most_common(args.top):
        cls = ", ".join(f"{c} {k}" for c, k in by_class[name].most_common(6))
        print(f"| {name} | {n} | {n / max(1, len(ins)):.1%} | {cls} |")
    by_line = collections.Counter((f, ln) for _, _, f, ln in ins)
    print("\n## the source lines with the most instructions")
    print("| line | instructions | source |")
    print("|---|---|---|")
    text = {f: (CUDA_DIR / f).read_text().split("\n") for f in regs}
    for (f, ln), n in by_line.most_common(args.top):
        src = text[f][ln - 1].strip()[:90] if f in text and 0 < ln <= len(text[f]) else ""
        print(f"| {f}:{ln} | {n} | `{src}` |")


if __name__ == "__main__":
    main()
