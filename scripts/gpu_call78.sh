#!/usr/bin/env bash
# GPU call (session of 2026-12-05d, issue 19): the extend's aligned keys timed against the session
# start's extend.cu and common.cuh (_gpu_prev/ext0) in the same run, b 16 at the issue's shapes and
# 4096 + 2048, b 8 at 4096 + 512; then where the time goes kernel by kernel at 4096 + 512 (about 430 s).
source "$(dirname "$0")/gpu_common.sh"
# the baseline: main before the aligned keys (763b328), its decode.cu, extend.cu and common.cuh side by side
mkdir -p _gpu_prev/ext0 && for f in decode.cu extend.cu common.cuh; do
  git show 763b328:witcert/kernels/cuda/$f > _gpu_prev/ext0/$f || { echo "no git base for the baseline"; exit 1; }; done
T0=$(date +%s)
(cd benchmarks && timeout 220 python3 bench_extend.py --bits 16 --shapes 0,1,2 --cuda-prev ../_gpu_prev/ext0/extend.cu --out "$OUT/bench_extend16.jsonl") > "$OUT/bench_extend16.log" 2>&1
echo "b16 done at $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout 100 python3 bench_extend.py --bits 8 --shapes 0 --cuda-prev ../_gpu_prev/ext0/extend.cu --out "$OUT/bench_extend8.jsonl") > "$OUT/bench_extend8.log" 2>&1
echo "b8 done at $(( $(date +%s) - T0 )) s"
for c in on off; do
  (cd benchmarks && timeout 60 python3 profile_extend.py --shape 4096,512,32,8 --cert $c --reps 3 --kernels) > "$OUT/kernels_4096_512_$c.txt" 2>&1
  echo "## kernels 4096+512 cert $c"; grep -E "wc_extend|_extend_kernel" "$OUT/kernels_4096_512_$c.txt" | cut -c1-60,100-170
done
for f in bench_extend16 bench_extend8; do echo "## $f"; grep -E "\|" "$OUT/$f.log" | tail -12; done
echo "done at $(( $(date +%s) - T0 )) s"
