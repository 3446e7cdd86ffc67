#!/usr/bin/env bash
# GPU call (issue 14): the CUDA decode as K / V warp pairs (128 registers, 2 CTAs = 16 warps per SM).
# A bitwise A/B against the previous kernel (_gpu_prev/dec = git show 6419d64 of decode.cu and
# common.cuh) beside the decode-side GPU test files (sharded) and the CUDA decode's adversarial
# sweep; then, alone on the GPU, the same-run timing against the previous kernel (b 16 and 8, the
# new kernel also at 1 CTA per SM via --maxreg 168).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - T0) )); }
TS=${TESTS_S:-300}
dec_checks 11 $TS 83 _gpu_prev/dec/decode.cu
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout $(( $(left) - 5 )) python3 benchmarks/bench_decode_cuda_prev.py --prev _gpu_prev/dec/decode.cu --shapes 0 1 2 3 \
  --bits 16 8 --maxreg 168 --no-triton --out "$OUT/bench_prev.json" > "$OUT/bench_prev.log" 2>&1
grep -v "^{" "$OUT/bench_prev.log" | tail -30
echo "done at $(( $(date +%s) - T0 )) s"
