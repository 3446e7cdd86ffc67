#!/usr/bin/env bash
# GPU call (issues 14, 19): the decode's radius sums on tensor cores (as the extend's, call 46),
# both kernels' entries from common.cuh's tc_token_entries / tc_row_entries (the extend's k order
# now the decode's). The decode's GPU test files (10 shards) and its adversarial sweep, the CUDA
# extend tests and the accumulation probe (4 shards), the A/B against the session's start
# (_gpu_prev/dec = 33af663's decode.cu and common.cuh: out, lse, vbound and the logits bitwise
# equal, the certificate's and radius's largest relative change); then the decode timed against
# it and the extend in the same run.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-470} - ($(date +%s) - T0) )); }
timeout 240 python3 scripts/gpu_decode_ab.py _gpu_prev/dec/decode.cu --only out,lse,vbound,logits > "$OUT/ab.log" 2>&1 &
run_shards extc 4 250 tests/test_kernels_extend.py -k "cuda or accumulation"
dec_checks 10 ${TESTS_S:-250} 97
wait; report_shards extc; tail -1 "$OUT/ab.log"; grep -c "same bits" "$OUT/ab.log"
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout 120 python3 benchmarks/bench_decode_cuda_prev.py --prev _gpu_prev/dec/decode.cu --shapes 0 1 2 3 \
  --bits 16 --no-triton > "$OUT/bench_prev.log" 2>&1
grep -E "\|" "$OUT/bench_prev.log" | tail -14
timeout $(( $(left) - 3 )) python3 benchmarks/bench_extend.py --bits 16 --shapes 0,1 --out "$OUT/bench_extend.json" \
  > "$OUT/bench_extend.log" 2>&1
grep -v "^{" "$OUT/bench_extend.log" | grep -v "triton\|building" | tail -6
echo "done at $(( $(date +%s) - T0 )) s"
