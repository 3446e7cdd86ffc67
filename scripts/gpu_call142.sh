#!/usr/bin/env bash
# GPU call (2026-12-07, issue 19, branch i19-f16keys): the CUDA extend's prefix kernel with fp16
# keys in code units (q.k on fp16 tensor cores, one accumulator per 32-channel chain, PROOFS 5.4).
# (1) Timed against main's extend.cu (aligned keys; reports/gpu-2026-12-07/main_extend.cu, built
# with the same common.cuh) in the same run, the issue's shapes, b 8, plus the noqk floor.
# (2) The extend's GPU tests and its adversarial sweep. (3) A second timing run if time is left.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
python3 benchmarks/floor_variants.py /tmp/fv > /dev/null
(cd benchmarks && timeout 240 python3 bench_extend.py --bits 8 --shapes 0,1 \
   --cuda-prev ../reports/gpu-2026-12-07/main_extend.cu /tmp/fv/noqk/extend.cu) > "$OUT/bench_run1.log" 2>&1
echo "## bench 1 at $(( $(date +%s) - T0 )) s"; grep -vE "^\{|building" "$OUT/bench_run1.log" | grep -v triton | tail -16
ext_checks 16 200 411
echo "## checks at $(( $(date +%s) - T0 )) s"
if [ $(( $(date +%s) - T0 )) -lt 400 ]; then
  (cd benchmarks && timeout 150 python3 bench_extend.py --bits 8 --shapes 0,1,2 \
     --cuda-prev ../reports/gpu-2026-12-07/main_extend.cu) > "$OUT/bench_run2.log" 2>&1
  echo "## bench 2 at $(( $(date +%s) - T0 )) s"; grep -vE "^\{|building" "$OUT/bench_run2.log" | grep -v triton | tail -16
fi
echo "done at $(( $(date +%s) - T0 )) s"
