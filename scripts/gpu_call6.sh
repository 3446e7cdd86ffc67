#!/usr/bin/env bash
# GPU call (issues 14, 19): write and extend benchmarks, then the write / decode / extend tests
# (sharded) with the adversarial extend sweep in parallel.
source "$(dirname "$0")/gpu_common.sh"
if [ "${BENCH:-1}" = 1 ]; then
(cd benchmarks && timeout ${WB_S:-90} python3 bench_write.py) > "$OUT/bench.log" 2>&1
(cd benchmarks && timeout ${EB_S:-150} python3 bench_extend.py) >> "$OUT/bench.log" 2>&1
git show 4867c64:witcert/kernels/extend.py > /tmp/prev_extend.py; (cd benchmarks && timeout ${EP_S:-90} python3 bench_extend.py --shapes 0,2,1 --prev /tmp/prev_extend.py --plans) >> "$OUT/bench.log" 2>&1
(cd benchmarks && timeout ${DP_S:-200} python3 bench_decode_plans.py --plans ${PLANS:-64,4,2,168 64,4,2,128 32,4,2,128} \
   --out "$OUT/plans.jsonl") > "$OUT/plans.log" 2>&1
grep -v "^{" "$OUT/bench.log" | tail -40; sed -n '/^shape /,$p' "$OUT/plans.log"; grep -m3 -i "error\|Traceback" "$OUT/plans.log"
fi
[ "${TESTS:-1}" = 1 ] || exit 0
run_shards dec ${DEC_N:-4} ${TESTS_S:-280} tests/test_kernels_decode.py tests/test_cuda_graph.py tests/test_kernels_write.py
run_shards ext ${EXT_N:-7} ${EXT_S:-280} tests/test_kernels_extend.py
for s in ${SEEDS:-11 12 13 14}; do
  OMP_NUM_THREADS=1 timeout ${SWEEP_S:-240} python3 benchmarks/soundness_sweep.py --paths triton_extend --cases ${CASES:-4000} --seed $s \
    --out "/tmp/sweep_ext_s$s.jsonl" > "/tmp/sweep_ext_s$s.log" 2>&1 &
done
wait
report_shards dec ext
for s in ${SEEDS:-11 12 13 14}; do echo "### seed $s"; cat /tmp/sweep_ext_s$s.log; cat /tmp/sweep_ext_s$s.jsonl 2>/dev/null; done > "$OUT/sweep_ext.log"
cat /tmp/sweep_ext_s*.jsonl 2>/dev/null; grep -h "VIOLATION\|Traceback" /tmp/sweep_ext_s*.log | head -5
