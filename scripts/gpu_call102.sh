#!/usr/bin/env bash
# GPU call (2026-12-06; issue 14): the CUDA decode's V side with fewer instructions (the shared Philox
# words by xor-shuffle stages, the b = 8 byte plane's scaling on the B operand, one lop3 per byte
# pair, rcp.approx for the rescale) and the value bounds' square roots by sqrt_up. Checks first:
# the A/B against the previous source (.gpu/prev/dec0: decode.cu and common.cuh of a333074) bitwise
# in lse, cert, radius and logits (the K side's values), with the out and vbound changes printed;
# the decode's GPU test files in 14 shards; the CUDA decode's adversarial sweep. Then the four
# issue shapes against the previous source in the same run (b 8 and 16, cert on; the previous one
# also off). Carry .gpu/prev; about 450 s; dec_checks 14 230 102 "$PREV" lse,cert,radius,logits
echo "checks done at $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout $((570 - $(date +%s) + T0)) python3 bench_decode_cuda_prev.py --prev "../$PREV" \
  --shapes 0 1 2 3 --bits 8 16 --no-triton) > "$OUT/bench_prev.log" 2>&1
grep -vE "^\{|building" "$OUT/bench_prev.log" | tail -26
echo "done at $(( $(date +%s) - T0 )) s"
