#!/usr/bin/env bash
# GPU call (2026-12-07d; issue 19, branch i19-lean-cert): the prefix kernel's certificate without
# per-token tests (the radius mode a template parameter, flagged tokens through their tensor-core
# entries, sqrt_up's floor in the y sum, NaN read as +inf by one fminf, an overflow through the row's
# largest radius; PROOFS 5.4) and expm1_up_poly where a warp's radii are all at most 1 (PROOFS 5.5).
# (1) Timed against main's extend.cu (reports/gpu-2026-12-07d/main_extend.cu) in the same run: the
# issue's three shapes and the short turns (16, 128 new tokens over 32768), b 8.
# (2) Every GPU test file in 16 shards (what does not finish runs in the next call from passed.txt)
# and the extend's adversarial sweep beside them. About 560 s.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
(cd benchmarks && timeout ${BENCH_T:-230} python3 bench_extend.py --bits 8 --shapes ${SHAPES:-0,1,2,5,6} --no-triton \
   --cuda-prev ../reports/gpu-2026-12-07d/main_extend.cu) > "$OUT/bench_run1.log" 2>&1
echo "## bench 1 at $(( $(date +%s) - T0 )) s"; grep -v building "$OUT/bench_run1.log" | tail -30
T=${CHECK_T:-300}
run_shards all 16 "$T" "${ALL_GPU_TESTS[@]}"
timeout "$T" python3 benchmarks/soundness_sweep.py --paths triton_extend --seed 413 --max-seconds $((T - 40)) \
  > "$OUT/sweep_extend.log" 2>&1 &
wait; report_shards all; tally_shards all
grep -h -B2 -A30 "^___" /tmp/shard_all_*.log | head -120
grep -E "VIOLATION|certs|^ *triton_extend" "$OUT/sweep_extend.log" | tail -4
echo "done at $(( $(date +%s) - T0 )) s"
