#!/usr/bin/env bash
# GPU call (session of 2026-12-04/05, issues 14, 19): the issues' tables at the session's HEAD: the
# decode's four shapes against SDPA fp16 (bench_decode.py --quick), the extend at 4096 / 32768 + 512
# and 4096 + 2048 against SDPA fp16 causal (bench_extend.py), the writer against a device copy.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
(cd benchmarks && timeout 260 python3 bench_decode.py --quick --budget-s 200 --out "$OUT/bench_decode.jsonl") > "$OUT/bench_decode.log" 2>&1
echo "decode done at $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout 200 python3 bench_extend.py --bits 16 --shapes 0,1,2 --out "$OUT/bench_extend.jsonl") > "$OUT/bench_extend.log" 2>&1
echo "extend done at $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout 80 python3 bench_write.py --out "$OUT/bench_write.jsonl") > "$OUT/bench_write.log" 2>&1
echo "write done at $(( $(date +%s) - T0 )) s"
for f in bench_write bench_extend bench_decode; do echo "## $f"; grep -E "\|" "$OUT/$f.log" | tail -16; done
