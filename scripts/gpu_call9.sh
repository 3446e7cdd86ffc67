#!/usr/bin/env bash
# GPU call (issue 14): the CUDA tensor-core decode kernel: a diff against the Triton kernel, its
# contract tests (-k cuda), then bench_decode.py --quick (CUDA vs Triton vs SDPA fp16, same run).
source "$(dirname "$0")/gpu_common.sh"
timeout ${CHECK_S:-90} python3 scripts/gpu_cuda_check.py 2>&1 | tail -20 | tee "$OUT/check.log"
run_shards cu ${CU_N:-6} ${TESTS_S:-200} tests/test_kernels_decode.py tests/test_cuda_graph.py tests/test_fp_soundness.py -k cuda
wait
report_shards cu
(cd benchmarks && timeout ${BENCH_S:-150} python3 bench_decode.py --quick --out "$OUT/bench.jsonl") > "$OUT/bench.log" 2>&1
tail -25 "$OUT/bench.log"
