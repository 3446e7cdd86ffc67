#!/usr/bin/env bash
# GPU call (issue 19): the extend's prefix tiles staged once per KV head (wc_extend_stage into a
# workspace, then cp.async double buffering in wc_extend_prefix). Quick: the CUDA extend tests,
# then bench_extend against the previous kernel (_gpu_prev/head/extend.cu = git show
# 33af663:witcert/kernels/cuda/extend.cu) in the same run.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_kernels_extend.py -k "cuda" > "$OUT/tests_cuda.log" 2>&1
tail -5 "$OUT/tests_cuda.log"
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout 200 python3 benchmarks/bench_extend.py --bits 16 --shapes 0,1,3 --cuda-prev _gpu_prev/head/extend.cu \
  --out "$OUT/bench_extend.json" > "$OUT/bench_extend.log" 2>&1
grep -v "^{" "$OUT/bench_extend.log" | tail -16
echo "done at $(( $(date +%s) - T0 )) s"
