#!/usr/bin/env bash
# GPU call (issue 14): with the CUDA tensor-core kernel as the default on CUDA (plan "auto"): the
# GPU test files that decode (sharded), then bench_decode.py --quick (default vs Triton vs SDPA fp16).
source "$(dirname "$0")/gpu_common.sh"
run_shards all ${ALL_N:-12} ${TESTS_S:-260} tests/test_kernels_decode.py tests/test_cuda_graph.py tests/test_kernels_write.py \
  tests/test_hf_graph_gpu.py tests/test_position_dither.py tests/test_repair.py tests/test_telemetry.py \
  tests/test_backend_extend.py tests/test_fp_soundness.py -k "not native and not reference"
wait
report_shards all
(cd benchmarks && timeout ${BENCH_S:-200} python3 bench_decode.py --quick --out "$OUT/bench.jsonl") > "$OUT/bench.log" 2>&1
sed -n '/^shape /,$p' "$OUT/bench.log"; grep -m3 "Error\|Traceback" "$OUT/bench.log" || true
