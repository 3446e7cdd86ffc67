#!/usr/bin/env bash
# GPU call (issue 14): the CUDA tensor-core decode: its contract tests (-k cuda, full GPU matrix of
# the decode, graph and adversarial soundness tests) and bench_decode.py (every shape and variant).
source "$(dirname "$0")/gpu_common.sh"
run_shards cu ${CU_N:-6} ${TESTS_S:-200} tests/test_kernels_decode.py tests/test_cuda_graph.py tests/test_fp_soundness.py -k cuda
wait
report_shards cu
(cd benchmarks && timeout ${BENCH_S:-300} python3 bench_decode.py --budget-s 240 --out "$OUT/bench.jsonl") > "$OUT/bench.log" 2>&1
sed -n '/^shape /,$p' "$OUT/bench.log"; grep -m3 "Error\|Traceback" "$OUT/bench.log"
