#!/usr/bin/env bash
# GPU call (2026-12-06k; issue 19), main after the merges (the review's mend: _cuda_prefix takes the
# plan, split_rescales): (1) the extend kernel's and the extend backend's GPU tests;
# (2) the host side of a short turn (profile_extend.py --host): wall with a sync per call, the
# launcher's own time, cProfile's top functions, at 16 new tokens over 4,096 and 32,768.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
run_shards ext 12 150 tests/test_kernels_extend.py tests/test_backend_extend.py
wait; report_shards ext; tally_shards ext | head -3
echo "## tests at $(( $(date +%s) - T0 )) s"
export PYTHONPATH=$PWD
for s in 4096,16,32,8 32768,16,32,8; do
  (cd benchmarks && timeout 60 python3 profile_extend.py --shape $s --bits 8 --reps 50 --host) > "$OUT/host_$s.log" 2>&1
  grep -E "per call|tottime" -A22 "$OUT/host_$s.log" | cut -c1-150 | head -30
done
echo "done at $(( $(date +%s) - T0 )) s"
