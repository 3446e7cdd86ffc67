#!/usr/bin/env bash
# GPU call (issue 19): extend tile / warp plans, cert on and off, SDPA in the same run.
source "$(dirname "$0")/gpu_common.sh"
(cd benchmarks && timeout ${EB_S:-240} python3 bench_extend.py --shapes ${SHAPES:-0,1} --plans ${PLANS:-16,32,4 32,32,8 32,16,4} \
  --out "$OUT/extend_plans.jsonl") > "$OUT/extend_plans.log" 2>&1
grep -v "^{" "$OUT/extend_plans.log" | tail -60
[ "${TESTS:-1}" = 1 ] && BENCH=0 bash scripts/gpu_call6.sh
