#!/usr/bin/env bash
# GPU call (prepared 2026-12-07, not yet run; issue 19, branch i19-f16keys): the CUDA extend's
# prefix kernel with fp16 keys in code units (q.k on fp16 tensor cores, one accumulator per
# 32-channel chain; PROOFS 5.4, "the CUDA extend's fp16 keys"; BENCHMARKS.md 13ak). About 450 s.
# (1) Timed against main's extend.cu (the aligned keys; reports/gpu-2026-12-07/main_extend.cu,
# built with the same common.cuh) in the same run, the issue's two 512-token shapes, b 8.
# (2) Every GPU test file (common.cuh changed too: warp_sum4) and the extend's adversarial sweep.
# (3) A second timing run with the third shape, if time is left. Merge the branch only if (2)
# passes and (1) shows a gain worth the certificate's 1.4% (fp16 queries).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
(cd benchmarks && timeout ${BENCH_T:-150} python3 bench_extend.py --bits 8 --shapes 0,1 --no-triton \
   --cuda-prev ../reports/gpu-2026-12-07/main_extend.cu) > "$OUT/bench_run1.log" 2>&1
echo "## bench 1 at $(( $(date +%s) - T0 )) s"; grep -vE "^\{|building" "$OUT/bench_run1.log" | grep -v triton | tail -12
T=${CHECK_T:-200}
run_shards all 16 "$T" "${ALL_GPU_TESTS[@]}"
timeout "$T" python3 benchmarks/soundness_sweep.py --paths triton_extend --seed 411 --max-seconds $((T - 40)) \
  > "$OUT/sweep_extend.log" 2>&1 &
wait; report_shards all; tally_shards all
grep -E "VIOLATION|certs|^ *triton_extend" "$OUT/sweep_extend.log" | tail -4
echo "## checks at $(( $(date +%s) - T0 )) s"
if [ "${BENCH2:-1}" = 1 ] && [ $(( $(date +%s) - T0 )) -lt 420 ]; then
  (cd benchmarks && timeout 150 python3 bench_extend.py --bits 8 --shapes 0,1,2 --no-triton \
     --cuda-prev ../reports/gpu-2026-12-07/main_extend.cu) > "$OUT/bench_run2.log" 2>&1
  echo "## bench 2 at $(( $(date +%s) - T0 )) s"; grep -vE "^\{|building" "$OUT/bench_run2.log" | grep -v triton | tail -16
fi
echo "done at $(( $(date +%s) - T0 )) s"
