#!/usr/bin/env bash
# GPU call prepared for the next session (issue 14): the transposed tensor-core CUDA decode on the
# full GPU test matrix (it ran only the -k cuda tests), its 10^5 adversarial sweep, bench_decode
# (b8 rows, every shape), and a candidate source against it (PREV=path of the other decode.cu,
# e.g. git show i14-micro:witcert/kernels/cuda/decode.cu > benchmarks/_cand_decode.cu).
source "$(dirname "$0")/gpu_common.sh"
PARTS=${PARTS:-tests sweep bench prev}  # which parts run (a call holds at most 600 s)
if [[ $PARTS == *tests* ]]; then
run_shards all ${ALL_N:-12} ${TESTS_S:-260} tests/test_kernels_decode.py tests/test_cuda_graph.py tests/test_kernels_write.py \
  tests/test_hf_graph_gpu.py tests/test_position_dither.py tests/test_repair.py tests/test_telemetry.py \
  tests/test_backend_extend.py tests/test_fp_soundness.py tests/test_cuda_build.py -k "not native and not reference"
wait
report_shards all
fi
[[ $PARTS == *sweep* ]] && { timeout ${SWEEP_S:-200} python3 benchmarks/soundness_sweep.py --paths cuda --cases 100000 --out "$OUT/sweep_cuda.jsonl" \
  > "$OUT/sweep.log" 2>&1; tail -5 "$OUT/sweep.log"; }
if [[ $PARTS == *bench* ]]; then
(cd benchmarks && timeout ${BENCH_S:-200} python3 bench_decode.py --quick --out "$OUT/bench.jsonl") > "$OUT/bench.log" 2>&1
sed -n '/^shape /,$p' "$OUT/bench.log"
fi
if [[ -n "${PREV:-}" && $PARTS == *prev* ]]; then
  (cd benchmarks && timeout 120 python3 bench_decode_cuda_prev.py --prev "$PREV" --shapes 0 2 --out "$OUT/prev.jsonl") \
    > "$OUT/prev.log" 2>&1; sed -n '/^shape /,$p' "$OUT/prev.log"
fi
