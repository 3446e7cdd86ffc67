#!/usr/bin/env bash
# GPU call (issue 14/19 validation): bench_decode (every shape, b8 rows), a candidate decode.cu
# against the current one (PREV), then the adversarial sweeps (CUDA decode, Triton decode, Triton
# extend; several seeds at once, each stopped after SWEEP_S seconds with its count) alongside the
# GPU extend test matrix sharded (the soundness fixes of the Triton extend had not run on a GPU).
source "$(dirname "$0")/gpu_common.sh"
(cd benchmarks && timeout ${BENCH_S:-200} python3 bench_decode.py --quick --out "$OUT/bench.jsonl") > "$OUT/bench.log" 2>&1
sed -n '/^shape /,$p' "$OUT/bench.log"
if [ -n "${PREV:-}" ]; then
  (cd benchmarks && timeout 120 python3 bench_decode_cuda_prev.py --prev "$PREV" --shapes 0 2 --out "$OUT/prev.jsonl") \
    > "$OUT/prev.log" 2>&1; sed -n '/^shape /,$p' "$OUT/prev.log"
fi
run_shards ext ${EXT_N:-8} ${TESTS_S:-200} tests/test_kernels_extend.py
for s in 1 2 3 4; do
  timeout $((${SWEEP_S:-120} + 60)) python3 benchmarks/soundness_sweep.py --paths cuda --seed $s --max-seconds ${SWEEP_S:-120} \
    > "$OUT/sweep_cuda_$s.log" 2>&1 &
done
for p in triton triton_extend; do
  timeout $((${SWEEP_S:-120} + 60)) python3 benchmarks/soundness_sweep.py --paths $p --seed 5 --max-seconds ${SWEEP_S:-120} \
    > "$OUT/sweep_$p.log" 2>&1 &
done
wait
report_shards ext
for f in "$OUT"/sweep_*.log; do echo "## $f"; grep -E "VIOLATION|^(cuda|triton)" "$f" | tail -4; done
