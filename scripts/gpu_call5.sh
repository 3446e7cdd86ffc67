#!/usr/bin/env bash
# GPU call (issues 14, 19): write-kernel variants + ncu, then the decode / graph / write tests
# on the shipped kernel, then the extend GPU matrix (timeboxed).
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/witcert_gpu}; mkdir -p "$OUT"
{ date -u; nvidia-smi -L; git log --oneline -1 2>/dev/null
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee "$OUT/env.log"
if [ "${SKIP_WRITE:-0}" = 0 ]; then
(cd benchmarks && timeout ${WV_S:-200} python3 ablate_write.py) > "$OUT/write_variants.log" 2>&1
sed -n '/^case /,$p' "$OUT/write_variants.log"; grep -m3 -i "error\|Traceback\|FAILED" "$OUT/write_variants.log"
for v in ${NCU_VARIANTS:-base:16:16:4}; do IFS=: read n b r w <<< "$v"
  (cd benchmarks && timeout 90 ncu --kernel-name regex:_write_kernel --launch-skip 1 --launch-count 1 \
     --section SpeedOfLight --section ComputeWorkloadAnalysis --section InstructionStats --section WarpStateStats \
     --section Occupancy --section LaunchStats --section SchedulerStats --section MemoryWorkloadAnalysis \
     python3 ablate_write.py --profile $n $b $r $w) > "$OUT/ncu_write_$n.log" 2>&1
  echo "== ncu $v"; grep -E "Duration|Registers Per|Achieved Occupancy|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Executed Ipc A|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Executed Instructions  |Theoretical Occ|Stall|Pipe" "$OUT/ncu_write_$n.log" | head -30
done
fi
# the tests, sharded over the machine's cores (WITCERT_SHARD, tests/conftest.py): the exact-TV
# checks run on the CPU, the kernels share the GPU
run_shards() {  # name, shards, timeout, pytest args...
  local name=$1 n=$2 t=$3; shift 3
  for i in $(seq 0 $((n - 1))); do
    OMP_NUM_THREADS=1 WITCERT_SHARD=$i/$n timeout $t python3 -m pytest -v -rfE -p no:cacheprovider "$@" > "/tmp/shard_${name}_$i.log" 2>&1 &
  done
}
run_shards dec ${DEC_N:-4} ${TESTS_S:-300} tests/test_kernels_decode.py tests/test_cuda_graph.py tests/test_kernels_write.py
run_shards ext ${EXT_N:-7} ${EXT_S:-300} tests/test_kernels_extend.py
run_shards fp ${FP_N:-4} ${FP_S:-300} tests/test_fp_soundness.py -k "triton"
wait
for name in dec ext fp; do
  for f in /tmp/shard_${name}_*.log; do echo "### $f"; cat "$f"; done > "$OUT/tests_$name.log"
  echo "== $name: $(grep -hE ' in [0-9.]+s' /tmp/shard_${name}_*.log | tr '\n' ';')"
  grep -h "^FAILED\|^ERROR" /tmp/shard_${name}_*.log | head -10
done
