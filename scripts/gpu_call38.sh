#!/usr/bin/env bash
# GPU call (issue 19): the CUDA extend without branches in its tile loop (the logits / radii outputs
# in their own instance, wc_extend_prefix<true>; dead tokens' expm1 and the overflow clamp by
# selects). The extend's GPU tests (13 shards) and its adversarial sweep alongside, then
# bench_extend against the previous kernel (_gpu_prev/head/extend.cu = git show
# ae33c2d:witcert/kernels/cuda/extend.cu) in the same run.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-560} - ($(date +%s) - T0) )); }
TS=${TESTS_S:-320}
run_shards ext 13 $TS tests/test_kernels_extend.py tests/test_backend_extend.py tests/test_fp_soundness.py -k "extend or Extend"
timeout $TS python3 benchmarks/soundness_sweep.py --paths triton_extend --seed 79 --max-seconds $((TS - 40)) > "$OUT/sweep_extend.log" 2>&1 &
wait; report_shards ext
grep -hE "::.* PASSED" /tmp/shard_ext_*.log | grep -o "tests/[^ ]*" | sort -u > "$OUT/passed.txt"; echo "passed $(wc -l < "$OUT/passed.txt")"
grep -E "VIOLATION|certs|^ *triton_extend" "$OUT/sweep_extend.log" | tail -4
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout $(( $(left) - 5 )) python3 benchmarks/bench_extend.py --bits 16 --shapes 0,1,3 --cuda-prev _gpu_prev/head/extend.cu \
  --out "$OUT/bench_extend.json" > "$OUT/bench_extend.log" 2>&1
grep -v "^{" "$OUT/bench_extend.log" | tail -16
echo "done at $(( $(date +%s) - T0 )) s"
