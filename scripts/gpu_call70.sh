#!/usr/bin/env bash
# GPU call (issue 19): why the Triton extend with one radius per row for its exact new tokens measured
# slower (calls 68-69): measurement-only variants of witcert/kernels/extend.py timed in one run.
source "$(dirname "$0")/gpu_common.sh"
for s in 4096,2048,32,8 4096,512,32,8; do
  timeout 200 python3 scripts/gpu_extend_variants.py --shape $s _gpu_prev/v_old.py _gpu_prev/v_new.py \
    _gpu_prev/v_nokx.py _gpu_prev/v_noln.py _gpu_prev/v_noif.py 2>&1 | grep -v Warning | tail -8
done
