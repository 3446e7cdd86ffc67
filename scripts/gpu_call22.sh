#!/usr/bin/env bash
# GPU call (issues 19, 14): the validation and the numbers of the dropped dots in both CUDA kernels.
# The full extend test file and every decode-side GPU test file (sharded), the adversarial sweeps of
# the CUDA decode and of the extend (its CUDA prefix phase) alongside, then, alone on the GPU,
# bench_extend (all shapes, against the previous extend.cu, with an 8-warp variant) and
# bench_decode_cuda_prev (against the previous decode.cu, b16 and b8).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - T0) )); }
TS=${TESTS_S:-270}
run_shards ext 6 $TS tests/test_kernels_extend.py tests/test_dropped_dots.py
run_shards dec 7 $TS tests/test_kernels_decode.py tests/test_cuda_graph.py tests/test_backend_extend.py tests/test_cuda_build.py \
  tests/test_position_dither.py tests/test_hf_graph_gpu.py tests/test_fp_soundness.py tests/test_cuda_auto.py
timeout $TS python3 benchmarks/soundness_sweep.py --paths cuda --seed 41 --max-seconds $((TS - 40)) > "$OUT/sweep_cuda.log" 2>&1 &
timeout $TS python3 benchmarks/soundness_sweep.py --paths triton_extend --seed 43 --max-seconds $((TS - 40)) > "$OUT/sweep_extend.log" 2>&1 &
wait; report_shards ext dec
for f in sweep_cuda sweep_extend; do grep -E "VIOLATION|certs|^ *(cuda|triton_extend)" "$OUT/$f.log" | tail -4; done
timeout $(( $(left) - 100 )) python3 benchmarks/bench_extend.py --bits 16 --cuda-prev ${PREV_CU:-_prev_extend.cu} \
  --cuda-warps 8 --out "$OUT/bench_extend_b16.json" > "$OUT/bench_extend_b16.log" 2>&1
tail -37 "$OUT/bench_extend_b16.log"
timeout $(( $(left) - 5 )) python3 benchmarks/bench_decode_cuda_prev.py --prev ${PREV_DEC:-_prev_decode.cu} --shapes 0 1 2 3 \
  --bits 16 8 --out "$OUT/bench_decode.json" > "$OUT/bench_decode.log" 2>&1
tail -30 "$OUT/bench_decode.log"
echo "done at $(( $(date +%s) - T0 )) s"
