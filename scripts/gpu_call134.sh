#!/usr/bin/env bash
# GPU call (prepared 2026-12-06i, not yet run; issue 19), about 560 s on an H100 (the call's limit
# is 600 s: pass `checks` alone as $1 to run only part 3 in a second call, `bench` for parts 1-2).
# (1) The three mma.sync shapes' rates on this card (benchmarks/mma_rates.cu). (2) The prefix kernel
# with 64-token tiles (ExtendPlan.cuda_tile 64, BENCHMARKS.md 13ah: 68.5 SASS instructions per
# (row, token) value against 73.6, 6 spill instructions in the loop, 183 KiB of shared memory at
# 8 warps) timed against the default (32-token tiles) at 4 and 8 warps, two runs. (3) The extend's
# GPU tests (their new 64-token cases among them: the contract against Triton, chunks bitwise one
# pass) and the extend's adversarial sweep.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
part=${1:-all}
if [ "$part" != checks ]; then
  /usr/local/cuda/bin/nvcc -O3 -arch=sm_90a -o /tmp/mma_rates benchmarks/mma_rates.cu && /tmp/mma_rates | tee "$OUT/mma_rates.txt"
  for r in 1 2; do
    (cd benchmarks && timeout 210 python3 bench_extend.py --bits 8 --shapes 0,1,2 --cuda-warps 8 --cuda-tiles 64 --cuda-prev ../.gpu/var/linv/extend.cu) \
      > "$OUT/bench_extend_run$r.log" 2>&1
    echo "## run $r at $(( $(date +%s) - T0 )) s"; grep -vE "^\{|building" "$OUT/bench_extend_run$r.log" | grep -v triton | tail -45
  done
fi
[ "$part" = bench ] || ext_checks 12 170 401
echo "done at $(( $(date +%s) - T0 )) s"
