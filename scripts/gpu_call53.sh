#!/usr/bin/env bash
# GPU call (issue 14): K / V warp pairs at 8 query heads per KV head and b = 16 (the GQA-7 shape),
# where 4m found them slower before the radius moved to tensor cores. Measurement-only variants of
# decode.cu (untracked, carried): _gpu_var/split8 (pairs, 128 registers: spills 104 bytes),
# split8np3 (pairs, 3 per CTA at 168 registers, 12 warps per SM, no spills), split8m1 (pairs, one
# CTA of 8 warps per SM, no cap). Timed against the shipped source in the same run. And the pairs'
# balance at GQA 4 (the certificate's on / off target): floor_variants.py's konly (the K side alone)
# and vonly (the V side alone), certificate on and off. Before the call, here:
#   python benchmarks/floor_variants.py _gpu_var/fv
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
timeout 400 python3 benchmarks/bench_decode_cuda_prev.py --prev _gpu_var/split8np3/decode.cu \
  _gpu_var/split8/decode.cu _gpu_var/split8m1/decode.cu --shapes 2 --bits 16 --no-triton --off-all \
  --shape 4,64,8,32768 --shape 16,64,8,4096 --shape 1,28,4,32768 > "$OUT/bench_prev.log" 2>&1
grep -E "\|" "$OUT/bench_prev.log" | tail -30
timeout 300 python3 benchmarks/bench_decode_cuda_prev.py --prev _gpu_var/fv/konly/decode.cu _gpu_var/fv/vonly/decode.cu \
  --shapes 0 1 3 --bits 16 --no-triton --off-all > "$OUT/bench_balance.log" 2>&1
grep -E "\|" "$OUT/bench_balance.log" | tail -30
# the workspace cap from the environment (2b0f30e), not run on a GPU before
timeout 200 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_kernels_extend.py -k "environment or in_chunks" \
  > "$OUT/tests_env.log" 2>&1; tail -3 "$OUT/tests_env.log"
echo "done at $(( $(date +%s) - T0 )) s"
