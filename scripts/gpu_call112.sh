#!/usr/bin/env bash
# GPU call (2026-12-06d; issue 19): the prefix kernel whose staged tiles land by one bulk copy on
# mbarriers (no CTA barrier in its tile loop; branch i19-tma), keys and values in core matrices, one
# instance per radius mode. First a quick bitwise A/B against main's extend.cu (.gpu/var/main) on 4
# cases: should it differ or hang, the package becomes the build without bulk copies (.gpu/var/layout,
# branch i19-layout) for the rest of the call. Then side by side: the full A/B against main, the A/B
# against the layout build, the extend's GPU tests (EXT_TESTS, 12 shards) and its adversarial sweep;
# then the issue's table with main's source and the layout build timed in the same run. About 570 s.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
PREV=(../.gpu/var/main/extend.cu ../.gpu/var/layout/extend.cu)
timeout 80 python3 scripts/gpu_extend_ab.py .gpu/var/main/extend.cu 4 > "$OUT/ab_quick.log" 2>&1
echo "quick A/B: $(tail -1 "$OUT/ab_quick.log")"
if ! grep -q "^32 of 32 cases bitwise equal" "$OUT/ab_quick.log"; then
  cp .gpu/var/layout/extend.cu witcert/kernels/cuda/extend.cu
  PREV=(../.gpu/var/main/extend.cu)
  echo "FALLBACK: the package is the layout build (i19-layout) from here on"
else
  timeout 270 python3 scripts/gpu_extend_ab.py .gpu/var/layout/extend.cu > "$OUT/ab_layout.log" 2>&1 &
fi
timeout 270 python3 scripts/gpu_extend_ab.py .gpu/var/main/extend.cu > "$OUT/ab_main.log" 2>&1 &
ext_checks 12 270 361
for f in ab_main ab_layout; do
  [ -f "$OUT/$f.log" ] && echo "A/B $f: $(tail -1 "$OUT/$f.log")  [$(grep -c 'same bits' "$OUT/$f.log") same, $(grep -c DIFFERENT "$OUT/$f.log") different]"
done
echo "checks at $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout 200 python3 bench_extend.py --shapes 0,1,2 --cuda-prev "${PREV[@]}") > "$OUT/bench_extend.log" 2>&1
grep -vE "^\{|building" "$OUT/bench_extend.log" | tail -19
echo "done at $(( $(date +%s) - T0 )) s"
