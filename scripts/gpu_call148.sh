#!/usr/bin/env bash
# GPU call (2026-12-07d; issue 19, the lean certificate on main): the short-turn rows (16 and 128 new
# tokens over 32768; BENCHMARKS.md 13aj, not measured since the fp16 keys), two runs, against main's
# extend.cu from before the lean certificate (reports/gpu-2026-12-07d/main_extend.cu) in the same run.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
for run in $(seq 1 ${RUNS:-2}); do
  (cd benchmarks && timeout ${BENCH_T:-150} python3 bench_extend.py --bits 8 --shapes ${SHAPES:-5,6} --no-triton \
     --cuda-prev ../reports/gpu-2026-12-07d/main_extend.cu) > "$OUT/bench_run$run.log" 2>&1
  echo "## bench $run at $(( $(date +%s) - T0 )) s"; grep -v building "$OUT/bench_run$run.log" | grep -v "^{" | tail -12
done
echo "done at $(( $(date +%s) - T0 )) s"
