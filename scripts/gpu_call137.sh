#!/usr/bin/env bash
# GPU call (2026-12-06k; issue 19): the CUDA prefix kernel split across CTAs (ExtendPlan.prefix_splits,
# grid z), the splits' states merged by the Triton kernel. (1) The table: short turns (16 new tokens
# over 32,768 and 4,096; 128 and 256 over 32,768) and the issue's shapes, the default (splits by
# ExtendPlan.split_count) beside one split (`cuda s1`). (2) The extend's GPU tests (the new split
# cases among them) and its adversarial sweep.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
(cd benchmarks && timeout 170 python3 bench_extend.py --bits 8 --shapes 5,8,6,7,0,1,5,8 --prefix-splits 1) \
  > "$OUT/bench_extend.log" 2>&1
echo "## bench at $(( $(date +%s) - T0 )) s"; grep -vE "^\{|building" "$OUT/bench_extend.log" | grep -v triton | tail -44
ext_checks 16 230 403
run_shards auto 2 120 tests/test_cuda_auto.py tests/test_cuda_build.py
wait; report_shards auto
echo "done at $(( $(date +%s) - T0 )) s"
