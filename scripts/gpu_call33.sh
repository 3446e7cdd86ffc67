#!/usr/bin/env bash
# GPU call (issue 19): tiles of the Triton kernel of the exact new tokens behind the CUDA prefix
# phase (the default impl), now that it runs one fp32 dot and one fp16 dot per tile: bench_extend
# --auto-plans at 4096 + 2048 and 4096 + 512, certificate on and off.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
timeout 420 python3 benchmarks/bench_extend.py --bits 16 --shapes 2,0 \
  --auto-plans 64,32,4 32,64,4 64,64,4 64,32,8 128,32,8 128,64,8 16,32,4 \
  --out "$OUT/bench_plans.json" > "$OUT/bench_plans.log" 2>&1
grep -vE "triton cert" "$OUT/bench_plans.log" | tail -36
echo "done at $(( $(date +%s) - T0 )) s"
