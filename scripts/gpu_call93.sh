#!/usr/bin/env bash
# GPU call (2026-12-05h; issue 19, main): the Triton kernel of the exact new tokens (the causal phase
# behind the CUDA prefix kernel) was last tuned in 13g, before its q.k moved to tensor cores (13q).
# Its tiles re-measured (the default block_m 32 x block_n 32 x 4 warps against six others), and the
# kernels one by one at 4096 + 2048, where the causal phase is largest. No carry; timeout 300.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
(cd benchmarks && timeout 200 python3 bench_extend.py --bits 16 --shapes 2,0 \
  --auto-plans 64,32,4 32,64,4 64,64,4 64,32,8 128,64,8 16,32,4) > "$OUT/bench_plans.log" 2>&1
grep -E "^(shape|Np)" "$OUT/bench_plans.log" | grep -v "triton\|m16 n32\|m64 n32 w4 cert\|m32 n64\|m64 n64" ; grep -E "auto" "$OUT/bench_plans.log" | grep -E "^Np" | head -30
echo "bench done at $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout 60 python3 profile_extend.py --shape 4096,2048,32,8 --cert on --reps 3 --kernels) > "$OUT/kernels_4096_2048.txt" 2>&1
grep -E "wc_extend|_extend_kernel|_new_key_stats" "$OUT/kernels_4096_2048.txt" | cut -c1-60,100-170
echo "done at $(( $(date +%s) - T0 )) s"
