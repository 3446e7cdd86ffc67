#!/usr/bin/env bash
# GPU call (2026-12-06c; issue 14): (1) the CUDA writer without its int/float conversions (branch
# i14-write): its GPU test files bitwise against the reference (8 shards), then timed against main's
# writer (.gpu/prev/wr0) with the ablations; (2) the decode's K-side code words by 4-byte loads (no
# register moves before the mma): bitwise A/B against main's decode (.gpu/prev/dec1), every field;
# (3) what bounds the decode now: the measurement-only builds of floor_variants.py (r0: no Philox
# work; r0codes: also no dither planes or digits 2-3 in q.k; konly / vonly: one side of each pair)
# and main's source against the current one, certificate on and off, b = 8, the four issue shapes,
# SDPA fp16 in the same run. Setup (dev machine): .gpu/prev/wr0 = main's write.cu and common.cuh,
# .gpu/prev/dec1 = main's decode.cu and common.cuh; carry .gpu/prev. About 500 s (ran in 126 s).
# Ran on branch i14-next (75efce7: (2)'s decode change, measured and not kept, BENCHMARKS 4x); on main
# the A/B compares the package's decode with its own source.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
FV=/tmp/fv; python3 benchmarks/floor_variants.py $FV > "$OUT/floor_variants.log" 2>&1
python3 - $FV > "$OUT/prebuild.log" 2>&1 <<'PY' &
import sys, concurrent.futures as cf
from pathlib import Path
from witcert.kernels import cuda as wc
fv = Path(sys.argv[1])
srcs = [None, Path(".gpu/prev/dec1/decode.cu")] + [fv / v / "decode.cu" for v in ("r0", "r0codes", "konly", "vonly")]
jobs = [(s, q, f) for s in srcs for q in (4, 8) for f in (False, True)]
def one(j):
    s, q, f = j
    try:
        wc.library(qgp=q, group=32, bits=8, rounds=10, arch="90", kind="decode", src=s, few_ctas=f)
        return ("built", j)
    except Exception as e:  # a variant that does not build a configuration is reported by the bench
        return ("FAILED", j, str(e)[-300:])
with cf.ThreadPoolExecutor(8) as ex:
    for r in ex.map(one, jobs): print(*r, flush=True)
PY
timeout 240 python3 scripts/gpu_decode_ab.py .gpu/prev/dec1/decode.cu > "$OUT/ab.log" 2>&1 &
run_shards wr 8 240 tests/test_cuda_write.py tests/test_kernels_write.py
wait; report_shards wr; tally_shards wr
echo "A/B: $(grep -c 'equal' "$OUT/ab.log") lines with 'equal'; last lines:"; tail -3 "$OUT/ab.log"
grep -c built "$OUT/prebuild.log"; grep FAILED "$OUT/prebuild.log" | head -3
echo "checks done at $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout 150 python3 ablate_write_cuda.py --prev ../.gpu/prev/wr0/write.cu) > "$OUT/ablate_write.log" 2>&1
grep -vE "^\{|building" "$OUT/ablate_write.log" | tail -14
echo "write timed at $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout $((560 - $(date +%s) + T0)) python3 bench_decode_cuda_prev.py \
  --prev ../.gpu/prev/dec1/decode.cu $FV/r0/decode.cu $FV/r0codes/decode.cu $FV/konly/decode.cu $FV/vonly/decode.cu \
  --shapes 0 1 2 3 --bits 8 --off-all --no-triton) > "$OUT/bench_prev.log" 2>&1
grep -vE "^\{|building" "$OUT/bench_prev.log" | tail -60 | grep -v "^---" | awk -F'|' '{printf "%s|%s|%s|%s\n", $1, $2, $3, $4}'
echo "done at $(( $(date +%s) - T0 )) s"
