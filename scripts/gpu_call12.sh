#!/usr/bin/env bash
# GPU call (issue 14): the CUDA decode with the transposed p.v (channels as M, heads as N; serves
# GQA <= 8): its tests (-k cuda), then against the previous source (benchmarks/_prev_decode.cu).
source "$(dirname "$0")/gpu_common.sh"
run_shards cu ${CU_N:-12} ${TESTS_S:-110} tests/test_kernels_decode.py tests/test_cuda_graph.py tests/test_fp_soundness.py -k cuda
wait
report_shards cu
(cd benchmarks && timeout ${BENCH_S:-75} python3 bench_decode_cuda_prev.py --prev _prev_decode.cu --shapes 0 2 1 3 --bits 16 \
  --out "$OUT/prev.jsonl") > "$OUT/prev.log" 2>&1
cat "$OUT/prev.log" | grep "^{" ; sed -n '/^shape /,$p' "$OUT/prev.log"
