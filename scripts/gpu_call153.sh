#!/usr/bin/env bash
# GPU call (2026-12-07e; issue 19, branch i19-onekey): the prefix kernel's q.k on one fp16 key a
# channel (hi; the rest's norm per group L_g carried by the radius through Cauchy-Schwarz).
# (1) Timed, b 8, two runs, the issue's 512-token shapes: the branch against main's kernel
# (reports/gpu-2026-12-07e/main), the chain-by-chain q.k alone (chainq) and two measurement-only
# variants of chainq in run 1 where VARIANTS=1 (linterm: the certificate's term p u; nocap: no NaN cap), SDPA fp16 in
# the same run. (2) Where KERNELS=on, the extend's kernels one by one at 4096 + 512 (torch.profiler). (3) The extend's GPU tests
# (12 shards) with the adversarial sweep beside them.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
V=reports/gpu-2026-12-07e
for run in $(seq 1 ${RUNS:-2}); do
  more=""; [ $run = 1 ] && [ -n "${VARIANTS:-}" ] && more="../$V/linterm/extend.cu ../$V/nocap/extend.cu"
  (cd benchmarks && timeout 150 python3 bench_extend.py --bits 8 --shapes ${SHAPES:-0,1} --no-triton \
     --cuda-prev ../$V/main/extend.cu ../$V/chainq/extend.cu $more) \
     > "$OUT/bench_run$run.log" 2>&1
  echo "## bench $run at $(( $(date +%s) - T0 )) s"; grep -v building "$OUT/bench_run$run.log" | grep -v "^{" | tail -26
done
for c in ${KERNELS:-}; do
  (cd benchmarks && timeout 60 python3 profile_extend.py --shape 4096,512,32,8 --bits 8 --cert $c --reps 3 --kernels) \
    > "$OUT/kernels_4096_512_$c.txt" 2>&1
  echo "## kernels 4096+512 cert $c"; grep -E "wc_extend|_kernel|Self CUDA time total" "$OUT/kernels_4096_512_$c.txt" | cut -c1-60,100-190 | head -8
done
echo "## checks from $(( $(date +%s) - T0 )) s"
ext_checks 14 ${CHECK_T:-270} 419
echo "done at $(( $(date +%s) - T0 )) s"
