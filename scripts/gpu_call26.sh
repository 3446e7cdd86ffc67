#!/usr/bin/env bash
# GPU call (issues 19, 14): the extend's prefix records read one tile ahead and its lines prefetched
# (as run, BENCHMARKS.md 13f: measured 0.3-1.3% faster, not kept; extend.cu is unchanged).
# Builds the extend variants in parallel, runs the extend's GPU tests (sharded) and the extend's
# adversarial sweep alongside, then, alone on the GPU, bench_extend against the previous extend.cu
# (_ext_head.cu) and the decode A/B once more (DEC=1) if time is left.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - T0) )); }
TS=${TESTS_S:-270}
python3 - _ext_head.cu > "$OUT/prebuild.log" 2>&1 <<'PY' &
import sys, concurrent.futures as cf
from pathlib import Path
from witcert.kernels import cuda as wc
jobs = [(src, qgp, g, bits) for src in [None, *sys.argv[1:]] for qgp in (4, 8) for g in (32,) for bits in (16,)]
def one(j):
    src, qgp, g, bits = j
    wc.library(qgp=qgp, group=g, bits=bits, rounds=10, arch="90", kind="extend", src=Path(src) if src else None)
    return j
with cf.ThreadPoolExecutor(8) as ex:
    for j in ex.map(one, jobs): print("built", j, flush=True)
PY
run_shards ext 12 $TS tests/test_kernels_extend.py tests/test_backend_extend.py tests/test_dropped_dots.py
timeout $TS python3 benchmarks/soundness_sweep.py --paths triton_extend --seed 63 --max-seconds $((TS - 40)) > "$OUT/sweep_extend.log" 2>&1 &
wait; report_shards ext
grep -E "VIOLATION|certs|^ *triton_extend" "$OUT/sweep_extend.log" | tail -4; tail -2 "$OUT/prebuild.log"
timeout $(( $(left) - 5 )) python3 benchmarks/bench_extend.py --bits 16 --cuda-prev _ext_head.cu \
  --out "$OUT/bench_extend.json" > "$OUT/bench_extend.log" 2>&1
tail -30 "$OUT/bench_extend.log"
echo "done at $(( $(date +%s) - T0 )) s"
