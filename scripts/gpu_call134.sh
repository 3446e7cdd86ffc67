#!/usr/bin/env bash
# GPU call (prepared 2026-12-06i, not yet run; issue 19), about 550 s on an H100. (1) The three
# mma.sync shapes' rates on this card (benchmarks/mma_rates.cu). (2) `tn64` (measurement-only): the
# prefix kernel with 64-token tiles (`-DWC_TN=64`: half the per-tile work per token, 68.5 SASS
# instructions per (row, token) value against 73.6, 6 spill instructions in the loop; one CTA of 8
# warps per SM, its shared memory 183 KiB), timed against main at 4 and 8 warps, two runs.
# (3) The extend's GPU tests and sweep with the package itself switched to 64-token tiles in this
# copy of the tree (their chunks round to whole 64-token tiles): the correctness a landing would need.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
/usr/local/cuda/bin/nvcc -O3 -arch=sm_90a -o /tmp/mma_rates benchmarks/mma_rates.cu && /tmp/mma_rates | tee "$OUT/mma_rates.txt"
mkdir -p .gpu/var/tn64
sed 's/^#define WC_TN 32$/#define WC_TN 64/' witcert/kernels/cuda/extend.cu > .gpu/var/tn64/extend.cu
cp witcert/kernels/cuda/common.cuh .gpu/var/tn64/
grep -c "^#define WC_TN 64$" .gpu/var/tn64/extend.cu
for r in 1 2; do
  (cd benchmarks && timeout 170 python3 bench_extend.py --bits 8 --shapes 0,1,2 --cuda-warps 8 \
    --cuda-prev ../.gpu/var/tn64/extend.cu) > "$OUT/bench_extend_run$r.log" 2>&1
  echo "## run $r at $(( $(date +%s) - T0 )) s"; grep -vE "^\{|building" "$OUT/bench_extend_run$r.log" | grep -v triton | tail -16
done
sed -i 's/^#define WC_TN 32$/#define WC_TN 64/' witcert/kernels/cuda/extend.cu
ext_checks 12 180 401
echo "done at $(( $(date +%s) - T0 )) s"
