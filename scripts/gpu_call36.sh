#!/usr/bin/env bash
# GPU call (issue 19): where the CUDA extend's cycles go after the integer pieces (ae33c2d):
# Nsight Compute's scheduler and warp-state sections for the prefix kernel, certificate on and
# off (4096 + 512, one launch, clocks unlocked as in call 29), then bench_extend with 8 warps per
# CTA beside the default 4 (two shapes).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
prof ext_default wc_extend_prefix profile_extend.py --shape 4096,512,32,8 --cert on
prof ext_default_off wc_extend_prefix profile_extend.py --shape 4096,512,32,8 --cert off
timeout 200 python3 benchmarks/bench_extend.py --bits 16 --shapes 0,1 --cuda-warps 8 --out "$OUT/bench_w8.json" \
  > "$OUT/bench_w8.log" 2>&1
tail -12 "$OUT/bench_w8.log"
echo "done at $(( $(date +%s) - T0 )) s"
