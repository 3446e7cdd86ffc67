#!/usr/bin/env bash
# GPU call (review): the same-run tools after the review's built_from context manager, run against a
# copy of the current sources (_gpu_prev/dec, _gpu_prev/ext): the bitwise A/B must report every case
# equal, and the benchmarks' "now" and copy rows must time alike.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
timeout 150 python3 scripts/gpu_decode_ab.py _gpu_prev/dec/decode.cu > "$OUT/ab.log" 2>&1
tail -3 "$OUT/ab.log"; grep -c "same bits" "$OUT/ab.log"
timeout 45 python3 benchmarks/bench_decode_cuda_prev.py --prev _gpu_prev/dec/decode.cu --shapes 3 --bits 16 --no-triton \
  > "$OUT/bench_prev.log" 2>&1; grep "|" "$OUT/bench_prev.log"
timeout 60 python3 benchmarks/bench_extend.py --bits 16 --shapes 0 --cuda-prev _gpu_prev/ext/extend.cu > "$OUT/bench_extend.log" 2>&1
grep -v "^{" "$OUT/bench_extend.log" | tail -8
echo "done at $(( $(date +%s) - T0 )) s"
