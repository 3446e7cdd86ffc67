#!/usr/bin/env bash
# GPU call (issue 14): the decode's K / V warp pairs at 8 query heads per KV head and b = 16 for grids
# of at most one CTA per SM (WC_FEW_CTAS, DecodePlan.cuda_pairs, BENCHMARKS 4p). Checks: the bitwise
# A/B against the previous source (48 cases; the GQA-7/8 ones now take the pairs where their grid is
# small), the new bitwise test (pairs always / never / auto), the CUDA decode tests and the build
# test; then small-grid shapes timed against the previous source. Before the call, here:
#   mkdir -p _gpu_prev/dec53; for f in decode.cu common.cuh; do git show 1993a9f:witcert/kernels/cuda/$f > _gpu_prev/dec53/$f; done
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
timeout 240 python3 scripts/gpu_decode_ab.py _gpu_prev/dec53/decode.cu > "$OUT/ab.log" 2>&1 &
run_shards dec 6 240 tests/test_kernels_decode.py tests/test_cuda_build.py tests/test_cuda_auto.py -k "cuda or pairs"
wait; report_shards dec; grep -c "same bits" "$OUT/ab.log"; grep -E "DIFFERENT|bitwise|Error|error" "$OUT/ab.log" | head -8
echo "tests done at $(( $(date +%s) - T0 )) s"
S=(); for sh in 1,28,4,4096 1,28,4,8192 1,28,4,16384 1,28,4,32768 2,28,4,16384 4,28,4,4096 1,64,8,4096 1,64,8,16384 \
  2,64,8,8192 1,28,4,65536; do S+=(--shape "$sh"); done
timeout 300 python3 benchmarks/bench_decode_cuda_prev.py --prev _gpu_prev/dec53/decode.cu --bits 16 --no-triton \
  "${S[@]}" > "$OUT/bench_prev.log" 2>&1
grep -E "\|" "$OUT/bench_prev.log" | tail -42
echo "done at $(( $(date +%s) - T0 )) s"
