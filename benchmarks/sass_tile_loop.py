"""The static size of the CUDA extend's tile loop, no GPU needed (issue 19).

Compiles ``extend.cu`` (the package's, and any other versions given, each with the ``common.cuh``
next to it) for sm_90 at one configuration, disassembles the prefix kernel without its optional
outputs (``wc_extend_prefix<false>``, the instance a call runs) and counts the instructions of its
tile loop: the shortest backward branch whose body holds every integer mma. Printed per source:
the loop's instruction count, its count per (row, token) value a thread holds (16 per tile), and
the opcodes with the most instructions. Code, not executed instructions: each instruction of the
loop runs once per 32-token tile (a branch's both sides are counted).

    python benchmarks/sass_tile_loop.py [OTHER/extend.cu ...] [--qgp 4] [--group 32] [--bits 16] [--rounds 10]
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import tempfile
from pathlib import Path

from sass_philox import find_tool

CUDA_DIR = Path(__file__).resolve().parent.parent / "witcert" / "kernels" / "cuda"
_INS = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_BRA = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")


def prefix_sass(src: Path, defines: list[str]) -> list[tuple[int, str]]:
    """(address, instruction text) of wc_extend_prefix<false> built from src."""
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        subprocess.run([find_tool("nvcc"), "-O3", "-cubin", "-arch=sm_90", "--std=c++17", f"-I{src.parent}",
                        *defines, str(src), "-o", str(cubin)], check=True, capture_output=True, text=True)
        listing = subprocess.run([find_tool("cuobjdump"), "-sass", str(cubin)],
                                 check=True, capture_output=True, text=True).stdout
    out, inside = [], False
    for ln in listing.split("\n"):
        if "Function :" in ln:
            inside = "wc_extend_prefixILb0" in ln
            continue
        m = _INS.match(ln)
        if inside and m:
            out.append((int(m.group(1), 16), m.group(2)))
    return out


def tile_loop(ins: list[tuple[int, str]]) -> list[str]:
    """The instructions of the shortest backward branch's body that holds every IMMA."""
    imma = [a for a, t in ins if "IMMA" in t]
    lo, hi = min(imma), max(imma)
    best = None
    for a, t in ins:
        m = _BRA.search(t)
        if m:
            tgt = int(m.group(1), 16)
            if tgt <= lo and a >= hi and (best is None or a - tgt < best[1] - best[0]):
                best = (tgt, a)
    return [t for a, t in ins if best[0] <= a <= best[1]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sources", nargs="*", help="other extend.cu files (each with its common.cuh beside it)")
    ap.add_argument("--qgp", type=int, default=4)
    ap.add_argument("--group", type=int, default=32)
    ap.add_argument("--bits", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    defines = [f"-DWC_QGP={args.qgp}", f"-DWC_G={args.group}", f"-DWC_BITS={args.bits}", f"-DWC_ROUNDS={args.rounds}"]
    print(f"the prefix kernel's tile loop (wc_extend_prefix<false>, sm_90, {' '.join(defines)})")
    print("| source | instructions per 32-token tile | per (row, token) value | largest opcodes |")
    print("|---|---|---|---|")
    for src in [CUDA_DIR / "extend.cu", *map(Path, args.sources)]:
        body = tile_loop(prefix_sass(src.resolve(), defines))
        ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in body)
        top = ", ".join(f"{k} {v}" for k, v in ops.most_common(8))
        print(f"| {src} | {len(body)} | {len(body) / 16:.1f} | {top} |")


if __name__ == "__main__":
    main()
