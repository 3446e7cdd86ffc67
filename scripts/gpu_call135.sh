#!/usr/bin/env bash
# GPU call (2026-12-06j; issue 19): ExtendPlan's default build is now 64-token prefix tiles at 8
# warps (call 134, BENCHMARKS.md 13ai: 1.01-1.06x the 32-token tiles at 4 warps with the
# certificate). (1) The extend's table at every shape of bench_extend.py (the short turn among
# them) with the old default beside it (--cuda-tiles 32: 32-token tiles at 4 warps), one run.
# (2) Every GPU test file, 16 shards, with the extend's adversarial sweep beside them.
# `quick` as $1 (little device time left): the table, then the extend's GPU tests and sweep.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
runs=1
for r in $runs; do
  (cd benchmarks && timeout 90 python3 bench_extend.py --bits 8 --cuda-tiles 32) > "$OUT/bench_extend_run$r.log" 2>&1
  echo "## run $r at $(( $(date +%s) - T0 )) s"; grep -vE "^\{|building" "$OUT/bench_extend_run$r.log" | grep -v triton | tail -24
done
if [ "${1:-}" = quick ]; then ext_checks 16 200 402; echo "done at $(( $(date +%s) - T0 )) s"; exit; fi
timeout 300 python3 benchmarks/soundness_sweep.py --paths triton_extend --seed 402 --max-seconds 260 \
  > "$OUT/sweep_extend.log" 2>&1 &
run_shards all 16 ${TESTS_S:-380} "${ALL_GPU_TESTS[@]}"
wait; report_shards all
tally_shards all
grep -E "VIOLATION|certs|^ *triton_extend" "$OUT/sweep_extend.log" | tail -4
echo "done at $(( $(date +%s) - T0 )) s"
