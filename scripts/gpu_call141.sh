#!/usr/bin/env bash
# GPU call (2026-12-07, issue 19): price the q.k routes at the current kernel (64-token tiles at 8
# warps where the grid fills): measurement-only variants of floor_variants.py against main's
# extend.cu in the same run: f16g (fp16 q.k, one accumulator per scale group), f16qk (fp16 q.k,
# one accumulator), noqk (no q.k: the floor of the rest of the tile loop).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
python3 benchmarks/floor_variants.py /tmp/fv > /dev/null
for r in 1; do
  (cd benchmarks && timeout 420 python3 bench_extend.py --bits 8 --shapes 0,1 --cuda-prev /tmp/fv/f16g/extend.cu /tmp/fv/f16qk/extend.cu /tmp/fv/noqk/extend.cu) \
    > "$OUT/bench_run$r.log" 2>&1
  echo "## run $r at $(( $(date +%s) - T0 )) s"; grep -vE "^\{|building" "$OUT/bench_run$r.log" | grep -v triton | tail -30
done
echo "done at $(( $(date +%s) - T0 )) s"
