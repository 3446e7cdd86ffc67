#!/usr/bin/env bash
# GPU call prepared in session 2026-12-07f for the next (issue 19), not yet run: what that
# session's short device time left unchecked on main's leaner extend (BENCHMARKS 13ar).
# PART=bench: the issue's three shapes and the short turns (SHAPES, default 0,1,2,5,6), RUNS runs
# (default 3), main's kernel against the one before 13ar (reports/gpu-2026-12-07f/main) in the same
# runs, and the measurement-only `noscale` (reports/gpu-2026-12-07f/noscale: the chain scales' 128
# products a tile gone, the instruction stream of fp16 keys that carry their scales; its values are
# not valid) and `fk` (reports/gpu-2026-12-07f/fk: branch i19-fk's kernel, kept as a patch; timed
# here through main's launcher), with nvidia-smi beside each run (ext_bench_smi: clocks, power,
# throttle reasons; 13ap/13ar's slow mode is not the SM clock) and torch.profiler's kernel times of
# two shapes after each run (is the slow mode the host's?); about 60 s a run once built.
# PART=tests: every GPU test file (16 shards of CHECK_T s, default 380), the ids no shard passed
# listed (not_passed), the extend's adversarial sweep (seed 423) beside them.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
if [ "${PART:-bench}" = bench ]; then
  for run in $(seq 1 ${RUNS:-3}); do
    ext_bench_smi "$run" "${BENCH_T:-200}" "${SHAPES:-0,1,2,5,6}" ../reports/gpu-2026-12-07f/main/extend.cu \
      ../reports/gpu-2026-12-07f/noscale/extend.cu ../reports/gpu-2026-12-07f/fk/extend.cu
    echo "## bench $run at $(( $(date +%s) - T0 )) s"; grep -v building "$OUT/bench_run$run.log" | grep -v "^{" | tail -46
    awk -F', ' 'NR > 1 && $6 != "0x0000000000000000" && $6 != "" {print $6}' "$OUT/smi_run$run.csv" | sort | uniq -c | head -5
    # the GPU's own time per call (torch.profiler's kernel sums): a slow cell above that these do not
    # share is the host's (launches), not the kernels'
    (cd benchmarks && for sh in 4096,512,32,8 32768,16,32,8; do
       timeout 60 python3 profile_extend.py --kernels --shape $sh 2>&1 | grep -v building | tail -8; done) \
      > "$OUT/profile_run$run.log" 2>&1
    tail -18 "$OUT/profile_run$run.log"
  done
else
  all_tests_and_sweep "${CHECK_T:-380}" 423
fi
echo "done at $(( $(date +%s) - T0 )) s"
