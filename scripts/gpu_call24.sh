#!/usr/bin/env bash
# GPU call (issues 14, 19): validation of HEAD's CUDA kernels after the review commit (decode.cu's digit
# combination now goes through digit_term_kept<0, 0u>): every decode-side GPU test file and the extend
# file (sharded), the adversarial sweeps of the CUDA decode and of the extend alongside, then, alone on
# the GPU, bench_decode.py --quick (the issue 14 table) and bench_extend.py (the issue 19 table).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - T0) )); }
TS=${TESTS_S:-300}
run_shards dec 7 $TS tests/test_kernels_decode.py tests/test_cuda_graph.py tests/test_backend_extend.py tests/test_cuda_build.py \
  tests/test_position_dither.py tests/test_hf_graph_gpu.py tests/test_fp_soundness.py tests/test_cuda_auto.py \
  tests/test_kernels_write.py tests/test_repair.py tests/test_telemetry.py
run_shards ext 6 $TS tests/test_kernels_extend.py tests/test_dropped_dots.py
timeout $TS python3 benchmarks/soundness_sweep.py --paths cuda --seed 51 --max-seconds $((TS - 40)) > "$OUT/sweep_cuda.log" 2>&1 &
timeout $TS python3 benchmarks/soundness_sweep.py --paths triton_extend --seed 53 --max-seconds $((TS - 40)) > "$OUT/sweep_extend.log" 2>&1 &
wait; report_shards dec ext
for f in sweep_cuda sweep_extend; do grep -E "VIOLATION|certs|^ *(cuda|triton_extend)" "$OUT/$f.log" | tail -4; done
timeout $(( $(left) - 130 )) python3 benchmarks/bench_decode.py --quick --out "$OUT/bench_decode.json" > "$OUT/bench_decode.log" 2>&1
tail -30 "$OUT/bench_decode.log"
timeout $(( $(left) - 5 )) python3 benchmarks/bench_extend.py --bits 16 --out "$OUT/bench_extend.json" > "$OUT/bench_extend.log" 2>&1
tail -25 "$OUT/bench_extend.log"
echo "done at $(( $(date +%s) - T0 )) s"
