#!/usr/bin/env bash
# GPU call (issues 14, 19): what parts of the CUDA kernels' work cost, measured. The measurement-only
# builds of benchmarks/floor_variants.py (r0: no Philox work; r0codes: also no dither planes in q.k
# and no digit combination beyond the leading digit) against the shipped source in the same run,
# certificate on and off: the extend (4096 / 32768 + 512) and the decode (the four issue shapes).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - T0) )); }
FV=/tmp/fv; python3 benchmarks/floor_variants.py $FV > "$OUT/floor_variants.log" 2>&1
python3 - $FV > "$OUT/prebuild.log" 2>&1 <<'PY'
import sys, concurrent.futures as cf
from pathlib import Path
from witcert.kernels import cuda as wc
fv = Path(sys.argv[1])
jobs = [(src, kind, q) for kind in ("decode", "extend") for q in (4, 8)
        for src in (None, fv / "r0" / f"{kind}.cu", fv / "r0codes" / f"{kind}.cu")]
def one(j):
    src, kind, qgp = j
    wc.library(qgp=qgp, group=32, bits=16, rounds=10, arch="90", kind=kind, src=src)
    return j
with cf.ThreadPoolExecutor(12) as ex:
    for j in ex.map(one, jobs): print("built", j, flush=True)
PY
tail -2 "$OUT/prebuild.log"; echo "built at $(( $(date +%s) - T0 )) s"
timeout $(( $(left) / 2 )) python3 benchmarks/bench_extend.py --bits 16 --shapes 0,1 \
  --cuda-prev $FV/r0/extend.cu $FV/r0codes/extend.cu --out "$OUT/bench_extend.json" > "$OUT/bench_extend.log" 2>&1
tail -22 "$OUT/bench_extend.log"
timeout $(( $(left) - 5 )) python3 benchmarks/bench_decode_cuda_prev.py --prev $FV/r0/decode.cu $FV/r0codes/decode.cu \
  --shapes 0 1 2 3 --bits 16 --off-all --no-triton --out "$OUT/bench_decode_floor.json" > "$OUT/bench_decode_floor.log" 2>&1
tail -30 "$OUT/bench_decode_floor.log"
echo "done at $(( $(date +%s) - T0 )) s"
