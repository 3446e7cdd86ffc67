#!/usr/bin/env bash
# GPU call (measurement only): what tensor cores would buy the extend's exact new tokens. A copy of
# witcert/kernels/extend.py whose new-token q.k runs as a tf32 tensor-core dot instead of the fp32
# `ieee` dot (its certificate does NOT cover that arithmetic: timing only), timed against the
# shipped extend in the same run (benchmarks/bench_extend.py --prev).
source "$(dirname "$0")/gpu_common.sh"
V=/tmp/extend_tf32.py
sed 's/z = tl.dot(qc, tl.trans(kc), z, input_precision="ieee")/z = tl.dot(qc, tl.trans(kc), z, input_precision="tf32")/' \
  witcert/kernels/extend.py > "$V"
grep -c 'input_precision="tf32")' "$V"
timeout 400 python3 benchmarks/bench_extend.py --bits 16 --shapes 0,2 --prev "$V" > "$OUT/bench_extend_tf32.log" 2>&1
tail -14 "$OUT/bench_extend_tf32.log"
