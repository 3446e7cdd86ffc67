#!/usr/bin/env bash
# GPU call (2026-12-06d; issue 19): the prefix kernel with its key planes staged in core matrices (one
# contiguous copy a tile, ldmatrix without padding) and one instance per radius mode (branch
# i19-layout). Checks side by side: bitwise A/B against main's extend.cu (.gpu/var/main), one pass and
# in chunks; the variant whose tiles arrive by one bulk copy on mbarriers (.gpu/var/tma: no CTA barrier
# in the tile loop) against the package, bitwise; the extend's GPU tests (EXT_TESTS, 12 shards) and
# its adversarial sweep. Then the issue's table with main's source and
# the bulk-copy variant timed in the same run (call 111 timed the layout alone). About 540 s.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
timeout 290 python3 scripts/gpu_extend_ab.py .gpu/var/main/extend.cu > "$OUT/ab_main.log" 2>&1 &
timeout 290 python3 scripts/gpu_extend_ab.py .gpu/var/main/extend.cu --chunked > "$OUT/ab_chunked.log" 2>&1 &
timeout 290 python3 scripts/gpu_extend_ab.py .gpu/var/tma/extend.cu > "$OUT/ab_tma.log" 2>&1 &
ext_checks 12 290 361
for f in ab_main ab_chunked ab_tma; do
  echo "A/B $f: $(tail -1 "$OUT/$f.log")  [$(grep -c 'same bits' "$OUT/$f.log") same, $(grep -c DIFFERENT "$OUT/$f.log") different]"
done
echo "checks at $(( $(date +%s) - T0 )) s"
TMA=../.gpu/var/tma/extend.cu  # timed only where its A/B passed (a hang would take the table's time)
grep -q "^56 of 56 cases bitwise equal" "$OUT/ab_tma.log" || TMA=
(cd benchmarks && timeout 230 python3 bench_extend.py --shapes 0,1,2 \
  --cuda-prev ../.gpu/var/main/extend.cu $TMA) > "$OUT/bench_extend.log" 2>&1
grep -vE "^\{|building" "$OUT/bench_extend.log" | tail -22
echo "done at $(( $(date +%s) - T0 )) s"
