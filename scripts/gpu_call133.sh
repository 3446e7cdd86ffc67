#!/usr/bin/env bash
# GPU call (2026-12-06h; issue 19), about 280 s. (1) `radfirst` (carry .gpu/var; measurement-only):
# the prefix kernel with each (row, token)'s radius formed before the tile's softmax instead of
# after it (the radii do not depend on the weights, so their tensor-core sums and arithmetic may
# fill the softmax's reductions and exponentials; the same operations in the same order per value):
# bitwise A/B against main's kernel. (2) The extend's issue table twice at main's head with
# bench_extend.py's 100 ms warm-up (13ae), radfirst beside it.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
timeout 150 python3 scripts/gpu_extend_ab.py .gpu/var/radfirst/extend.cu > "$OUT/ab_radfirst.log" 2>&1
ab_summary ab_radfirst
echo "A/B done at $(( $(date +%s) - T0 )) s"
for r in 1 2; do
  (cd benchmarks && timeout 150 python3 bench_extend.py --bits 8 --shapes 0,1,2 --cuda-prev ../.gpu/var/radfirst/extend.cu) > "$OUT/bench_extend_run$r.log" 2>&1
  echo "## run $r at $(( $(date +%s) - T0 )) s"; grep -vE "^\{|building" "$OUT/bench_extend_run$r.log" | grep -v triton | tail -16
done
echo "done at $(( $(date +%s) - T0 )) s"
