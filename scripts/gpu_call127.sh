#!/usr/bin/env bash
# GPU call (2026-12-06f; issue 19; branch i19-prologue): call 126 found the prologue still 13.5% of the
# prefix kernel's samples, the loads' values converted right after the loads (so they waited there)
# and one row's reductions at a time. Now the rows' bits are loaded (load_q_bits), converted when
# used (q_bits_value, no branch), two rows at a time. Timed against main's extend.cu (shape 0 twice,
# the first a warm-up), then the bitwise A/B against it, one pass and chunks. Carry .gpu/var.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
ext_table 150 0,0,2,1 24 --cuda-prev ../.gpu/var/main/extend.cu
echo "timed at $(( $(date +%s) - T0 )) s"
ext_ab .gpu/var/main/extend.cu 170 -
echo "done at $(( $(date +%s) - T0 )) s"
