#!/usr/bin/env bash
# GPU call (2026-12-06h; issue 19), about 150 s: the extend's issue table at main's head, twice, with
# bench_extend.py's 100 ms warm-up (13ae: with 5 ms the first cells after a build read slow).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
for r in 1 2; do
  (cd benchmarks && timeout 150 python3 bench_extend.py --bits 8 --shapes 0,1,2) > "$OUT/bench_extend_run$r.log" 2>&1
  echo "## run $r"; grep -vE "^\{|building" "$OUT/bench_extend_run$r.log" | grep -v triton | tail -10
done
echo "done at $(( $(date +%s) - T0 )) s"
