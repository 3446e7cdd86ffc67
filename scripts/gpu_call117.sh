#!/usr/bin/env bash
# GPU call (2026-12-06e; issue 19): main after the merge of i19-newtok. First where the prefix
# kernel's tile loop waits now that its tiles land by bulk copies (Nsight Compute's stall samples on
# one launch at 4096 + 512, cert on; benchmarks/ncu_stalls.py reads the source page), then every GPU
# test file except the extend's (EXT_TESTS ran in call 116 on the same extend.py), 15 shards.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
(cd benchmarks && timeout 150 ncu --clock-control none --kernel-name regex:wc_extend_prefix --launch-skip 1 --launch-count 1 \
  --section SourceCounters --section WarpStateStats --section SpeedOfLight --section Occupancy --section SchedulerStats \
  -f -o "$OUT/prefix" python3 profile_extend.py --shape 4096,512,32,8 --bits 8 --cert on) > "$OUT/ncu_collect.log" 2>&1
tail -2 "$OUT/ncu_collect.log"
timeout 60 ncu -i "$OUT/prefix.ncu-rep" --page source --csv --print-source sass > "$OUT/prefix_sass.csv" 2> "$OUT/ncu_src.err"
timeout 60 ncu -i "$OUT/prefix.ncu-rep" > "$OUT/ncu_details.txt" 2>&1
grep -iE "Duration|Issue Slots|Issued Ipc|Eligible|No Eligible|Occupancy|Registers|Throughput" "$OUT/ncu_details.txt" | head -24
(cd benchmarks && python3 ncu_stalls.py "$OUT/prefix_sass.csv" --top 12) 2>&1 | tee "$OUT/stalls.txt" | head -24
gzip -f "$OUT/prefix_sass.csv"; rm -f "$OUT/prefix.ncu-rep"
echo "profiled at $(( $(date +%s) - T0 )) s"
EXT=(tests/test_kernels_extend.py tests/test_fp_soundness.py)
REST=()
for f in "${ALL_GPU_TESTS[@]}"; do [[ " ${EXT[*]} " == *" $f "* ]] || REST+=("$f"); done
run_shards all 15 ${TESTS_S:-330} "${REST[@]}"
wait; report_shards all
tally_shards all
echo "done at $(( $(date +%s) - T0 )) s"
