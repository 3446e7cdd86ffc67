#!/usr/bin/env bash
# GPU call (2026-12-06k; issue 19), after call 137: every GPU test file on the list (the split
# test's radii now compared with the merge's E_soft allowance), then the short turns' table again
# (the default's splits against one split, `cuda s1`).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
run_shards all 16 330 "${ALL_GPU_TESTS[@]}"
wait; report_shards all; tally_shards all
echo "## tests at $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout 90 python3 bench_extend.py --bits 8 --shapes 5,6,8,5,6,8 --prefix-splits 1) \
  > "$OUT/bench_extend.log" 2>&1
grep -vE "^\{|building" "$OUT/bench_extend.log" | grep -v triton | tail -26
echo "done at $(( $(date +%s) - T0 )) s"
