#!/usr/bin/env bash
# GPU call (session of 2026-12-05g, issue 19): the CUDA extend's certificate skips expm1_up's exp
# where no lane of a warp needs it (bitwise the same values; BENCHMARKS 13r). Before the call, here:
#   mkdir -p .gpu/prev/ext_main .gpu/prev/ext_mut && git show main~N:witcert/kernels/cuda/{extend.cu,common.cuh}
# into ext_main (the source before the change) and a deliberately changed copy of the new source in ext_mut
# (the negative control of the A/B); carry .gpu/prev. Runs the bitwise A/B against both, the extend's
# GPU tests, the issue 19 table against ext_main in the same run, then Nsight Compute's stall
# samples per SASS instruction of the prefix kernel (where its time goes, for the next design).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
run_shards ext 14 ${EXT_T:-300} "${EXT_TESTS[@]}"
timeout 240 python3 scripts/gpu_extend_ab.py .gpu/prev/ext_main/extend.cu > "$OUT/ab.log" 2>&1
echo "== A/B: $(tail -1 "$OUT/ab.log")"; grep -E "DIFFERENT|Error" "$OUT/ab.log" | head -5
timeout 120 python3 scripts/gpu_extend_ab.py .gpu/prev/ext_mut/extend.cu 2 > "$OUT/ab_mutant.log" 2>&1
echo "== A/B against the mutant (must differ): $(tail -1 "$OUT/ab_mutant.log")"
wait; report_shards ext
grep -hE "::.* PASSED" /tmp/shard_ext_*.log | grep -o "tests/[^ ]*" | sort -u > "$OUT/passed.txt"
echo "passed $(wc -l < "$OUT/passed.txt") at $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout 150 python3 bench_extend.py --bits 16 --shapes 0,1,2 --cuda-prev ../.gpu/prev/ext_main/extend.cu \
  --out "$OUT/bench_extend16.jsonl") > "$OUT/bench_extend16.log" 2>&1
grep -E "^(shape|Np)" "$OUT/bench_extend16.log" | grep -v triton | tail -20
echo "bench done at $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout 120 ncu --clock-control none --kernel-name regex:wc_extend_prefix --launch-skip 1 --launch-count 1 \
  --section SourceCounters --section WarpStateStats -f -o "$OUT/prefix" python3 profile_extend.py --shape 4096,512,32,8 --cert on) \
  > "$OUT/ncu_collect.log" 2>&1
tail -2 "$OUT/ncu_collect.log"
timeout 60 ncu -i "$OUT/prefix.ncu-rep" --page source --csv --print-source sass > "$OUT/prefix_sass.csv" 2> "$OUT/ncu_src.err" \
  || timeout 60 ncu -i "$OUT/prefix.ncu-rep" --page source --csv > "$OUT/prefix_sass.csv" 2>> "$OUT/ncu_src.err"
echo "source page: $(wc -l < "$OUT/prefix_sass.csv") lines; $(head -c 300 "$OUT/ncu_src.err")"
echo "done at $(( $(date +%s) - T0 )) s"
