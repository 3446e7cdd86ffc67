#!/usr/bin/env bash
# GPU call: the extend test file again in 12 shards (3 of 6 shards ran out of time in call 22), and
# alongside, scripts/gpu_diag23.py (the decode certificate against the reference, current vs previous decode.cu).
source "$(dirname "$0")/gpu_common.sh"
run_shards ext 12 ${TESTS_S:-330} tests/test_kernels_extend.py
timeout 200 python3 scripts/gpu_diag23.py > "$OUT/diag.log" 2>&1
cat "$OUT/diag.log" | grep -v Warn | tail -12
wait; report_shards ext
rm -f "$OUT"/tests_ext.log; grep -ohE " (PASSED|FAILED|ERROR) " /tmp/shard_ext_*.log | sort | uniq -c
