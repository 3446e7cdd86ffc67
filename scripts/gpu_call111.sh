#!/usr/bin/env bash
# GPU call (2026-12-06d; issue 19): the prefix kernel's q.k on Hopper's warpgroup tensor cores (wgmma,
# sm_90a; branch i19-wgmma). Bitwise A/B against main's extend.cu (carried in .gpu/var/main) by the
# wgmma build and by the mma.sync route on the new key layout, and against the variant that keeps
# both halves' MMAs in flight (.gpu/var/pipe); then the issue's table with all of them timed in the
# same run (bench_extend.py, b 8). About 450 s.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
for v in "wgmma .gpu/var/main/extend.cu" "mmasync .gpu/var/main/extend.cu --mma-sync" "pipe .gpu/var/pipe/extend.cu"; do
  set -- $v; name=$1; shift
  timeout 150 python3 scripts/gpu_extend_ab.py "$@" > "$OUT/ab_$name.log" 2>&1
  echo "A/B $name (rc $?): $(tail -1 "$OUT/ab_$name.log")"
  grep -m3 "DIFFERENT\|Error\|error" "$OUT/ab_$name.log"
done
echo "A/Bs at $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout 330 python3 bench_extend.py --shapes 0,1,2 --cuda-mma-sync \
  --cuda-prev ../.gpu/var/main/extend.cu ../.gpu/var/pipe/extend.cu) > "$OUT/bench_extend.log" 2>&1
grep -vE "^\{|building" "$OUT/bench_extend.log" | tail -24
echo "done at $(( $(date +%s) - T0 )) s"
