#!/usr/bin/env bash
# GPU call (issues 14, 19): the extend benchmark (default shapes) and the end-to-end benchmark
# (Llama-3-8B shape, random weights) with the packed CUDA decode as the default.
source "$(dirname "$0")/gpu_common.sh"
(cd benchmarks && timeout ${EXT_S:-100} python3 bench_extend.py --out "$OUT/extend.jsonl") > "$OUT/extend.log" 2>&1
tail -12 "$OUT/extend.log"
mkdir -p "$OUT/e2e"
timeout ${E2E_S:-300} python3 benchmarks/bench_e2e_gpu.py --budget-s ${E2E_BUDGET:-240} --compile-cells 0 --out "$OUT/e2e" \
  > "$OUT/e2e/log.txt" 2>&1; tail -30 "$OUT/e2e/log.txt"
