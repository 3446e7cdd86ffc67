#!/usr/bin/env bash
# GPU call (issue 19): the Triton extend's exact new tokens with the Cauchy-Schwarz dot bound and
# fp16 p.v (witcert/kernels/extend.py). The extend's GPU tests (sharded) and its adversarial sweep
# alongside, then, alone on the GPU, bench_extend against the previous extend.py (_ext_prev.py =
# git show HEAD~:witcert/kernels/extend.py) in the same run, and the kernels one by one.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - T0) )); }
TS=${TESTS_S:-300}
ext_checks 12 $TS 71
timeout $(( $(left) - 60 )) python3 benchmarks/bench_extend.py --bits 16 --prev _ext_prev.py \
  --out "$OUT/bench_extend.json" > "$OUT/bench_extend.log" 2>&1
tail -26 "$OUT/bench_extend.log"
ext_kernels 50
echo "done at $(( $(date +%s) - T0 )) s"
