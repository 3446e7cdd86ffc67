#!/usr/bin/env bash
# GPU call (issue 19): the extend's GPU kernels one by one (torch.profiler), certificate on and off,
# at 4096 + 512 and 4096 + 2048: how much of an extend call is the CUDA prefix kernel and how much
# the Triton kernel of the exact new tokens and the small kernels around them.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
for sh in 4096,512,32,8 4096,2048,32,8; do
  for c in on off; do
    echo "## $sh cert $c"
    (cd benchmarks && timeout 120 python3 profile_extend.py --shape $sh --cert $c --reps 5 --kernels) > "$OUT/kernels_${sh//,/_}_$c.txt" 2>&1
    grep -vE "^-|^$" "$OUT/kernels_${sh//,/_}_$c.txt" | cut -c1-60,100-200 | head -14
  done
done
echo "done at $(( $(date +%s) - T0 )) s"
