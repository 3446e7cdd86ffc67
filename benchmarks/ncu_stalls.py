"""Where a kernel's tile loop waits: Nsight Compute's warp stall samples per SASS instruction.

Reads the source page of one profiled launch, exported as CSV (``ncu -i REP --page source --csv
--print-source sass``, from a report collected with ``--section SourceCounters``; plain or
gzipped), finds the tile loop (``sass_tile_loop.loop_span``: the shortest backward branch whose
body holds every instruction matching ``--anchor``, default the integer MMAs) and prints: the
loop's share of all samples, its samples by stall reason, by opcode (with the instruction count)
and the instructions with the most samples, each with its two largest reasons. Samples, not time:
a sample is one warp's state at one sampled cycle, so the shares are where warps spend their
cycles.

    python benchmarks/ncu_stalls.py reports/gpu-2026-12-05g/call87/prefix_sass.csv.gz [--top 25]
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip

from sass_tile_loop import loop_span

ALL = "Warp Stall Sampling (All Samples)"


def read(path: str) -> tuple[dict[str, int], list[list[str]]]:
    """The header's column index and the instruction rows of the CSV's first kernel."""
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        rows = list(csv.reader(f))
    hdr = next(r for r in rows if "Address" in r and "Source" in r)
    col = {h: i for i, h in enumerate(hdr)}
    return col, [r for r in rows[rows.index(hdr) + 1:] if len(r) == len(hdr) and r[0].startswith("0x")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--anchor", default=r"IMMA", help="a regex every loop-body instruction class has")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    col, rows = read(args.csv)
    reasons = [h for h in col if h.startswith("stall_") and "Not Issued" not in h]

    def n(r, h=ALL):
        return int(r[col[h]] or 0)

    i, j = loop_span([(int(r[0], 16), r[1]) for r in rows], args.anchor)
    body = rows[i: j + 1]
    tot, lt = sum(n(r) for r in rows), sum(n(r) for r in body)
    print(f"{len(rows)} instructions, {tot} samples; the loop: {len(body)} instructions, {lt} samples "
          f"({lt / tot:.1%})")
    by = collections.Counter({h[6:]: sum(n(r, h) for r in body) for h in reasons})
    print("by reason: " + ", ".join(f"{k} {v / lt:.1%}" for k, v in by.most_common(12) if v))
    ops, cnt = collections.Counter(), collections.Counter()
    for r in body:
        words = r[1].split()
        op = (words[1] if words[0].startswith("@") else words[0]).split(".")[0]
        ops[op] += n(r)
        cnt[op] += 1
    print("by opcode (samples, instructions): "
          + ", ".join(f"{k} {v / lt:.1%} ({cnt[k]})" for k, v in ops.most_common(16)))
    print("| samples | share | instruction | largest reasons |\n|---|---|---|---|")
    for r in sorted(body, key=n, reverse=True)[: args.top]:
        top = sorted(((n(r, h), h[6:]) for h in reasons), reverse=True)[:2]
        print(f"| {n(r)} | {n(r) / lt:.1%} | `{r[1].strip()[:64]}` | "
              + ", ".join(f"{k} {v}" for v, k in top if v) + " |")


if __name__ == "__main__":
    main()
