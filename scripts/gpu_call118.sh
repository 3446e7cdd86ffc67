#!/usr/bin/env bash
# GPU call (2026-12-06e; issue 19): call 117's stall samples put 6.8% of the prefix kernel's tile loop
# on waiting for a tile to land (the full mbarrier's try_wait loop, long scoreboard). Branch
# i19-nbuf3: main's loop with three staged buffers instead of two (tile it + 2 copied once every warp
# is done with tile it - 1), nothing else changed; timed against main's extend.cu (.gpu/var/main) in
# the same run, then the bitwise A/B (one pass, chunks) and the extend's GPU tests and sweep.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
ext_table 150 0,1,2 12 --cuda-prev ../.gpu/var/main/extend.cu
echo "timed at $(( $(date +%s) - T0 )) s"
ext_ab .gpu/var/main/extend.cu 290 379
echo "done at $(( $(date +%s) - T0 )) s"
