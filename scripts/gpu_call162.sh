#!/usr/bin/env bash
# GPU call of session 2026-12-07g (issue 19): gpu_call161.sh's timing, then branch i19-fk's checks.
# PART=bench (default): gpu_call161.sh PART=bench (RUNS runs, default 2), main's extend against the
# kernel before 13ar, the measurement-only `noscale` and the kept patch's `fk` kernel, in the same runs.
# PART=fk: the kept patch (reports/gpu-2026-12-07f/fk/i19-fk.patch) applied to this copy with
# `git apply`, then the extend's GPU tests (EXT_TESTS, 15 shards of CHECK_T s, default 240) and its
# adversarial sweep (seed 424) beside them, the ids no shard passed, then test_expm1_bound.py and
# test_extend_f16_keys.py (the patch's specification) on the device.
# PART=tests: gpu_call161.sh PART=tests (every GPU test file on the tree as sent).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
case "${PART:-bench}" in
  bench) RUNS=${RUNS:-2} PART=bench bash "$(dirname "$0")/gpu_call161.sh" ;;
  fk)
    git apply reports/gpu-2026-12-07f/fk/i19-fk.patch && echo "fk patch applied" || { echo "fk patch did not apply"; exit 1; }
    ext_checks 15 "${CHECK_T:-240}" 424
    not_passed "${EXT_TESTS[@]}"; head -20 "$OUT/not_passed.txt"
    timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_expm1_bound.py tests/test_extend_f16_keys.py 2>&1 | tail -4 ;;
  tests) PART=tests bash "$(dirname "$0")/gpu_call161.sh" ;;
esac
echo "done at $(( $(date +%s) - T0 )) s"
