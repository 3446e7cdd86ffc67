#!/usr/bin/env bash
# GPU call (2026-12-07e; issue 19, branch i19-chainq): the prefix kernel's q.k chain by chain (every
# n-tile of the tile in each chain; the chain scales staged [NCH][TN]): bitwise A/B against main's
# kernel (reports/gpu-2026-12-07e/main), the issue's two 512-token shapes timed against it in the
# same run (b 8, two runs) with two measurement-only variants of the branch (linterm: the certificate's
# term p u, no expm1 polynomial; nocap: the radius without its NaN cap), the extend's kernels one by one (torch.profiler) and Nsight Compute's
# stall samples of the branch's prefix kernel at 4096 + 512.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
M=reports/gpu-2026-12-07e/main/extend.cu
timeout 150 python3 scripts/gpu_extend_ab.py $M > "$OUT/ab_main.log" 2>&1 &
timeout 150 python3 scripts/gpu_extend_ab.py $M --warps 8 --old-warps 8 > "$OUT/ab_w8.log" 2>&1 &
wait; ab_summary ab_main ab_w8
echo "## A/B done at $(( $(date +%s) - T0 )) s"
for run in 1 2; do
  (cd benchmarks && timeout 150 python3 bench_extend.py --bits 8 --shapes ${SHAPES:-0,1} --no-triton \
     --cuda-prev ../$M ../reports/gpu-2026-12-07e/linterm/extend.cu ../reports/gpu-2026-12-07e/nocap/extend.cu) > "$OUT/bench_run$run.log" 2>&1
  echo "## bench $run at $(( $(date +%s) - T0 )) s"; grep -v building "$OUT/bench_run$run.log" | grep -v "^{" | tail -24
done
for shape in 4096,512 32768,512; do for c in on off; do
  (cd benchmarks && timeout 90 python3 profile_extend.py --shape $shape,32,8 --bits 8 --cert $c --reps 3 --kernels) \
    > "$OUT/kernels_${shape/,/_}_$c.txt" 2>&1
  echo "## kernels $shape cert $c"; grep -E "Self CUDA|wc_extend|_kernel|Name" "$OUT/kernels_${shape/,/_}_$c.txt" | cut -c1-60,100-190 | head -12
done; done
echo "## at $(( $(date +%s) - T0 )) s"
ncu_prefix prefix_chainq --shape 4096,512,32,8 --bits 8 --cert on
echo "done at $(( $(date +%s) - T0 )) s"
