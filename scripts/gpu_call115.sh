#!/usr/bin/env bash
# GPU call (2026-12-06e; issue 19): the software-pipelined prefix kernel (branch i19-pipe: tile it + 1's
# integer MMAs in flight beside tile it's softmax and certificate terms, three staged buffers) timed
# against main's extend.cu (.gpu/var/main) and the same loop without its stage fences
# (.gpu/var/nofence) in the same run; then the bitwise A/B against main (one pass, and the prefix in
# chunks), the extend's GPU tests (EXT_TESTS, 12 shards) and its adversarial sweep, side by side.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
ext_table 200 0,1,2 22 --cuda-prev ../.gpu/var/main/extend.cu ../.gpu/var/nofence/extend.cu
echo "timed at $(( $(date +%s) - T0 )) s"
ext_ab .gpu/var/main/extend.cu 330 371
echo "done at $(( $(date +%s) - T0 )) s"
