#!/usr/bin/env bash
# GPU call (2026-12-06e; issue 19): main at the session's head (after the review's mend of
# _new_key_stats, behaviour unchanged): the issue's table, then the extend's GPU tests (EXT_TESTS,
# 12 shards) and its sweep.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
ext_table 100 0,1,2 10
echo "timed at $(( $(date +%s) - T0 )) s"
ext_checks 12 ${TESTS_S:-280} 383
echo "done at $(( $(date +%s) - T0 )) s"
