#!/usr/bin/env bash
# GPU call (2026-12-05h; issue 19, branch i19-tiles): the new tokens' Triton kernel at 64 rows a
# program behind the CUDA prefix phase (the default now); the extend's GPU tests, 15 shards, no
# sweep (the budget left). No carry; timeout 200.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
run_shards ext 15 ${EXT_T:-170} "${EXT_TESTS[@]}"; wait; report_shards ext
grep -hE "::.* PASSED" /tmp/shard_ext_*.log | grep -o "tests/[^ ]*" | sort -u > "$OUT/passed.txt"
echo "passed $(wc -l < "$OUT/passed.txt"); done at $(( $(date +%s) - T0 )) s"
