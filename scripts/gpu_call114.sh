#!/usr/bin/env bash
# GPU call (2026-12-06d; issue 19): with the tiles by bulk copies and no CTA barrier in the tile loop,
# 8 warps per CTA again (13t: 5-9% slower with two barriers a tile): the issue's table at 4 and 8
# warps in the same run, then the bitwise A/B of the 8-warp build against main's extend.cu
# (.gpu/var/main; a row's values do not depend on the rows a CTA holds). About 220 s.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
(cd benchmarks && timeout 120 python3 bench_extend.py --shapes 0,1,2 --cuda-warps 8) > "$OUT/bench_extend.log" 2>&1
grep -vE "^\{|building" "$OUT/bench_extend.log" | grep -v triton | tail -13
timeout 170 python3 scripts/gpu_extend_ab.py .gpu/var/main/extend.cu --warps 8 > "$OUT/ab_w8.log" 2>&1
echo "A/B w8: $(tail -1 "$OUT/ab_w8.log")  [$(grep -c 'same bits' "$OUT/ab_w8.log") same, $(grep -c DIFFERENT "$OUT/ab_w8.log") different]"
echo "done at $(( $(date +%s) - T0 )) s"
