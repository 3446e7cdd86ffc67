#!/usr/bin/env bash
# GPU call (issue 14): the decode's expm1_up takes its exp route (a second MUFU op per (token, head))
# only when a lane of the warp has a radius >= 1/16 (decode.cu, common.cuh expm1_up_small). Checks: the
# bitwise A/B against the previous source (48 cases: out, lse, cert, vbound, radius, logits), the CUDA
# decode tests and the build test beside it; then the four bench shapes timed against the previous source.
# The measured source change: reports/gpu-2026-12-04e/call72/expm1_route.patch (not kept). Before the call, here:
#   mkdir -p _gpu_prev/dec; for f in decode.cu common.cuh; do
#   git show d2954ff:witcert/kernels/cuda/$f > _gpu_prev/dec/$f; done
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
timeout 170 python3 scripts/gpu_decode_ab.py _gpu_prev/dec/decode.cu > "$OUT/ab.log" 2>&1 &
run_shards dec 6 170 tests/test_kernels_decode.py tests/test_cuda_build.py tests/test_cuda_auto.py tests/test_fp_soundness.py -k "cuda or pairs"
wait; report_shards dec; grep -c "same bits" "$OUT/ab.log"; grep -E "DIFFERENT|bitwise|Error|error" "$OUT/ab.log" | head -8
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout 140 python3 benchmarks/bench_decode_cuda_prev.py --prev _gpu_prev/dec/decode.cu --shapes 0 1 2 3 --bits 16 --no-triton \
  > "$OUT/bench_prev.log" 2>&1
grep -E "\|" "$OUT/bench_prev.log" | tail -14
echo "done at $(( $(date +%s) - T0 )) s"
