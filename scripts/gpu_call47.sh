#!/usr/bin/env bash
# GPU call (issue 14): the decode's radius sums on tensor cores (as the extend's, call 46). The
# decode's GPU test files (11 shards) and its adversarial sweep alongside, the A/B against the
# session's start (_gpu_prev/dec = 33af663's decode.cu and common.cuh): out, lse, vbound and the
# logits bitwise equal, the certificate's and radius's largest relative change; then the timing
# against it in the same run.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-560} - ($(date +%s) - T0) )); }
timeout 200 python3 scripts/gpu_decode_ab.py _gpu_prev/dec/decode.cu --only out,lse,vbound,logits > "$OUT/ab.log" 2>&1 &
dec_checks 11 ${TESTS_S:-270} 97
wait; tail -2 "$OUT/ab.log"; grep -c "same bits" "$OUT/ab.log"
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout $(( $(left) - 5 )) python3 benchmarks/bench_decode_cuda_prev.py --prev _gpu_prev/dec/decode.cu --shapes 0 1 2 3 \
  --bits 16 --no-triton > "$OUT/bench_prev.log" 2>&1
grep "|" "$OUT/bench_prev.log" | tail -12
echo "done at $(( $(date +%s) - T0 )) s"
