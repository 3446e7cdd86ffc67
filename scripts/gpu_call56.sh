#!/usr/bin/env bash
# GPU call (issues 14, 19): the session's last check of the code as it lands: the decode and extend
# kernel test files whole, the dtype refusals (tests/test_attention_dtypes.py, on the GPU's Triton
# paths), the CUDA build / auto tests, and both kernels' adversarial sweeps, sharded over the cores.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
run_shards all 8 ${TESTS_S:-330} tests/test_kernels_decode.py tests/test_kernels_extend.py tests/test_attention_dtypes.py \
  tests/test_cuda_auto.py tests/test_cuda_build.py
timeout ${TESTS_S:-330} python3 benchmarks/soundness_sweep.py --paths cuda --seed 401 --max-seconds 280 > "$OUT/sweep_cuda.log" 2>&1 &
timeout ${TESTS_S:-330} python3 benchmarks/soundness_sweep.py --paths triton_extend --seed 409 --max-seconds 280 > "$OUT/sweep_extend.log" 2>&1 &
wait; report_shards all
grep -E "VIOLATION|certs|^ *cuda" "$OUT/sweep_cuda.log" | tail -3
grep -E "VIOLATION|certs|^ *triton_extend" "$OUT/sweep_extend.log" | tail -3
echo "done at $(( $(date +%s) - T0 )) s"
