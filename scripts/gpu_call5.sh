#!/usr/bin/env bash
# GPU call (issues 14, 19): write-kernel variants + ncu, then the decode / graph / write tests
# on the shipped kernel, then the extend GPU matrix (timeboxed).
source "$(dirname "$0")/gpu_common.sh"
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
run_shards dec ${DEC_N:-4} ${TESTS_S:-300} tests/test_kernels_decode.py tests/test_cuda_graph.py tests/test_kernels_write.py
run_shards ext ${EXT_N:-7} ${EXT_S:-300} tests/test_kernels_extend.py
run_shards fp ${FP_N:-4} ${FP_S:-300} tests/test_fp_soundness.py -k "triton"
wait
report_shards dec ext fp
