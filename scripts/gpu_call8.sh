#!/usr/bin/env bash
# GPU call (issue 14): the decode kernel against its previous version (benchmarks/_prev_decode.py,
# e.g. git show REV:witcert/kernels/decode.py), same run, then the decode / graph / write tests.
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/witcert_gpu}; mkdir -p "$OUT"
{ date -u; nvidia-smi -L; } | tee "$OUT/env.log"
(cd benchmarks && timeout ${BENCH_S:-210} python3 bench_decode_plans.py --prev _prev_decode.py --plans \
  --out "$OUT/plans.jsonl") > "$OUT/plans.log" 2>&1
sed -n '/^shape /,$p' "$OUT/plans.log"; grep -m3 -i "error\|Traceback" "$OUT/plans.log"
for i in 0 1 2 3 4 5; do
  OMP_NUM_THREADS=1 WITCERT_SHARD=$i/6 timeout ${TESTS_S:-160} python3 -m pytest -v -rfE -p no:cacheprovider \
    tests/test_kernels_decode.py tests/test_cuda_graph.py tests/test_kernels_write.py > "/tmp/shard_$i.log" 2>&1 &
done
wait
cat /tmp/shard_*.log > "$OUT/tests_dec.log"
grep -hE ' in [0-9.]+s' /tmp/shard_*.log; grep -h "^FAILED\|^ERROR" /tmp/shard_*.log | head
