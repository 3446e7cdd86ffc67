#!/usr/bin/env bash
# GPU call (issue 14): what the split length costs and buys (DecodePlan.min_tokens_per_split: 1024
# by default on the H200; 256 and 512 timed in the same run) at small grids, where one request's
# decode is latency-bound (BENCHMARKS 4p), and at the bench shapes; then end to end at batch 1
# (the pairs of 4p reach the Qwen2 shape, GQA 7).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
S=(); for sh in 1,32,8,4096 1,32,8,32768 1,28,4,8192 1,28,4,32768 4,32,8,8192; do S+=(--shape "$sh"); done
timeout 330 python3 benchmarks/bench_decode_cuda_prev.py --prev _gpu_prev/dec53/decode.cu --bits 16 --no-triton \
  --per-split 256 512 --shapes 0 1 2 3 "${S[@]}" > "$OUT/bench_split.log" 2>&1
grep -E "\|" "$OUT/bench_split.log" | grep -v "cert off" | tail -48
echo "splits done at $(( $(date +%s) - T0 )) s"
timeout 230 python3 benchmarks/bench_e2e_gpu.py --budget-s 200 --compile-cells 0 --methods sdpa-static,witcert-graph,witcert-graph-nocert \
  --contexts 8192,32768 --batches 1 --out "$OUT/e2e" > "$OUT/e2e.log" 2>&1
tail -30 "$OUT/e2e.log"
echo "done at $(( $(date +%s) - T0 )) s"
