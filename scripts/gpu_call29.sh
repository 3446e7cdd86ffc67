#!/usr/bin/env bash
# GPU call (issues 19, 14): where the CUDA extend's cycles go, for the shipped kernel and for its
# skeleton (floor_variants.py r0codes, certificate off: no Philox work, no dither planes, one digit),
# and the decode's skeleton against the shipped decode: Nsight Compute's scheduler and warp-state
# sections, one launch each (4096 + 512; B16 S4096), clocks unlocked as in 4j.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
FV=/tmp/fv; python3 benchmarks/floor_variants.py $FV > "$OUT/floor_variants.log" 2>&1
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
prof ext_r0codes_off wc_extend_prefix profile_extend.py --shape 4096,512,32,8 --cert off --src $FV/r0codes/extend.cu
prof dec_r0codes_off regex:wc_decode_split profile_decode.py --shape 16,32,8,4096 --bits 16 --cert off --src $FV/r0codes/decode.cu
prof dec_default regex:wc_decode_split profile_decode.py --shape 16,32,8,4096 --bits 16 --cert on
echo "done at $(( $(date +%s) - T0 )) s"
