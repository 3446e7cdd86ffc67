#!/usr/bin/env bash
# GPU call (2026-12-06; issue 14): the CUDA decode after call 102's V side plus the code rows'
# addresses formed once per tile (both sides) and the certificate's term by expm1_up_exp. Checks:
# the A/B against .gpu/prev/dec0 (a333074's decode.cu, common.cuh) bitwise in lse, radius and
# logits (the certificate moves by expm1_up_exp's price, the output and value bound by call 102's
# changes: their largest changes printed); the decode's GPU test files and the CUDA writer's in 14
# shards; the CUDA decode's adversarial sweep. Then the four issue shapes at b 8, certificate on and
# off, against dec0 and SDPA fp16 in the same run. Carry .gpu/prev; about 300 s.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
PREV=.gpu/prev/dec0/decode.cu
dec_checks 14 200 103 "$PREV" lse,radius,logits tests/test_cuda_write.py
echo "checks done at $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout $((415 - $(date +%s) + T0)) python3 bench_decode_cuda_prev.py --prev "../$PREV" \
  --shapes 0 1 2 3 --bits 8 --off-all --no-triton) > "$OUT/bench_prev.log" 2>&1
grep -vE "^\{|building" "$OUT/bench_prev.log" | tail -22
echo "done at $(( $(date +%s) - T0 )) s"
