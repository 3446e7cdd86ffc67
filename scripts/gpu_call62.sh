#!/usr/bin/env bash
# GPU call: write.cu with both sides' loads first and a CALLS parameter: its contract tests, then
# where its time goes (benchmarks/ablate_write_cuda.py) and Nsight Compute of one launch.
source "$(dirname "$0")/gpu_common.sh"
run_shards w 3 300 tests/test_cuda_write.py tests/test_kernels_write.py
wait; report_shards w
timeout 240 python3 benchmarks/ablate_write_cuda.py --out "$OUT/ablate_write_cuda.jsonl" > "$OUT/ablate_write_cuda.log" 2>&1
tail -18 "$OUT/ablate_write_cuda.log"
(cd benchmarks && timeout 150 ncu --clock-control none --kernel-name regex:wc_write_kernel --launch-skip 2 --launch-count 1 \
  $NCU_SECS --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  python3 ablate_write_cuda.py --profile 16) > "$OUT/ncu_write.txt" 2>&1
grep -E "$NCU_KEYS|DRAM Throughput" "$OUT/ncu_write.txt" | head -16
grep -E "stalled" "$OUT/ncu_write.txt" | sort -k3 -g -r | head -6
