#!/usr/bin/env bash
# GPU call (issue 19): where the CUDA extend's cycles go after the integer pieces (ae33c2d):
# Nsight Compute's scheduler and warp-state sections for the prefix kernel, certificate on and
# off (4096 + 512, one launch, clocks unlocked as in call 29), then bench_extend with 8 warps per
# CTA beside the default 4 (two shapes).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
SECS="--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats --section InstructionStats"
KEYS="Duration|Executed Ipc A|Issue Slots Busy|No Eligible|Active Warps Per|Eligible Warps|Issued Warp|Warp Cycles Per Issued|Achieved Occupancy|Registers Per|Executed Instructions  |Compute \(SM\) Throughput|Memory Throughput"
prof() {  # name, kernel regex, script, args...
  local name=$1 kern=$2; shift 2
  (cd benchmarks && timeout 150 ncu --clock-control none --kernel-name "$kern" --launch-skip 1 --launch-count 1 $SECS \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    python3 "$@") > "$OUT/ncu_$name.txt" 2>&1
  echo "## $name"; grep -E "$KEYS" "$OUT/ncu_$name.txt" | head -14
  grep -E "stalled" "$OUT/ncu_$name.txt" | sort -k3 -g -r | head -8
}
prof ext_default wc_extend_prefix profile_extend.py --shape 4096,512,32,8 --cert on
prof ext_default_off wc_extend_prefix profile_extend.py --shape 4096,512,32,8 --cert off
timeout 200 python3 benchmarks/bench_extend.py --bits 16 --shapes 0,1 --cuda-warps 8 --out "$OUT/bench_w8.json" \
  > "$OUT/bench_w8.log" 2>&1
tail -12 "$OUT/bench_w8.log"
echo "done at $(( $(date +%s) - T0 )) s"
