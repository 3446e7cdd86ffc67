#!/usr/bin/env bash
# GPU call: the extend's GPU tests (EXT_TESTS) that an earlier ext_checks call did not reach in its
# time limit. Before the call, here: copy that call's $OUT/passed.txt to _gpu_prev/ext_passed.txt
# (untracked, carried); every test listed there is deselected, the rest run in 4 shards.
source "$(dirname "$0")/gpu_common.sh"
DES=(); while read -r id; do DES+=(--deselect "$id"); done < _gpu_prev/ext_passed.txt
run_shards rest 4 400 "${EXT_TESTS[@]}" "${DES[@]}"
wait; report_shards rest
grep -h "PASSED\|FAILED\|ERROR" /tmp/shard_rest_*.log | grep -o "tests/[^ ]* [A-Z]*" | sort | uniq -c | head -30
