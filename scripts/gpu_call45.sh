#!/usr/bin/env bash
# GPU call (issue 19): the staged extend (call 44) validated: the extend's GPU tests (13 shards) and
# its adversarial sweep alongside, then where an extend call's time goes kernel by kernel, and
# bench_extend at b 8 and at 4096 + 2048 against the previous kernel (_gpu_prev/head/extend.cu =
# git show 33af663:witcert/kernels/cuda/extend.cu) in the same run.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-570} - ($(date +%s) - T0) )); }
ext_checks 13 ${TESTS_S:-330} 83
echo "tests done at $(( $(date +%s) - T0 )) s"
for c in on off; do
  timeout 60 python3 benchmarks/profile_extend.py --shape 32768,512,32,8 --cert $c --kernels > "$OUT/profile_$c.log" 2>&1
  grep -E "wc_extend|_extend_kernel|Self CUDA" "$OUT/profile_$c.log" | head -6
done
timeout $(( $(left) - 5 )) python3 benchmarks/bench_extend.py --bits 8 --shapes 0,1 --cuda-prev _gpu_prev/head/extend.cu \
  --out "$OUT/bench_extend_b8.json" > "$OUT/bench_extend_b8.log" 2>&1
grep -v "^{" "$OUT/bench_extend_b8.log" | grep -v triton | tail -10
timeout $(( $(left) - 5 )) python3 benchmarks/bench_extend.py --bits 16 --shapes 2 --cuda-prev _gpu_prev/head/extend.cu \
  --out "$OUT/bench_extend_2.json" > "$OUT/bench_extend_2.log" 2>&1
grep -v "^{" "$OUT/bench_extend_2.log" | grep -v triton | tail -6
echo "done at $(( $(date +%s) - T0 )) s"
