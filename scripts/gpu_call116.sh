#!/usr/bin/env bash
# GPU call (2026-12-06e; issue 19): the exact new tokens' Triton kernel reading sanitized copies of
# q, the keys and the values (KS, VS, QS from _new_key_stats) straight into its dots, and its p.v in
# absolute units without the per-tile rescale where the values are fp16 (branch i19-newtok), timed
# against main's extend.py (.gpu/var/extend_main.py) in the same run; the kernels one by one at the
# three shapes (profile_extend.py --kernels, this branch); then the extend's GPU tests and its
# adversarial sweep.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
ext_table 200 0,1,2 16 --prev ../.gpu/var/extend_main.py
echo "timed at $(( $(date +%s) - T0 )) s"
for s in 4096,512,32,8 32768,512,32,8 4096,2048,32,8; do
  (cd benchmarks && timeout 60 python3 profile_extend.py --kernels --bits 8 --shape $s) 2>&1 | grep -vE "building" | tail -8
done > "$OUT/kernels.log"
cat "$OUT/kernels.log"
echo "profiled at $(( $(date +%s) - T0 )) s"
ext_checks 12 330 373
echo "done at $(( $(date +%s) - T0 )) s"
