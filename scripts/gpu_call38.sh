#!/usr/bin/env bash
# GPU call (issue 19): the CUDA extend without branches in its tile loop (the logits / radii outputs
# in their own instance, wc_extend_prefix<true>; dead tokens' expm1 and the overflow clamp by
# selects). The extend's GPU tests (13 shards) and its adversarial sweep alongside, then
# bench_extend against the previous kernel (_gpu_prev/head/extend.cu = git show
# ae33c2d:witcert/kernels/cuda/extend.cu) in the same run.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-560} - ($(date +%s) - T0) )); }
TS=${TESTS_S:-320}
ext_checks 13 $TS 79
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout $(( $(left) - 5 )) python3 benchmarks/bench_extend.py --bits 16 --shapes 0,1,3 --cuda-prev _gpu_prev/head/extend.cu \
  --out "$OUT/bench_extend.json" > "$OUT/bench_extend.log" 2>&1
grep -v "^{" "$OUT/bench_extend.log" | tail -16
echo "done at $(( $(date +%s) - T0 )) s"
