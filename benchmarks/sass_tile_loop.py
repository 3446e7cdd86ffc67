"""The static size of the CUDA extend's tile loop, no GPU needed (issue 19).

Compiles ``extend.cu`` (the package's, and any other versions given, each with the ``common.cuh`` next
to it) for sm_90 at one configuration, disassembles the prefix kernel without its optional outputs at
the minimum radius (``wc_extend_prefix<false, 2>``, the instance a default call runs;
``wc_extend_prefix<false>`` in a source from before the radius mode was a template parameter) and counts
the instructions of its tile loop: the shortest backward branch whose body holds every integer mma
(sass_cuda.py's build). Printed per source: the loop's instruction count, its count per (row, token)
value a thread holds (TN / 2 per tile), how many of them are a rare path (rare_span: the redo of a
tile's certificate terms) and the opcodes with the most instructions. Code, not executed instructions:
each instruction of the loop runs once per 32-token tile (a branch's both sides are counted).

    python benchmarks/sass_tile_loop.py [OTHER/extend.cu ...] [--qgp 4] [--group 32] [--bits 16] [--rounds 10]
        [--warps 8 --tile 64]   (the build a plan picks where the grid fills the GPU)
    python benchmarks/sass_tile_loop.py --decode [OTHER/decode.cu ...] [--bits 8] ...   (the decode's K and V loops)
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

from sass_cuda import CUDA_DIR, build

_INS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_BRA = re.compile(r"\bBRA\b.*?(\.L_x_\d+)")


def prefix_sass(src: Path, defines: list[str], kernel: str = "extend",
                function: str = r"wc_extend_prefixILb0E(?:Li2E)?Ev") -> list[tuple[int, str]]:
    """(address, instruction text) of one function (a regex of its mangled name; default
    wc_extend_prefix<false, 2>, or <false> in an older source) built from src (sass_cuda.build's
    nvdisasm listing); a branch's target label is replaced by its address."""
    listing, _ = build(kernel, defines, src=src)
    out, labels, inside, pending = [], {}, False, []
    for ln in listing.split("\n"):
        if ".section" in ln and ".text" in ln:
            inside = re.search(function, ln) is not None
            continue
        m = _LABEL.match(ln)
        if inside and m:
            pending.append(m.group(1))
            continue
        m = _INS.search(ln)
        if inside and m:
            addr = int(m.group(1), 16)
            labels.update((lb, addr) for lb in pending)
            pending = []
            out.append((addr, m.group(2)))
    return [(a, _BRA.sub(lambda m: f"BRA 0x{labels[m.group(1)]:x}", t) if _BRA.search(t) else t) for a, t in out]


def loop_span(ins: list[tuple[int, str]], anchor: str = r"IMMA") -> tuple[int, int]:
    """Indices (first, last) into ``ins`` ((address, text) in address order, a branch's target
    as ``BRA 0x...``) of the shortest backward branch's body that holds every instruction
    matching ``anchor`` (a regex; default the integer MMAs). ncu_stalls.py finds the same loop
    in Nsight Compute's source page."""
    hits = [i for i, (_, t) in enumerate(ins) if re.search(anchor, t)]
    if not hits:
        raise SystemExit(f"no instruction matches {anchor!r}")
    index = {a: i for i, (a, _) in enumerate(ins)}
    best = None
    for i, (_, t) in enumerate(ins):
        m = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", t)
        j = index.get(int(m.group(1), 16)) if m else None
        if j is not None and j <= min(hits) and i >= max(hits) and (best is None or i - j < best[1] - best[0]):
            best = (j, i)
    if best is None:
        raise SystemExit("no backward branch encloses the anchors")
    return best


def tile_loop(ins: list[tuple[int, str]]) -> list[str]:
    """The instructions of the shortest backward branch's body that holds every MMA (integer or
    fp16: a measurement-only variant may have no integer dots)."""
    i, j = loop_span(ins, r"IMMA|HMMA\.16816")
    return [t for _, t in ins[i: j + 1]]


