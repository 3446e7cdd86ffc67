#!/usr/bin/env bash
# GPU call (2026-12-06j; issue 19): ExtendPlan.prefix_build picks the CUDA prefix kernel's build by
# the grid (64-token tiles at 8 warps where the grid at 4 warps holds more CTAs than SMs, else
# 32-token tiles at 4). (1) The table at 4096 + 512 (call 135's first cell read slow: the first
# witcert cell of a run that builds) and the short turns (16, 128, 256 new tokens over 32,768), the
# default beside 32-token tiles at 4 and 8 warps and 64 at 8. (2) The extend kernel's GPU tests.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
(cd benchmarks && timeout 100 python3 bench_extend.py --bits 8 --shapes 0,5,6,7,0 --cuda-warps 8 --cuda-tiles 32) \
  > "$OUT/bench_extend.log" 2>&1
echo "## bench at $(( $(date +%s) - T0 )) s"; grep -vE "^\{|building" "$OUT/bench_extend.log" | grep -v triton | tail -42
run_shards ext 16 200 tests/test_kernels_extend.py tests/test_cuda_auto.py
wait; report_shards ext; tally_shards ext
echo "done at $(( $(date +%s) - T0 )) s"
