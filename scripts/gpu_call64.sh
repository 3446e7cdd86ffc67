#!/usr/bin/env bash
# GPU call: write.cu with the quotient's reciprocal once per thread (div_fast): the contract tests and
# the division probe, then the ablation (CUDA vs Triton vs copy) and the write benchmark.
source "$(dirname "$0")/gpu_common.sh"
run_shards w 3 300 tests/test_cuda_write.py tests/test_kernels_write.py
wait; report_shards w
timeout 240 python3 benchmarks/ablate_write_cuda.py --out "$OUT/ablate_write_cuda.jsonl" > "$OUT/ablate_write_cuda.log" 2>&1
tail -17 "$OUT/ablate_write_cuda.log"
