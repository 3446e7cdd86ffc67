#!/usr/bin/env bash
# GPU call (session of 2026-12-04/05, issues 14, 19): every test file that runs on the GPU
# (ALL_GPU_TESTS of gpu_common.sh: call 66's 17 files), at the session's HEAD, in 14 shards,
# and beside them the CUDA decode's and the extend's adversarial sweeps (new seeds).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
run_shards all 14 ${TESTS_S:-500} "${ALL_GPU_TESTS[@]}"
timeout 300 python3 benchmarks/soundness_sweep.py --paths cuda --seed 103 --max-seconds 240 > "$OUT/sweep_cuda.log" 2>&1 &
timeout 300 python3 benchmarks/soundness_sweep.py --paths triton_extend --seed 323 --max-seconds 240 > "$OUT/sweep_extend.log" 2>&1 &
wait; report_shards all
tally_shards all
for f in sweep_cuda sweep_extend; do echo "## $f"; grep -E "VIOLATION|certs|violations" "$OUT/$f.log" | tail -4; done
echo "done at $(( $(date +%s) - T0 )) s"
