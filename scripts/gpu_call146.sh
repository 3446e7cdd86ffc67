#!/usr/bin/env bash
# GPU call (2026-12-07d; issue 19, branch i19-lean-cert): call 145 found the per-n-tile vote (b39eed8)
# no faster than main (its branches cut the tile loop into blocks the scheduler cannot overlap). This
# tree takes the polynomial for every term and redoes a tile by the exp route where the warp's vote
# after the tile finds a radius above 1. (1) Timed, two runs, against main's extend.cu and two
# measurement-only variants in the same run: exp_only (the lean certificate, exp route alone, no
# vote) and ntile_vote (b39eed8's). (2) Every GPU test file in 16 shards and the extend's sweep.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
V=../reports/gpu-2026-12-07d
for run in $(seq 1 ${RUNS:-2}); do
  (cd benchmarks && timeout ${BENCH_T:-150} python3 bench_extend.py --bits 8 --shapes ${SHAPES:-0,1,2} --no-triton \
     --cuda-prev $V/main_extend.cu $V/exp_only/extend.cu $V/ntile_vote/extend.cu) > "$OUT/bench_run$run.log" 2>&1
  echo "## bench $run at $(( $(date +%s) - T0 )) s"; grep -v building "$OUT/bench_run$run.log" | grep -v "^{" | tail -28
done
T=${CHECK_T:-300}
python3 -m pytest --collect-only -q -p no:cacheprovider "${ALL_GPU_TESTS[@]}" 2>/dev/null | grep "::" | sort -u > "$OUT/all_ids.txt"
run_shards all 16 "$T" "${ALL_GPU_TESTS[@]}"
timeout "$T" python3 benchmarks/soundness_sweep.py --paths triton_extend --seed 415 --max-seconds $((T - 40)) \
  > "$OUT/sweep_extend.log" 2>&1 &
wait; report_shards all; tally_shards all
comm -23 "$OUT/all_ids.txt" "$OUT/passed.txt" > "$OUT/not_passed.txt"
echo "collected $(wc -l < "$OUT/all_ids.txt"), passed $(wc -l < "$OUT/passed.txt"), not passed $(wc -l < "$OUT/not_passed.txt")"
grep -h -B2 -A30 "^___" /tmp/shard_all_*.log | head -120
grep -E "VIOLATION|certs|^ *triton_extend" "$OUT/sweep_extend.log" | tail -4
echo "done at $(( $(date +%s) - T0 )) s"
