#!/usr/bin/env bash
# GPU call (2026-12-07d; issue 19, branch i19-tf32row): the extend's radius sums with the rows'
# entries as one tf32 value rounded up (one mma per sum: 3 tf32 mma per 16 x 8 in place of 6).
# (1) Timed, two runs, the issue's three shapes, b 8, against main's lean kernel
# (reports/gpu-2026-12-07d/lean: main's extend.cu and common.cuh) and the kernel before it
# (main_extend.cu) in the same run. (2) Every GPU test file in 16 shards (the not-passed ids listed)
# and the extend's adversarial sweep.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
V=../reports/gpu-2026-12-07d
for run in $(seq 1 ${RUNS:-2}); do
  (cd benchmarks && timeout ${BENCH_T:-150} python3 bench_extend.py --bits 8 --shapes ${SHAPES:-0,1,2} --no-triton \
     --cuda-prev $V/lean/extend.cu $V/main_extend.cu) > "$OUT/bench_run$run.log" 2>&1
  echo "## bench $run at $(( $(date +%s) - T0 )) s"; grep -v building "$OUT/bench_run$run.log" | grep -v "^{" | tail -22
done
T=${CHECK_T:-300}
python3 -m pytest --collect-only -q -p no:cacheprovider "${ALL_GPU_TESTS[@]}" 2>/dev/null | grep "::" | sort -u > "$OUT/all_ids.txt"
run_shards all 16 "$T" "${ALL_GPU_TESTS[@]}"
timeout "$T" python3 benchmarks/soundness_sweep.py --paths triton_extend --seed 417 --max-seconds $((T - 40)) \
  > "$OUT/sweep_extend.log" 2>&1 &
wait; report_shards all; tally_shards all
comm -23 "$OUT/all_ids.txt" "$OUT/passed.txt" > "$OUT/not_passed.txt"
echo "collected $(wc -l < "$OUT/all_ids.txt"), passed $(wc -l < "$OUT/passed.txt"), not passed $(wc -l < "$OUT/not_passed.txt")"
grep -h -B2 -A30 "^___" /tmp/shard_all_*.log | head -100
grep -E "VIOLATION|certs|^ *triton_extend" "$OUT/sweep_extend.log" | tail -3
echo "done at $(( $(date +%s) - T0 )) s"
