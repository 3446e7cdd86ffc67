#!/usr/bin/env bash
# GPU call (issue 14): the split size of the default plan at small batches (2048-token splits were
# 1.7-4.9% faster on the four bench shapes in call 41; fewer splits may underfill the GPU at B1):
# 1024 (default) against 2048 tokens per split, same run, b16 cert on.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
timeout 200 python3 benchmarks/bench_decode_cuda_prev.py --prev _gpu_prev/dec/decode.cu --bits 16 --per-split 2048 --no-triton \
  --shape 1,32,8,4096 --shape 1,32,8,8192 --shape 1,32,8,16384 --shape 1,32,8,32768 --shape 4,32,8,8192 --shape 1,28,4,32768 \
  --shape 2,32,8,32768 --out "$OUT/bench_split.json" > "$OUT/bench_split.log" 2>&1
grep -v "^{" "$OUT/bench_split.log" | grep "|" | grep -v "cert off"
echo "done at $(( $(date +%s) - T0 )) s"
