#!/usr/bin/env bash
# GPU call (2026-12-07e; issue 19, branch i19-onekey): the prefix kernel's q.k on one fp16 key a
# channel (hi; the rest's norm per group L_g carried by the radius through Cauchy-Schwarz).
# (1) Timed, b 8, RUNS runs (call 153: RUNS=1), the issue's 512-token shapes: the branch against
# main's kernel (reports/gpu-2026-12-07e/main) and the chain-by-chain q.k alone (chainq: main's
# kernel with only the q.k's order changed), SDPA fp16 in the same run. (2) The extend's GPU tests
# (14 shards; call 153: CHECK_T=240) with the adversarial sweep beside them.
# Ran as `RUNS=1 CHECK_T=240 bash scripts/gpu_call153.sh` (the session's device time was short);
# logs in reports/gpu-2026-12-07e/call153.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
V=reports/gpu-2026-12-07e
for run in $(seq 1 ${RUNS:-2}); do
  (cd benchmarks && timeout 150 python3 bench_extend.py --bits 8 --shapes ${SHAPES:-0,1} --no-triton \
     --cuda-prev ../$V/main/extend.cu ../$V/chainq/extend.cu) > "$OUT/bench_run$run.log" 2>&1
  echo "## bench $run at $(( $(date +%s) - T0 )) s"; grep -v building "$OUT/bench_run$run.log" | grep -v "^{" | tail -26
done
echo "## checks from $(( $(date +%s) - T0 )) s"
ext_checks 14 ${CHECK_T:-270} 419
echo "done at $(( $(date +%s) - T0 )) s"
