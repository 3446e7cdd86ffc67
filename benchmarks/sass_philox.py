"""The SASS cost of one Philox4x32 call of the CUDA kernels, and what it implies for the decode.

Compiles ``philox`` of ``witcert/kernels/cuda/common.cuh`` (the one the decode, extend and write
kernels call) for sm_90 with nvcc, 10 and 7 rounds, on any machine (no GPU needed), counts the
SASS instructions one more call adds to a kernel whose calls share one key (as the decode's do:
the key is the kernel's argument, the counters name slot, side and channel chunk), and prints what the dither's
Philox work alone asks of a decode at a given speed: per (token, KV head) the decode regenerates
both sides' dither, ``2 * 128 / c`` calls with ``c`` = 16 channels per call at 8 bits and 8 at 16,
shared by every query head of the group. The time is the instruction count over the whole GPU's
issue rate (4 schedulers x 132 SMs, one warp instruction each per cycle, at the clock given):
a floor at perfect issue, not a measurement of a kernel.

Usage: python benchmarks/sass_philox.py [--clock-ghz 1.79] [--tokens 65536 --kv-heads 8 --batch 16]
(nvcc on PATH or CUDA_HOME; cuobjdump on PATH or the one Triton ships).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

CUDA_DIR = Path(__file__).resolve().parent.parent / "witcert" / "kernels" / "cuda"

KERNEL = """
#include "common.cuh"
extern "C" __global__ void calls(uint4 *out, uint32_t a, uint32_t b, uint32_t k0, uint32_t k1) {
    const uint32_t t = threadIdx.x + blockIdx.x * blockDim.x;
    uint4 acc = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (uint32_t i = 0; i < NCALLS; i++) {  // the decode's pattern: one key, counters per channel chunk
        const uint4 w = philox(t, a ^ t, b + i + (t << 5), t ^ 7u, k0, k1);  // four lane-varying words
        acc.x ^= w.x; acc.y ^= w.y; acc.z ^= w.z; acc.w ^= w.w;
    }
    out[t] = acc;
}
"""


# A SASS instruction's opcode after its address comment, past an optional predicate (@P0, @!UP1)
SASS_OP = r"(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)"


def find_tool(name: str) -> str:
    """The path of a CUDA tool (nvcc, cuobjdump, nvdisasm): PATH, CUDA_HOME/bin, then the
    copy Triton ships (nvcc: the package's own lookup, witcert.kernels.cuda); exits with a
    one-line message when there is none."""
    if name == "nvcc":
        from witcert.kernels import cuda as wc_cuda  # noqa: PLC0415 (imports torch)

        found = wc_cuda._nvcc()
        if found:
            return found
        raise SystemExit("sass_philox: nvcc not found (put it on PATH or set CUDA_HOME)")
    found = shutil.which(name)
    if found:
        return found
    if os.environ.get("CUDA_HOME"):
        cand = Path(os.environ["CUDA_HOME"]) / "bin" / name
        if cand.exists():
            return str(cand)
    try:
        import triton  # noqa: PLC0415 (only to find the cuobjdump it ships)

        cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
        if cand.exists():
            return str(cand)
    except ImportError:
        pass
    raise SystemExit(f"sass_philox: {name} not found (put it on PATH or set CUDA_HOME)")


def sass_mix(rounds: int, ncalls: int) -> collections.Counter:
    """Opcode counts of the SASS of a kernel making ``ncalls`` calls per thread with one key."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "calls.cu"
        src.write_text(KERNEL)
        cubin = Path(tmp) / "calls.cubin"
        subprocess.run([find_tool("nvcc"), "-arch=sm_90", "-cubin", "-O3", f"-I{CUDA_DIR}", "-DWC_G=32",
                        "-DWC_BITS=16", f"-DWC_ROUNDS={rounds}", "-DWC_QGP=4", f"-DNCALLS={ncalls}", str(src), "-o", str(cubin)],
                       check=True, capture_output=True, text=True)
        sass = subprocess.run([find_tool("cuobjdump"), "-sass", str(cubin)], check=True, capture_output=True,
                              text=True).stdout
    ops = re.findall(r"^\s+/\*[0-9a-f]{4}\*/\s+" + SASS_OP, sass, flags=re.M)
    return collections.Counter(op for op in ops if op != "NOP")


def marginal(rounds: int) -> tuple[dict, float]:
    """Per opcode, the SASS instructions one more call adds with the key shared (9 calls less 1, / 8),
    and the same count without the rounds (the counter set-up and the use of the words)."""
    hi, lo = sass_mix(rounds, 9), sass_mix(rounds, 1)
    per_op = {op: (hi[op] - lo[op]) / 8 for op in set(hi) | set(lo)}
    return per_op, sum(per_op.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clock-ghz", type=float, default=1.79,
                    help="SM clock for the time floor (Nsight Compute read 1.79 GHz on the H200 runs)")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=4096, help="context length per sequence")
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--sdpa-us", type=float, default=None, help="SDPA fp16's time at the shape, for the share")
    args = ap.parse_args()
    _, base = marginal(0)
    rate = 4 * 132 * args.clock_ghz * 1e9  # warp instructions per second at perfect issue
    pairs = args.batch * args.tokens * args.kv_heads
    print(f"B {args.batch} x {args.tokens} tokens x {args.kv_heads} KV heads; clock {args.clock_ghz} GHz; "
          f"a call without rounds adds {base:.1f} instructions (counters, the words' use), not counted below")
    head = ("| rounds | instr. per call | IMAD.WIDE | LOP3 | uniform | bits | calls per (token, KV head) "
            "| warp instr. per (token, KV head) | Philox floor, us |")
    print(head + (" share of SDPA fp16 |" if args.sdpa_us else ""))
    print("|---" * (head.count("|") - 1 + (1 if args.sdpa_us else 0)) + "|")
    for rounds in (10, 7):
        ops, total = marginal(rounds)
        per_call = total - base
        wide = sum(v for k, v in ops.items() if k.startswith("IMAD.WIDE"))
        lop3 = sum(v for k, v in ops.items() if k.startswith("LOP3"))
        uni = sum(v for k, v in ops.items() if k.startswith("U"))
        for bits, cpc in ((16, 8), (8, 16)):
            calls = 2 * 128 // cpc
            warp_instr = calls * per_call / 32
            us = pairs * warp_instr / rate * 1e6
            share = f" {us / args.sdpa_us:.2f} |" if args.sdpa_us else ""
            print(f"| {rounds} | {per_call:.1f} | {wide:.1f} | {lop3:.1f} | {uni:.1f} "
                  f"| {bits} | {calls} | {warp_instr:.1f} | {us:.1f} |{share}")


if __name__ == "__main__":
    main()
