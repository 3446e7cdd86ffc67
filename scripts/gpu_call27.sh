#!/usr/bin/env bash
# GPU call (issue 14): the issue's table at the landed decode (bench_decode.py --quick), and the
# pipelined decode against the previous source (_dec_head.cu = git show e8728ef:.../decode.cu) with
# a 168-register cap (DecodePlan(max_registers=168): 3 CTAs per SM) in the same run.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - T0) )); }
python3 - _dec_head.cu > "$OUT/prebuild.log" 2>&1 <<'PY'
import sys, concurrent.futures as cf
from pathlib import Path
from witcert.kernels import cuda as wc
jobs = [(None, q, b, 0) for q in (4, 8) for b in (16, 8)] + [(sys.argv[1], q, 16, 0) for q in (4, 8)] \
    + [(None, q, 16, 168) for q in (4, 8)]
def one(j):
    src, qgp, bits, reg = j
    wc.library(qgp=qgp, group=32, bits=bits, rounds=10, arch="90", maxreg=reg, src=Path(src) if src else None)
    return j
with cf.ThreadPoolExecutor(10) as ex:
    for j in ex.map(one, jobs): print("built", j, flush=True)
PY
tail -2 "$OUT/prebuild.log"
timeout $(( $(left) - 120 )) python3 benchmarks/bench_decode.py --quick --out "$OUT/bench_decode.json" > "$OUT/bench_decode.log" 2>&1
grep -E "default|sdpa|cuda b8" "$OUT/bench_decode.log" | tail -20
timeout $(( $(left) - 5 )) python3 benchmarks/bench_decode_cuda_prev.py --prev _dec_head.cu --shapes 0 1 2 3 --bits 16 \
  --maxreg 168 --no-triton --out "$OUT/bench_ab.json" > "$OUT/bench_ab.log" 2>&1
tail -26 "$OUT/bench_ab.log"
echo "done at $(( $(date +%s) - T0 )) s"
