#!/usr/bin/env bash
# GPU call (session of 2026-12-05g, issue 19): the CUDA extend issues the next tile's copies after the
# tile's integer dots instead of at the top of the loop (no value changes; BENCHMARKS 13r). Before
# the call, here: .gpu/prev/ext_main = the extend.cu / common.cuh before the change, .gpu/prev/ext_mut =
# the new source with expm1_up's exp branch inflated by 2^-11 instead of 2^-12 (the A/B's negative
# control: it must differ); carry .gpu/prev. At most 8 files come back from $OUT.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
timeout 200 python3 scripts/gpu_extend_ab.py .gpu/prev/ext_main/extend.cu > "$OUT/ab.log" 2>&1
echo "== A/B: $(tail -1 "$OUT/ab.log")"; grep -E "DIFFERENT|Error" "$OUT/ab.log" | head -5
timeout 100 python3 scripts/gpu_extend_ab.py .gpu/prev/ext_mut/extend.cu 2 > "$OUT/ab_mutant.log" 2>&1
echo "== A/B against the mutant (must differ): $(tail -1 "$OUT/ab_mutant.log")"
echo "A/B done at $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout 150 python3 bench_extend.py --bits 16 --shapes 0,1,2 --cuda-prev ../.gpu/prev/ext_main/extend.cu \
  --out "$OUT/bench_extend16.jsonl") > "$OUT/bench_extend16.log" 2>&1
grep -E "^(shape|Np)" "$OUT/bench_extend16.log" | grep -v triton | tail -20
echo "done at $(( $(date +%s) - T0 )) s"
