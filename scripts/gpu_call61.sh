#!/usr/bin/env bash
# GPU call: the CUDA write kernel (write.cu): its bitwise contract tests, the write tests through
# both kernels, the decode / graph / HF files that write through it, then the write benchmark
# (CUDA and Triton against a device copy in the same run).
source "$(dirname "$0")/gpu_common.sh"
run_shards w 4 420 tests/test_cuda_write.py tests/test_kernels_write.py tests/test_cuda_build.py \
  tests/test_cuda_graph.py tests/test_hf_graph_gpu.py tests/test_position_dither.py
wait; report_shards w
grep -h "SKIPPED" /tmp/shard_w_*.log | head -5
timeout 150 python3 benchmarks/bench_write.py --out "$OUT/bench_write.jsonl" > "$OUT/bench_write.log" 2>&1
tail -16 "$OUT/bench_write.log"
