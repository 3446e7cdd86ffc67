#!/usr/bin/env bash
# GPU call of session 2026-12-07f (issue 19): the prefix kernel's leaner tile loop (branch i19-lean:
# expm1_up_poly of degree 3, the overflow test only where the tile's scales allow one, its clamps
# behind a vote, the past-Np addends on the call's last tile only, no NaN cap per radius, no p.v
# factor products where it is 1, the chain scales in 16-byte loads; 1,057 instructions on the
# common path of a 64-token tile against 1,302)
# against main's kernel (reports/gpu-2026-12-07f/main) in the same runs, RUNS runs of SHAPES with the
# card's SM clock, power and memory in use sampled beside each run (nvidia-smi every 200 ms: is the
# slow mode of BENCHMARKS 13ap the card's?); then the extend's GPU tests (15 shards of CHECK_T s)
# and test_expm1_bound.py (one) on the branch, with the extend's adversarial sweep beside them.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
for run in $(seq 1 ${RUNS:-2}); do
  ext_bench_smi "$run" "${BENCH_T:-200}" "${SHAPES:-0,1}" ../reports/gpu-2026-12-07f/main/extend.cu
  echo "## bench $run at $(( $(date +%s) - T0 )) s"; grep -v building "$OUT/bench_run$run.log" | grep -v "^{" | tail -10
done
[ "${CHECK_T:-230}" = 0 ] && exit 0
run_shards ext 15 "${CHECK_T:-230}" "${EXT_TESTS[@]}"
run_shards exp 1 "${CHECK_T:-230}" tests/test_expm1_bound.py
timeout "${CHECK_T:-230}" python3 benchmarks/soundness_sweep.py --paths triton_extend --seed 421 \
  --max-seconds $(( ${CHECK_T:-230} - 40 )) > "$OUT/sweep_extend.log" 2>&1 &
wait; report_shards ext exp; tally_shards exp; tally_shards ext; not_passed "${EXT_TESTS[@]}"
grep -E "VIOLATION|certs|^ *triton_extend" "$OUT/sweep_extend.log" | tail -3
echo "done at $(( $(date +%s) - T0 )) s"
