#!/usr/bin/env bash
# GPU call: write.cu with 32-bit row indices: its contract tests, the ablation (CUDA vs Triton vs
# copy), Nsight Compute of one launch, and the SASS opcode histogram of the b = 16 build.
source "$(dirname "$0")/gpu_common.sh"
run_shards w 3 300 tests/test_cuda_write.py tests/test_kernels_write.py
wait; report_shards w
timeout 240 python3 benchmarks/ablate_write_cuda.py --out "$OUT/ablate_write_cuda.jsonl" > "$OUT/ablate_write_cuda.log" 2>&1
tail -20 "$OUT/ablate_write_cuda.log"
(cd benchmarks && timeout 150 ncu --clock-control none --kernel-name regex:wc_write_kernel --launch-skip 2 --launch-count 1 \
  $NCU_SECS --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  python3 ablate_write_cuda.py --profile 16) > "$OUT/ncu_write.txt" 2>&1
grep -E "Duration|Executed Instructions  |Issued Warp Per|DRAM Throughput|Registers Per" "$OUT/ncu_write.txt" | head -8
CUOBJ=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)
for so in $(ls -t ~/.cache/witcert/cuda/write_*.so 2>/dev/null); do
  "$CUOBJ" -sass "$so" > "$OUT/sass_$(basename "$so" .so).txt" 2>&1
done
ls -la "$OUT"/sass_* 2>/dev/null | head
f=$(ls -S "$OUT"/sass_*.txt 2>/dev/null | head -1); [ -n "$f" ] && grep -oE "^\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P[0-9T] )?[A-Z0-9]+(\.[A-Z0-9_]+)*" "$f" \
  | awk '{print $NF}' | sed 's/\..*//' | sort | uniq -c | sort -rn | head -30
