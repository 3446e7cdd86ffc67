#!/usr/bin/env bash
# GPU call: every test file that runs on the GPU (17 files: call 59's 16 and the CUDA writer's),
# at the session's HEAD, in 14 shards.
source "$(dirname "$0")/gpu_common.sh"
run_shards all 14 ${TESTS_S:-540} tests/test_attention_dtypes.py tests/test_backend_extend.py tests/test_cuda_auto.py \
  tests/test_cuda_build.py tests/test_cuda_graph.py tests/test_fp_soundness.py tests/test_hf_graph_gpu.py \
  tests/test_kernels_decode.py tests/test_kernels_extend.py tests/test_kernels_write.py tests/test_position_dither.py \
  tests/test_repair.py tests/test_report_quick.py tests/test_report_runtime.py tests/test_telemetry.py \
  tests/test_backend_native.py tests/test_cuda_write.py
wait; report_shards all
echo "all: $(grep -h "PASSED\|FAILED\|ERROR\|SKIPPED" /tmp/shard_all_*.log | grep -o " PASSED\| FAILED\| ERROR\| SKIPPED" | sort | uniq -c | tr '\n' ' ')"
grep -hE "::.* PASSED" /tmp/shard_all_*.log | grep -o "tests/[^ ]*" | sort -u > "$OUT/passed.txt"
grep -h "SKIPPED" /tmp/shard_all_*.log | head -5
