#!/usr/bin/env bash
# GPU call (issue 14): the decode kernel against its previous version (benchmarks/_prev_decode.py,
# e.g. git show REV:witcert/kernels/decode.py), same run, then the decode / graph / write tests.
source "$(dirname "$0")/gpu_common.sh"
(cd benchmarks && timeout ${BENCH_S:-210} python3 bench_decode_plans.py --prev _prev_decode.py --plans \
  --out "$OUT/plans.jsonl") > "$OUT/plans.log" 2>&1
sed -n '/^shape /,$p' "$OUT/plans.log"; grep -m3 -i "error\|Traceback" "$OUT/plans.log"
run_shards dec ${DEC_N:-6} ${TESTS_S:-160} tests/test_kernels_decode.py tests/test_cuda_graph.py tests/test_kernels_write.py
wait
report_shards dec
