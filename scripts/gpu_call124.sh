#!/usr/bin/env bash
# GPU call (2026-12-06f; issue 19; branch i19-prologue): the prefix kernel's prologue (about 19% of its
# stall samples at 4096 + 512 in call 117) with each query row's loads in flight together and the
# next row's during this one's split, the row's groups unrolled. Timed against main's extend.cu
# (.gpu/var/main), then the bitwise A/B against it (one pass and chunks) beside the extend's GPU
# tests and its sweep. Carry .gpu/var; about 380 s.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
ext_table 200 0,1,2 20 --cuda-prev ../.gpu/var/main/extend.cu
echo "timed at $(( $(date +%s) - T0 )) s"
ext_ab .gpu/var/main/extend.cu 290 397
echo "done at $(( $(date +%s) - T0 )) s"
