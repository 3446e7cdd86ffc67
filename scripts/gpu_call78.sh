#!/usr/bin/env bash
# GPU call (session of 2026-12-05d, issue 19): the branch's extend timed in the same run against main's
# (ext0) and its two intermediate steps (aligned, copies), b 16 at the issue's shapes (4096 / 32768 +
# 512), b 8 at 4096 + 512 against main's; then the kernels one by one at 4096 + 512 (about 450 s).
source "$(dirname "$0")/gpu_common.sh"
# the baselines (scripts/gpu_prev_aligned.sh: .gpu/prev/{ext0,aligned,copies}, carried or made here)
[ -f .gpu/prev/copies/extend.cu ] || bash scripts/gpu_prev_aligned.sh || { echo "no baselines: carry .gpu/prev"; exit 1; }
T0=$(date +%s)
(cd benchmarks && timeout 300 python3 bench_extend.py --bits 16 --shapes 0,1 --cuda-prev ../.gpu/prev/ext0/extend.cu ../.gpu/prev/aligned/extend.cu ../.gpu/prev/copies/extend.cu --out "$OUT/bench_extend16.jsonl") > "$OUT/bench_extend16.log" 2>&1
echo "b16 done at $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout 100 python3 bench_extend.py --bits 8 --shapes 0 --cuda-prev ../.gpu/prev/ext0/extend.cu --out "$OUT/bench_extend8.jsonl") > "$OUT/bench_extend8.log" 2>&1
echo "b8 done at $(( $(date +%s) - T0 )) s"
for c in on off; do
  (cd benchmarks && timeout 50 python3 profile_extend.py --shape 4096,512,32,8 --cert $c --reps 3 --kernels) > "$OUT/kernels_4096_512_$c.txt" 2>&1
  echo "## kernels 4096+512 cert $c"; grep -E "wc_extend|_extend_kernel" "$OUT/kernels_4096_512_$c.txt" | cut -c1-60,100-170
done
for f in bench_extend16 bench_extend8; do echo "## $f"; grep -E "\|" "$OUT/$f.log" | tail -12; done
echo "done at $(( $(date +%s) - T0 )) s"