def rare_span(loop: list[tuple[int, str]]) -> int:
    """Instructions of the tile loop's rare path ((address, text) of the loop, in order): the block the
    first branch on a ``VOTE.ANY``'s predicate jumps over where it holds an exp (the prefix kernel's
    redo of a tile's certificate terms by the exp route, where a radius of the tile is above 1; not the
    accumulators' rescale, which the other vote skips); 0 where the loop has none. The loop's common
    path is its length less this."""
    for k, (_, t) in enumerate(loop):
        v = re.match(r"VOTE\.ANY (P\d)", t)
        if not v:
            continue
        for j in range(k + 1, len(loop)):  # the first branch on the vote's predicate
            m = re.match(rf"@!?{v.group(1)} BRA 0x([0-9a-f]+)", loop[j][1])
            if m:
                block = [u for a, u in loop[j + 1:] if a < int(m.group(1), 16)]
                if any("MUFU.EX2" in u for u in block):  # the exp route's redo (not the accumulators' rescale)
                    return len(block)
                break
    return 0


def decode_loops(src: Path, defines: list[str]) -> dict[str, list[str]]:
    """The CUDA decode's two tile loops (wc_decode_split): the K side's (the shortest backward branch
    around every integer mma: logits, softmax, certificate terms, one 16-token tile) and the V
    side's (around every fp16 mma: the V dither and p.v). With K / V warp pairs they are two warps'
    loops; the one-warp build runs both in one loop (then both spans are that loop)."""
    ins = prefix_sass(src, defines, kernel="decode", function="wc_decode_split")
    out = {}
    for side, anchor in (("K", r"IMMA"), ("V", r"HMMA\.16816")):
        i, j = loop_span(ins, anchor)
        out[side] = [t for _, t in ins[i: j + 1]]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sources", nargs="*", help="other extend.cu (or decode.cu, --decode) files, each with its "
                    "common.cuh beside it")
    ap.add_argument("--decode", action="store_true", help="the decode's K and V tile loops instead")
    ap.add_argument("--qgp", type=int, default=4)
    ap.add_argument("--group", type=int, default=32)
    ap.add_argument("--bits", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--warps", type=int, default=0, help="the extend's WC_NW (0: the source's default)")
    ap.add_argument("--tile", type=int, default=0, help="the extend's WC_TN (0: the source's default)")
    args = ap.parse_args()
    defines = [f"-DWC_QGP={args.qgp}", f"-DWC_G={args.group}", f"-DWC_BITS={args.bits}", f"-DWC_ROUNDS={args.rounds}"]
    defines += [f"-DWC_NW={args.warps}"] * bool(args.warps) + [f"-DWC_TN={args.tile}"] * bool(args.tile)
    if args.decode:
        print(f"the decode's tile loops (wc_decode_split, sm_90, {' '.join(defines)}), instructions per 16-token tile")
        print("| source | K loop | V loop | largest opcodes (K; V) |")
        print("|---|---|---|---|")
        for src in [CUDA_DIR / "decode.cu", *map(Path, args.sources)]:
            loops = decode_loops(src.resolve(), defines)
            tops = []
            for side in "KV":
                ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in loops[side])
                tops.append(", ".join(f"{k} {v}" for k, v in ops.most_common(5)))
            print(f"| {src} | {len(loops['K'])} | {len(loops['V'])} | {tops[0]}; {tops[1]} |")
        return
    print(f"the prefix kernel's tile loop (wc_extend_prefix<false, 2>, sm_90, {' '.join(defines)})")
    print("| source | tokens a tile | instructions per tile | per (row, token) value | of them a rare path "
          "| largest opcodes |")
    print("|---|---|---|---|---|---|")
    for src in [CUDA_DIR / "extend.cu", *map(Path, args.sources)]:
        ins = prefix_sass(src.resolve(), defines)
        i, j = loop_span(ins, r"IMMA|HMMA\.16816")
        body, rare = [t for _, t in ins[i: j + 1]], rare_span(ins[i: j + 1])
        ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in body)
        top = ", ".join(f"{k} {v}" for k, v in ops.most_common(8))
        # a lane holds TN / 2 values a tile
        tn = args.tile or int(re.search(r"#define WC_TN (\d+)", src.read_text()).group(1))
        print(f"| {src} | {tn} | {len(body)} | {len(body) / (tn // 2):.1f} | {rare} | {top} |")


if __name__ == "__main__":
    main()
