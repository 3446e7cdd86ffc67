#!/usr/bin/env bash
# GPU call (issue 19): extend.cu forming only the dots that weigh more than 2^-22 (common.cuh
# dot_kept, PROOFS 5.4 "dropped dots"). The smoke comparison with the Triton kernel, bench_extend
# against the previous extend.cu (PREV_CU, same run) at b16, the CUDA extend tests
# (scripts/gpu_call18.sh), the decode's CUDA tests (common.cuh changed), then b8 if time is left.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-570} - ($(date +%s) - T0) )); }
bench() {  # bits shapes timeout
  timeout $3 python3 benchmarks/bench_extend.py --bits $1 --shapes $2 --cuda-prev ${PREV_CU:-_prev_extend.cu} \
    --out "$OUT/bench_extend_b$1.json" > "$OUT/bench_extend_b$1.log" 2>&1
  tail -${TAIL_N:-21} "$OUT/bench_extend_b$1.log"
}
PARTS="smoke" bash scripts/gpu_call18.sh
bench 16 ${BENCH_SHAPES:-0,1,2,3} ${BENCH_S:-170}
PARTS="cudatests" bash scripts/gpu_call18.sh
run_shards dec 8 $(( $(left) < 120 ? $(left) : 120 )) tests/test_kernels_decode.py -k cuda
wait; report_shards dec
[ "$(left)" -gt 40 ] && bench 8 0,1 $(( $(left) - 5 ))
echo "done at $(( $(date +%s) - T0 )) s"
