#!/usr/bin/env bash
# GPU call (issues 19, 14): extend.cu with the dropped dots, the digits read by ldmatrix, branch-free
# radii (common.cuh pair_radius, sqrt_up) and the 8-warp launch fixed; decode.cu with the same
# radius helper. The CUDA extend and decode tests (sharded), the smoke comparison (incl. 8 warps),
# then bench_extend against the previous extend.cu (PREV_CU) with a 168-register variant, and
# bench_decode_cuda_prev against the previous decode.cu (PREV_DEC).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-580} - ($(date +%s) - T0) )); }
run_shards ext 8 ${TESTS_S:-200} tests/test_kernels_extend.py -k "cuda or plan"
run_shards dec 8 ${TESTS_S:-200} tests/test_kernels_decode.py tests/test_cuda_graph.py -k cuda
wait; report_shards ext dec
PARTS="smoke" bash scripts/gpu_call18.sh
timeout $(( $(left) - 120 )) python3 benchmarks/bench_extend.py --bits 16 --shapes ${BENCH_SHAPES:-0,1,3} \
  --cuda-prev ${PREV_CU:-_prev_extend.cu} --cuda-regs 168 --out "$OUT/bench_extend_b16.json" > "$OUT/bench_extend_b16.log" 2>&1
tail -${TAIL_N:-31} "$OUT/bench_extend_b16.log"
timeout $(( $(left) - 5 )) python3 benchmarks/bench_decode_cuda_prev.py --prev ${PREV_DEC:-_prev_decode.cu} --shapes 0 1 2 \
  --bits 16 --out "$OUT/bench_decode.json" > "$OUT/bench_decode.log" 2>&1
tail -20 "$OUT/bench_decode.log"
echo "done at $(( $(date +%s) - T0 )) s"
