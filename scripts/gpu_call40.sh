#!/usr/bin/env bash
# GPU call (issue 14): the CUDA decode with K / V warp pairs where measured faster (SPLIT: groups of
# 32, except QGP 8 at b 16, which keeps one warp for both sides), the two arrangements as lambdas of
# one source. Bitwise A/B against the previous kernel (_gpu_prev/dec = 6419d64) and the decode-side
# GPU tests with the CUDA decode's adversarial sweep; then alone on the GPU: the same-run timing
# against the previous kernel, the issue's table (bench_decode.py --quick), Nsight Compute of one launch.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - T0) )); }
TS=${TESTS_S:-270}
dec_checks 11 $TS 89 _gpu_prev/dec/decode.cu
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout 100 python3 benchmarks/bench_decode_cuda_prev.py --prev _gpu_prev/dec/decode.cu --shapes 0 1 2 3 \
  --bits 16 8 --no-triton --out "$OUT/bench_prev.json" > "$OUT/bench_prev.log" 2>&1
grep -v "^{" "$OUT/bench_prev.log" | grep "|"
echo "prev done at $(( $(date +%s) - T0 )) s"
timeout $(( $(left) - 60 )) python3 benchmarks/bench_decode.py --quick --out "$OUT/bench_decode.json" > "$OUT/bench_decode.log" 2>&1
grep -v "^{" "$OUT/bench_decode.log" | tail -22
echo "quick done at $(( $(date +%s) - T0 )) s"
[ "$(left)" -gt 50 ] && prof dec_split wc_decode_split profile_decode.py --shape 16,32,8,4096 --bits 16 --cert on
echo "done at $(( $(date +%s) - T0 )) s"
