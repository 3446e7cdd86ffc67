#!/usr/bin/env bash
# GPU call (issue 19): the Triton extend's exact new tokens with one radius per row (witcert/kernels/
# extend.py; PROOFS 5.4). The extend's GPU tests (sharded) and its adversarial sweep alongside, then,
# alone on the GPU, bench_extend against the previous extend.py (_gpu_prev/ext_prev.py = git show
# 8c61e4f:witcert/kernels/extend.py) in the same run, and the kernels one by one at 4096 + 2048.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - T0) )); }
TS=${TESTS_S:-290}
ext_checks 12 $TS 317
timeout $(( $(left) - 70 )) python3 benchmarks/bench_extend.py --bits 16 --shapes 0,1,2 --prev _gpu_prev/ext_prev.py \
  --out "$OUT/bench_extend.json" > "$OUT/bench_extend.log" 2>&1
tail -22 "$OUT/bench_extend.log"
for c in on off; do
  (cd benchmarks && timeout 30 python3 profile_extend.py --shape 4096,2048,32,8 --cert $c --reps 3 --kernels) > "$OUT/kernels_4096_2048_$c.txt" 2>&1
  echo "## kernels 4096+2048 cert $c"; grep -E "wc_extend_prefix|_extend_kernel" "$OUT/kernels_4096_2048_$c.txt" | cut -c1-60,100-170
done
echo "done at $(( $(date +%s) - T0 )) s"
