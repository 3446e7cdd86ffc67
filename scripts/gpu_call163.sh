#!/usr/bin/env bash
# Ran as call 163 on a2612ca (BENCHMARKS 13av); the patch has been on main since then, so `git apply`
# refuses it on later commits: re-run it from a checkout of a2612ca.
# GPU call prepared in session 2026-12-07g (issue 19): the kept patch i19-fk2 (fp16 keys
# carrying their scales, the q.k in two halves of 64 channels; reports/gpu-2026-12-07g/fk2) checked and
# timed from main. Main's extend.cu and common.cuh are copied to /tmp/wc_main first, then the patch is
# applied to this copy with `git apply`.
# PART=all (default): the extend's GPU tests (EXT_TESTS, 16 shards of CHECK_T s, default 250) with its
# adversarial sweep (seed 425) beside them, the ids no shard passed (re-run them alone), then
# test_expm1_bound.py and test_extend_f16_keys.py; then RUNS (default 2) runs of bench_extend.py
# (SHAPES, default 0,1,2,6,5) with main's kernel and the one-accumulator kernel of 13at
# (reports/gpu-2026-12-07f/fk) timed beside the branch's through its launcher (timing only: their
# certificates are not valid there), each cell also with its GPU and host time per call
# (bench_extend.py --queued: is the slow mode of 13at the host's?).
# PART=quick: only the CUDA prefix tests (test_kernels_extend.py -k cuda: where the one accumulator
# failed the route's tightness, 13at; 16 shards of CHECK_T s, default 130) and the sweep, then the runs.
# After the checks, every PART: the host's time per call and its cProfile at 4096 + 512 and 32768 + 16
# (extend_host_cost.py --device cuda). PART=bench: the runs only. PREVS: the --cuda-prev files (default /tmp/wc_main/extend.cu and fk's).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
mkdir -p /tmp/wc_main && cp witcert/kernels/cuda/extend.cu witcert/kernels/cuda/common.cuh /tmp/wc_main/
git apply reports/gpu-2026-12-07g/fk2/i19-fk2.patch && echo "fk2 patch applied" || { echo "fk2 patch did not apply"; exit 1; }
case "${PART:-all}" in
  quick)
    run_shards ext 16 "${CHECK_T:-130}" tests/test_kernels_extend.py -k cuda
    ext_sweep_bg "${CHECK_T:-130}" 425
    wait; report_shards ext; tally_shards ext; not_passed tests/test_kernels_extend.py -k cuda
    grep -E "VIOLATION|certs|^ *triton_extend" "$OUT/sweep_extend.log" | tail -2 ;;
  all)
    ext_checks 16 "${CHECK_T:-250}" 425
    not_passed "${EXT_TESTS[@]}"; head -12 "$OUT/not_passed.txt"
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_expm1_bound.py tests/test_extend_f16_keys.py 2>&1 | tail -2 ;;
esac
echo "## checks done at $(( $(date +%s) - T0 )) s"
# where the host's time per call goes (real launches, cProfile; BENCHMARKS 13at's slow mode)
for sh in 4096,512,32,8 32768,16,32,8; do
  timeout 90 python3 benchmarks/extend_host_cost.py --device cuda --shape $sh --top 22 2>&1 | grep -v building \
    | cut -c1-150 > "$OUT/host_$sh.log"; head -30 "$OUT/host_$sh.log"
done
for run in $(seq 1 ${RUNS:-2}); do
  ext_bench_smi "$run" "${BENCH_T:-200}" "${SHAPES:-0,1,2,6,5}" ${PREVS:-/tmp/wc_main/extend.cu \
    ../reports/gpu-2026-12-07f/fk/extend.cu} --queued
  echo "## bench $run at $(( $(date +%s) - T0 )) s"; grep -v building "$OUT/bench_run$run.log" | grep -v "^{" | tail -31 | cut -c1-120
done
echo "done at $(( $(date +%s) - T0 )) s"
