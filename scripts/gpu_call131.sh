#!/usr/bin/env bash
# GPU call (2026-12-06g): main as it stands (no kernel change landed this session). Every GPU test
# file, 16 shards (the review of 2026-12-06f moved the Triton decode's and extend's "NaN and inf read
# as 0" into one helper, finite_or_zero, and no GPU had run the decode's files since), then issues 14
# and 19's tables on this card (decode, extend, write, each against its baseline in the same run).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
run_shards all 16 ${TESTS_S:-400} "${ALL_GPU_TESTS[@]}"
wait; report_shards all
tally_shards all
echo "tested at $(( $(date +%s) - T0 )) s"
issue_tables
echo "done at $(( $(date +%s) - T0 )) s"
