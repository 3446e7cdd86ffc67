#!/usr/bin/env bash
# GPU call (2026-12-05h; issue 19): call 90 found the prefix kernel latency-bound at two warps per
# scheduler (Nsight: 0.59 eligible warps a cycle, issue slots 41% busy, the shared pipe 33%; removing
# the digits' shared loads (noqd) did not speed it up). This call times the measurement-only variants
# tn16 (16-token tiles: shared memory for three CTAs per SM, 218 registers) and tn16r168 (also capped
# at 168 registers: three CTAs, 20 spill instructions a tile) against main, twice, and reads their
# occupancy with Nsight Compute. No carry needed; timeout 400. At most 8 files come back.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
python3 benchmarks/floor_variants.py .gpu/fv > /dev/null
for r in 1 2; do
  (cd benchmarks && timeout 150 python3 bench_extend.py --bits 16 --shapes 0,1,2 \
    --cuda-prev ../.gpu/fv/tn16/extend.cu ../.gpu/fv/tn16r168/extend.cu) > "$OUT/bench_extend16_$r.log" 2>&1
  echo "== bench run $r"; grep -E "^(shape|Np)" "$OUT/bench_extend16_$r.log" | grep -v triton
done
echo "bench done at $(( $(date +%s) - T0 )) s"
for v in tn16 tn16r168; do
  (cd benchmarks && timeout 100 ncu --clock-control none --kernel-name regex:wc_extend_prefix --launch-skip 1 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section SchedulerStats --section LaunchStats \
    python3 profile_extend.py --shape 4096,512,32,8 --cert on --src ../.gpu/fv/$v/extend.cu) > "$OUT/ncu_$v.txt" 2>&1
  echo "== ncu $v"; grep -E "Duration|Registers Per|Block Limit|Achieved Occupancy|Eligible Warps|Issue Slots Busy|Local" "$OUT/ncu_$v.txt" | head -12
done
echo "done at $(( $(date +%s) - T0 )) s"
