#!/usr/bin/env bash
# GPU call (2026-12-07, issue 19, branch i19-f16keys): the CUDA extend's prefix kernel with fp16
# keys in code units (q.k on fp16 tensor cores, one accumulator per 32-channel chain, PROOFS 5.4).
# (1) Timed against main's extend.cu (aligned keys; reports/gpu-2026-12-07/main_extend.cu, built
# with the same common.cuh) in the same run, the issue's two 512-token shapes, b 8. (2) The
# extend's GPU tests and its adversarial sweep. Short: the session's device time is nearly spent.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
(cd benchmarks && timeout ${BENCH_T:-150} python3 bench_extend.py --bits 8 --shapes 0,1 --no-triton \
   --cuda-prev ../reports/gpu-2026-12-07/main_extend.cu) > "$OUT/bench_run1.log" 2>&1
echo "## bench 1 at $(( $(date +%s) - T0 )) s"; grep -vE "^\{|building" "$OUT/bench_run1.log" | grep -v triton | tail -12
ext_checks 16 ${CHECK_T:-160} 411
echo "done at $(( $(date +%s) - T0 )) s"
