#!/usr/bin/env bash
# GPU call: the two files that failed in call 59 (the report's runtime check on CUDA; the bundled
# model's tests skip with a reason where the model is not installed) and the dispatch's new test.
source "$(dirname "$0")/gpu_common.sh"
run_shards fix 2 300 tests/test_report_runtime.py tests/test_report_quick.py tests/test_backend_native.py
wait; report_shards fix
grep -h "SKIPPED\|FAILED" /tmp/shard_fix_*.log | head -5
