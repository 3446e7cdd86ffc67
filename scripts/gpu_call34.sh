#!/usr/bin/env bash
# GPU call (issue 19): the CUDA extend's q.k combined by integer pieces (extend.cu piece_value,
# complemented dither planes, PROOFS 5.4) and its s2 from exact s^2. The extend's GPU tests
# (sharded) and its adversarial sweep alongside, then, alone on the GPU, bench_extend against the
# previous prefix kernel (_gpu_prev/head/: git show HEAD:witcert/kernels/cuda/{extend.cu,common.cuh})
# in the same run, b 16 on the four shapes and b 8 on two.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - T0) )); }
TS=${TESTS_S:-290}
ext_checks 12 $TS 73
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout $(( $(left) - 90 )) python3 benchmarks/bench_extend.py --bits 16 --cuda-prev _gpu_prev/head/extend.cu \
  --out "$OUT/bench_extend_b16.json" > "$OUT/bench_extend_b16.log" 2>&1
tail -21 "$OUT/bench_extend_b16.log"
timeout $(( $(left) - 5 )) python3 benchmarks/bench_extend.py --bits 8 --shapes 0,1 --cuda-prev _gpu_prev/head/extend.cu \
  --out "$OUT/bench_extend_b8.json" > "$OUT/bench_extend_b8.log" 2>&1
tail -11 "$OUT/bench_extend_b8.log"
echo "done at $(( $(date +%s) - T0 )) s"
