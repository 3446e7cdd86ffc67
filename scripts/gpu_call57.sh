#!/usr/bin/env bash
# GPU call: the tests of gpu_call56.sh that its 330 s shards did not reach (two shards timed out).
# Before the call, here: the passed node ids of call 56 into _gpu_prev/all_passed.txt (untracked,
# carried); every test listed there is deselected, the rest run in 4 shards.
source "$(dirname "$0")/gpu_common.sh"
DES=(); while read -r id; do DES+=(--deselect "$id"); done < _gpu_prev/all_passed.txt
run_shards rest 4 ${TESTS_S:-240} tests/test_kernels_decode.py tests/test_kernels_extend.py tests/test_attention_dtypes.py \
  tests/test_cuda_auto.py tests/test_cuda_build.py "${DES[@]}"
wait; report_shards rest
grep -h "PASSED\|FAILED\|ERROR" /tmp/shard_rest_*.log | grep -o "tests/[^ ]* [A-Z]*" | awk '{print $2}' | sort | uniq -c
