#!/usr/bin/env bash
# GPU call (2026-12-05j; issues 14, 19): the measurements behind the GPU's dither bits (issue 14,
# item 2: "choose the GPU default from measured speed and measured coverage/tightness"): the
# decode's issue table (b16 and b8, certificate on and off), the extend at b16 and at b8, and the
# write at both. About 330 s; no carry; timeout 590.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
decode_table 200 14
echo "decode done at $(( $(date +%s) - T0 )) s"
for b in 16 8; do
  (cd benchmarks && timeout 150 python3 bench_extend.py --bits $b --shapes 0,1,2) > "$OUT/bench_extend$b.log" 2>&1
  grep -vE "^\{|building" "$OUT/bench_extend$b.log" | tail -8
  echo "extend b$b done at $(( $(date +%s) - T0 )) s"
done
(cd benchmarks && timeout 120 python3 bench_write.py) > "$OUT/bench_write.log" 2>&1
grep -vE "^\{|building" "$OUT/bench_write.log" | tail -10
echo "done at $(( $(date +%s) - T0 )) s"
