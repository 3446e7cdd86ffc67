#!/usr/bin/env bash
# GPU call (issue 14): with the K / V pair decode (5e20b97 + a static_assert): tile streams per CTA
# (_gpu_var/np2: 2 pairs per CTA, 4 CTAs per SM) and split sizes (512 / 2048 tokens against the
# default plan's 1024) in one same-run timing; then end to end at model scale (bench_e2e_gpu.py,
# Llama-3-8B and Qwen2-7B shapes, random weights, witcert graph vs HF eager; as 9e).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - T0) )); }
timeout 150 python3 benchmarks/bench_decode_cuda_prev.py --prev _gpu_var/np2/decode.cu --shapes 0 1 2 3 \
  --bits 16 8 --per-split 512 2048 --no-triton --out "$OUT/bench_var.json" > "$OUT/bench_var.log" 2>&1
grep -v "^{" "$OUT/bench_var.log" | grep "|"
echo "variants done at $(( $(date +%s) - T0 )) s"
mkdir -p "$OUT/e2e"
timeout $(( $(left) - 10 )) python3 benchmarks/bench_e2e_gpu.py --budget-s $(( $(left) - 60 )) --compile-cells 0 --out "$OUT/e2e" \
  > "$OUT/e2e/log.txt" 2>&1; tail -40 "$OUT/e2e/log.txt"
echo "done at $(( $(date +%s) - T0 )) s"
