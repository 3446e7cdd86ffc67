#!/usr/bin/env bash
# GPU call (2026-12-06f; issue 19; branch i19-prologue): what is left of the prefix kernel's prologue
# after call 124's change. Nsight Compute on one launch at 4096 + 512, cert on (as call 117), and the
# kernels one by one at 4096 + 512. About 70 s.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
ncu_prefix prefix --shape 4096,512,32,8 --bits 8 --cert on
(cd benchmarks && timeout 60 python3 profile_extend.py --shape 4096,512,32,8 --bits 8 --cert on --reps 3 --kernels) \
  > "$OUT/kernels_4096_512_on.txt" 2>&1
grep -E "wc_extend|_extend_kernel|_new_key|Self CUDA time total" "$OUT/kernels_4096_512_on.txt" | cut -c1-60,100-170
echo "done at $(( $(date +%s) - T0 )) s"
