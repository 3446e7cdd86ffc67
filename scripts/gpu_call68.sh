#!/usr/bin/env bash
# GPU call (issue 19): the Triton extend's exact new tokens with one radius per row (witcert/kernels/
# extend.py; PROOFS 5.4). The extend's GPU tests (sharded) and its adversarial sweep alongside, then,
# alone on the GPU, bench_extend against the previous extend.py (_gpu_prev/ext_prev.py = git show
# 8c61e4f:witcert/kernels/extend.py) in the same run, and the kernels one by one at 4096 + 2048.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - T0) )); }
TS=${TESTS_S:-290}
ext_checks 12 $TS 317
timeout $(( $(left) - 70 )) python3 benchmarks/bench_extend.py --bits 16 --shapes 0,1,2 --prev _gpu_prev/ext_prev.py \
  --out "$OUT/bench_extend.json" > "$OUT/bench_extend.log" 2>&1
tail -22 "$OUT/bench_extend.log"
ext_kernels 30
echo "done at $(( $(date +%s) - T0 )) s"
