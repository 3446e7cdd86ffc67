#!/usr/bin/env bash
# GPU call prepared for the next session: the whole extend GPU matrix (tests/test_kernels_extend.py,
# 74 cases; in the session of BENCHMARKS 4i only 36 finished next to the sweeps: the Triton extend's
# sqrt_up / div_rn fixes have not run the rest on a GPU), alone on the GPU, 12 shards, then the
# Triton extend's adversarial sweep for what is left of the call.
source "$(dirname "$0")/gpu_common.sh"
run_shards ext ${EXT_N:-12} ${TESTS_S:-330} tests/test_kernels_extend.py
wait
report_shards ext
timeout ${SWEEP_S:-150} python3 benchmarks/soundness_sweep.py --paths triton_extend --seed 31 \
  --max-seconds $((${SWEEP_S:-150} - 30)) > "$OUT/sweep_extend.log" 2>&1; grep -E "VIOLATION|^triton" "$OUT/sweep_extend.log"
