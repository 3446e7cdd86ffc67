#!/usr/bin/env bash
# GPU call (issue 14): the decode kernel with head-level certificate terms. Two soundness
# sweeps of the Triton decode kernel in the background (the exact TV runs on the CPU); the
# decode / CUDA-graph / fp-soundness / extend / write tests; then the plans benchmark with
# the previous kernel timed in the same run (benchmarks/_prev_decode.py when present).
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/witcert_gpu}; mkdir -p "$OUT"
{ date -u; nvidia-smi -L; cat .commit 2>/dev/null
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee "$OUT/env.log"
for s in ${SEEDS:-5 6}; do
  timeout ${SWEEP_S:-300} python3 benchmarks/soundness_sweep.py --paths triton --cases ${CASES:-50000} --seed $s \
    --out "$OUT/sweep_triton_s$s.jsonl" > "$OUT/sweep_triton_s$s.log" 2>&1 &
done
timeout ${TESTS_S:-240} python3 -m pytest -q -rfE -p no:cacheprovider tests/test_kernels_decode.py tests/test_cuda_graph.py \
  tests/test_kernels_write.py tests/test_kernels_extend.py -k "${TESTS_K:-not nothing}" > "$OUT/tests.log" 2>&1
tail -5 "$OUT/tests.log"
timeout ${FP_S:-120} python3 -m pytest -q -rfE -p no:cacheprovider tests/test_fp_soundness.py -k triton > "$OUT/tests_fp.log" 2>&1
tail -3 "$OUT/tests_fp.log"
wait
cat "$OUT"/sweep_triton_s*.jsonl; grep -h VIOLATION "$OUT"/sweep_*.log | head -5
PREV=""; [ -f benchmarks/_prev_decode.py ] && PREV="--prev _prev_decode.py"
(cd benchmarks && timeout ${BENCH_S:-200} python3 bench_decode_plans.py $PREV ${PLANS:-} --out "$OUT/plans.jsonl") > "$OUT/plans.log" 2>&1
sed -n '/^shape /,$p' "$OUT/plans.log"; grep -m3 -i "error\|Traceback" "$OUT/plans.log"
