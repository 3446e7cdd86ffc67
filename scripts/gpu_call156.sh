#!/usr/bin/env bash
# GPU call prepared in session 2026-12-07e, not yet run (issue 19): what that session's short device
# time left unchecked on main's one-fp16-key extend (BENCHMARKS 13ap). (1) The issue's three shapes
# and the short turns, b 8, three runs each, against the kernel before 13ap
# (reports/gpu-2026-12-07e/main) in the same runs, with the card's SM clock and memory in use
# sampled beside each run (nvidia-smi, every 200 ms) to see whether 13ap's random slow mode is the
# card's clock. (2) Every GPU test file (16 shards; about 380 s each), the ids no shard passed listed
# for a second call (not_passed), and the extend's adversarial sweep beside them.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
for run in $(seq 1 ${RUNS:-3}); do
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,memory.used --format=csv -lms 200 \
    > "$OUT/smi_run$run.csv" 2>&1 &
  SMI=$!
  (cd benchmarks && timeout 200 python3 bench_extend.py --bits 8 --shapes ${SHAPES:-0,1,2,5,6} --no-triton \
     --cuda-prev ../reports/gpu-2026-12-07e/main/extend.cu) > "$OUT/bench_run$run.log" 2>&1
  kill $SMI
  echo "## bench $run at $(( $(date +%s) - T0 )) s"; grep -v building "$OUT/bench_run$run.log" | grep -v "^{" | tail -22
done
all_tests_and_sweep "${CHECK_T:-380}" 421
echo "done at $(( $(date +%s) - T0 )) s"
