#!/usr/bin/env bash
# GPU call (2026-12-07d; issue 19, main with the lean certificate): where the rest of the time goes,
# priced by two measurement-only variants timed against main's kernel in the same run (two runs,
# the issue's two 512-token shapes, b 8): nolo (the q.k without the keys' lo pieces: 8 fp16 mma a
# 16 x 8 in place of 16; wrong logits) and noradius (every radius the row's tail: no tensor-core
# sums, no root, and expm1 once per row; wrong certificates).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
V=../reports/gpu-2026-12-07d
for run in $(seq 1 ${RUNS:-2}); do
  (cd benchmarks && timeout ${BENCH_T:-150} python3 bench_extend.py --bits 8 --shapes ${SHAPES:-0,1} --no-triton \
     --cuda-prev $V/nolo/extend.cu $V/noradius/extend.cu) > "$OUT/bench_run$run.log" 2>&1
  echo "## bench $run at $(( $(date +%s) - T0 )) s"; grep -v building "$OUT/bench_run$run.log" | grep -v "^{" | tail -16
done
echo "done at $(( $(date +%s) - T0 )) s"
