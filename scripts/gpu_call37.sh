#!/usr/bin/env bash
# GPU call (issue 19): measurement-only variants of the CUDA extend's prefix kernel, timed against
# the shipped one in the same run (bench_extend --cuda-prev; the folders _gpu_var/NAME/extend.cu are
# written by hand from extend.cu at ae33c2d, not in the repository): vA the logits' group loop not
# unrolled, vA2 the group loop outside the n-tile loop and not unrolled, vAC vA plus the radius's
# group loop not unrolled (199 registers), vAC168 vAC with a 168-register cap (3 CTAs per SM, no spills).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
timeout 420 python3 benchmarks/bench_extend.py --bits 16 --shapes 0,1,2 \
  --cuda-prev _gpu_var/vA/extend.cu _gpu_var/vA2/extend.cu _gpu_var/vAC/extend.cu _gpu_var/vAC168/extend.cu \
  --out "$OUT/bench_var.json" > "$OUT/bench_var.log" 2>&1
grep -v "^{" "$OUT/bench_var.log" | tail -40
echo "done at $(( $(date +%s) - T0 )) s"
