#!/usr/bin/env bash
# GPU call (issues 14, 19; branch i14-tc-radius): the radius's tensor-core sums with the rows'
# entries as two tf32 pieces (two chained mmas per sum) in the decode and the extend. Checks: the
# decode's GPU files (10 shards) and sweep, the CUDA extend tests and the accumulation probe (4
# shards), the decode A/B against 33af663 (_gpu_prev/dec: decode.cu and common.cuh; out, lse and
# the logits bitwise; vbound follows the certificate); then the decode timed against it and the
# extend against main's (_gpu_prev/ext = main's extend.cu and common.cuh). The full extend files
# and sweep (ext_checks) need a call of their own. Before the call, here (untracked, carried):
#   mkdir -p _gpu_prev/dec _gpu_prev/ext
#   for f in decode.cu common.cuh; do git show 33af663:witcert/kernels/cuda/$f > _gpu_prev/dec/$f; done
#   for f in extend.cu common.cuh; do git show main:witcert/kernels/cuda/$f > _gpu_prev/ext/$f; done
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-560} - ($(date +%s) - T0) )); }
timeout 240 python3 scripts/gpu_decode_ab.py _gpu_prev/dec/decode.cu --only out,lse,logits > "$OUT/ab.log" 2>&1 &
run_shards extc 4 250 tests/test_kernels_extend.py -k "cuda or accumulation"
dec_checks 10 ${TESTS_S:-250} 101
wait; report_shards extc; tail -1 "$OUT/ab.log"
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout 120 python3 benchmarks/bench_decode_cuda_prev.py --prev _gpu_prev/dec/decode.cu --shapes 0 1 2 3 \
  --bits 16 --no-triton > "$OUT/bench_prev.log" 2>&1
grep -E "\|" "$OUT/bench_prev.log" | tail -18
timeout $(( $(left) - 3 )) python3 benchmarks/bench_extend.py --bits 16 --shapes 0,1 --cuda-prev _gpu_prev/ext/extend.cu \
  --out "$OUT/bench_extend.json" > "$OUT/bench_extend.log" 2>&1
grep -v "^{" "$OUT/bench_extend.log" | grep -v "triton\|building" | tail -10
echo "done at $(( $(date +%s) - T0 )) s"
