#!/usr/bin/env bash
# GPU call: write.cu at 16 channels per thread: its contract tests and the files that write through
# it (graphs, HF, position dither, the decode and extend kernels' tests), then the write benchmark
# (CUDA, Triton, copy in one run) and the ablation.
source "$(dirname "$0")/gpu_common.sh"
run_shards w 8 400 tests/test_cuda_write.py tests/test_kernels_write.py tests/test_cuda_build.py \
  tests/test_cuda_graph.py tests/test_hf_graph_gpu.py tests/test_position_dither.py tests/test_kernels_decode.py \
  tests/test_backend_extend.py tests/test_cuda_auto.py tests/test_repair.py
wait; report_shards w
timeout 150 python3 benchmarks/bench_write.py --out "$OUT/bench_write.jsonl" > "$OUT/bench_write.log" 2>&1
tail -14 "$OUT/bench_write.log"
timeout 200 python3 benchmarks/ablate_write_cuda.py --out "$OUT/ablate_write_cuda.jsonl" > "$OUT/ablate_write_cuda.log" 2>&1
tail -15 "$OUT/ablate_write_cuda.log"
