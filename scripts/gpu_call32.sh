#!/usr/bin/env bash
# GPU call (issue 19): the extend test shard of call 31 that ran out of time (5 of 12), alone, with
# room: the same selection (test_kernels_extend.py, test_backend_extend.py, the extend families of
# test_fp_soundness.py).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
OMP_NUM_THREADS=4 WITCERT_SHARD=5/12 timeout ${TS:-420} python3 -m pytest -v -rfE -p no:cacheprovider \
  tests/test_kernels_extend.py tests/test_backend_extend.py tests/test_fp_soundness.py -k "extend or Extend" \
  > "$OUT/tests_ext_shard5.log" 2>&1
grep -E "PASSED|FAILED|ERROR" "$OUT/tests_ext_shard5.log" | sed 's/.*:://' | cut -c1-110; tail -1 "$OUT/tests_ext_shard5.log"
echo "done at $(( $(date +%s) - T0 )) s"
