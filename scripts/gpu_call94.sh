#!/usr/bin/env bash
# GPU call (2026-12-05h; issue 19, main): call 93's best tiles of the new tokens' Triton kernel
# (block_m 64 x block_n 32 x 4 warps; 64 x 64 x 4) against the default (32 x 32 x 4), three shapes,
# twice, to confirm before any default changes. No carry; timeout 200.
source "$(dirname "$0")/gpu_common.sh"
for r in 1 2; do
  (cd benchmarks && timeout 90 python3 bench_extend.py --bits 16 --shapes 0,1,2 --auto-plans 64,32,4 64,64,4) \
    > "$OUT/bench_plans_$r.log" 2>&1
  echo "== run $r"; grep -E "^Np" "$OUT/bench_plans_$r.log" | grep -v "triton"
done
