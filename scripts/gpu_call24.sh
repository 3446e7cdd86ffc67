#!/usr/bin/env bash
# GPU call (issue 14): validation of HEAD's CUDA decode after the review commit (decode.cu's digit
# combination now goes through digit_term_kept<0, 0u>; the extend's SASS is byte-identical to the one
# validated in call 22/23): every decode-side GPU test file (sharded), the adversarial sweep of the CUDA
# decode alongside, then, alone on the GPU, bench_decode.py --quick (the issue 14 table).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - T0) )); }
TS=${TESTS_S:-300}
run_shards dec 12 $TS tests/test_kernels_decode.py tests/test_cuda_graph.py tests/test_backend_extend.py tests/test_cuda_build.py \
  tests/test_position_dither.py tests/test_hf_graph_gpu.py tests/test_fp_soundness.py tests/test_cuda_auto.py \
  tests/test_kernels_write.py tests/test_repair.py tests/test_telemetry.py
timeout $TS python3 benchmarks/soundness_sweep.py --paths cuda --seed 51 --max-seconds $((TS - 40)) > "$OUT/sweep_cuda.log" 2>&1 &
wait; report_shards dec
for f in sweep_cuda; do grep -E "VIOLATION|certs|^ *(cuda|triton_extend)" "$OUT/$f.log" | tail -4; done
timeout $(( $(left) - 5 )) python3 benchmarks/bench_decode.py --quick --out "$OUT/bench_decode.json" > "$OUT/bench_decode.log" 2>&1
tail -30 "$OUT/bench_decode.log"
echo "done at $(( $(date +%s) - T0 )) s"
