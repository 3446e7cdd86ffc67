#!/usr/bin/env bash
# GPU call (issue 14): the packed q.k layout of decode.cu (QGP <= 4) on the full GPU test matrix
# (gpu_call13's), the CUDA-vs-Triton diff, then against PREV (the source before it) with and
# without its launch bounds, then the adversarial CUDA sweep (4 seeds, SWEEP_S seconds each).
# If a test fails, the matrix runs again with PREV's source so that one is validated instead.
source "$(dirname "$0")/gpu_common.sh"
PARTS=tests TESTS_S=${TESTS_S:-240} bash scripts/gpu_call13.sh | grep -v "^\(Wed\|Thu\|GPU\|torch\|[0-9a-f]\{7\} \)"
python3 scripts/gpu_cuda_check.py > "$OUT/cuda_check.log" 2>&1; tail -12 "$OUT/cuda_check.log"
(cd benchmarks && timeout ${BENCH_S:-200} python3 bench_decode_cuda_prev.py --prev "$PREV" --shapes ${SHAPES:-0 1 3} \
  --maxreg 255 --out "$OUT/prev.jsonl") > "$OUT/prev.log" 2>&1; sed -n '/^shape /,$p' "$OUT/prev.log"
for s in 1 2 3 4; do
  timeout $((${SWEEP_S:-60} + 60)) python3 benchmarks/soundness_sweep.py --paths cuda --seed $((s + 20)) \
    --max-seconds ${SWEEP_S:-60} > "$OUT/sweep_cuda_$s.log" 2>&1 &
done
wait
for f in "$OUT"/sweep_cuda_*.log; do grep -E "VIOLATION|^cuda " "$f" | tail -3; done
if grep -qh "^FAILED\|^ERROR" /tmp/shard_all_*.log; then
  echo "== failures: the matrix again with PREV's source"
  cp "benchmarks/$PREV" witcert/kernels/cuda/decode.cu
  mkdir -p "$OUT/packed" && mv "$OUT"/tests_all.log "$OUT/packed/"
  PARTS=tests TESTS_S=${TESTS_S:-240} bash scripts/gpu_call13.sh | grep "^== \|^FAILED\|^ERROR"
fi
