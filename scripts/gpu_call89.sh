#!/usr/bin/env bash
# GPU call (prepared 2026-12-05g for the next GPU session; issue 19, branch i19-expm1): the CUDA
# extend's certificate term by expm1_up_exp (the exp route alone plus 2^-20; PROOFS 5.5), and one barrier
# a tile instead of two (tile it + 1's copies issued after the barrier that publishes tile it; no value
# changes: bitwise A/B against the branch's first commit 2656eb6, and timed beside it), and the
# measurement-only variant f16qk (floor_variants.py: the price of the fp16 route of 13s). Also the
# decode A/B that 13o meant to run and that the build-cache defect of 13r made void. Before the call,
# here (on the branch):
#   mkdir -p .gpu/prev/ext_main .gpu/prev/expm1 && for f in extend.cu common.cuh; do
#     git show main:witcert/kernels/cuda/$f > .gpu/prev/ext_main/$f; git show 2656eb6:witcert/kernels/cuda/$f > .gpu/prev/expm1/$f; done
# and pass carry [".gpu/prev"] (.gpu/prev/ext0 holds 763b328's decode.cu / common.cuh). At most 8 files
# come back from $OUT: this script leaves 7.
source "$(dirname "$0")/gpu_common.sh"
[ -f .gpu/prev/ext_main/extend.cu ] && [ -f .gpu/prev/expm1/extend.cu ] && [ -f .gpu/prev/ext0/decode.cu ] || { echo "no .gpu/prev: see the header"; exit 1; }
T0=$(date +%s); ET=${EXT_T:-240}  # about 480 s in all: run it with timeout 560
timeout 120 python3 -m pytest -q -s -rfE -p no:cacheprovider tests/test_expm1_bound.py > "$OUT/probe.log" 2>&1
echo "== probe: $(tail -1 "$OUT/probe.log")"; grep -E "margin|^FAILED|Error" "$OUT/probe.log" | head -5
grep -q " failed" "$OUT/probe.log" && { echo "the bound failed on the device: stop"; exit 1; }
( timeout 200 python3 scripts/gpu_decode_ab.py .gpu/prev/ext0/decode.cu > "$OUT/ab_decode.log" 2>&1
  timeout 200 python3 scripts/gpu_extend_ab.py .gpu/prev/expm1/extend.cu > "$OUT/ab_extend.log" 2>&1 ) &
ext_checks 12 "$ET" ${SEED:-341}
wait
echo "== decode A/B against 763b328: $(tail -1 "$OUT/ab_decode.log")"; grep -E "DIFFERENT|Error" "$OUT/ab_decode.log" | head -5
echo "== extend A/B, one barrier against two: $(tail -1 "$OUT/ab_extend.log")"; grep -E "DIFFERENT|Error" "$OUT/ab_extend.log" | head -5
echo "checks done at $(( $(date +%s) - T0 )) s"
python3 benchmarks/floor_variants.py .gpu/fv > /dev/null  # f16qk: the price of BENCHMARKS 13s's fp16 route
(cd benchmarks && timeout 180 python3 bench_extend.py --bits 16 --shapes 0,1,2 --cuda-prev ../.gpu/prev/ext_main/extend.cu \
  ../.gpu/prev/expm1/extend.cu ../.gpu/fv/f16qk/extend.cu) \
  > "$OUT/bench_extend16.log" 2>&1
grep -E "^(shape|Np)" "$OUT/bench_extend16.log" | grep -v triton | tail -20
(cd benchmarks && timeout 40 python3 profile_extend.py --shape 4096,512,32,8 --cert on --reps 3 --kernels) \
  > "$OUT/kernels.txt" 2>&1
grep -E "wc_extend|_extend_kernel|_new_key_stats" "$OUT/kernels.txt" | cut -c1-60,100-170
cat "$OUT/probe.log" "$OUT/ab_decode.log" "$OUT/ab_extend.log" > "$OUT/probe_and_ab.log" && rm "$OUT/probe.log" "$OUT/ab_"*.log
echo "done at $(( $(date +%s) - T0 )) s"
