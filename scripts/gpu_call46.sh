#!/usr/bin/env bash
# GPU call (issue 19): the extend's radius sums on tensor cores (tf32 mma, inputs rounded up; the
# accumulation model's probe test). The extend's GPU tests (13 shards, the probe among them) and
# its adversarial sweep alongside, then bench_extend against the staged kernel without it
# (_gpu_prev/staged = 77288cb's extend.cu and common.cuh) and the kernel of the session's start
# (_gpu_prev/head = 33af663's) in the same run.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-570} - ($(date +%s) - T0) )); }
timeout 100 python3 -m pytest -q -s -p no:cacheprovider tests/test_kernels_extend.py -k accumulation > "$OUT/probe.log" 2>&1
tail -3 "$OUT/probe.log"
ext_checks 13 ${TESTS_S:-300} 89
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout $(( $(left) - 5 )) python3 benchmarks/bench_extend.py --bits 16 --shapes 0,1,3 \
  --cuda-prev _gpu_prev/staged/extend.cu _gpu_prev/head/extend.cu --out "$OUT/bench_extend.json" > "$OUT/bench_extend.log" 2>&1
grep -v "^{" "$OUT/bench_extend.log" | grep -v triton | tail -14
echo "done at $(( $(date +%s) - T0 )) s"
