#!/usr/bin/env bash
# GPU call (2026-12-06; issue 14): the GPU test files call 103 did not run (its DEC_TESTS and
# test_cuda_write.py), on the same tree, in 15 shards: with call 103, every GPU test file at the
# decode of 559dfd9 (the kernels of f73f3f1). About 150 s on a warm machine; no carry.
source "$(dirname "$0")/gpu_common.sh"
REST=(tests/test_attention_dtypes.py tests/test_kernels_extend.py tests/test_report_runtime.py tests/test_backend_native.py
  tests/test_tc_signed_dot.py tests/test_report_quick.py tests/test_cuda_graph.py)
run_shards rest 15 240 "${REST[@]}"
wait; report_shards rest; tally_shards rest
