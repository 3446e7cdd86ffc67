#!/usr/bin/env bash
# GPU call (2026-12-07c; issue 19, branch i19-f16keys): call 143's one failure again, its lse check
# now allowing the CUDA prefix kernel's arithmetic slack (the fp16 route rounds fp32 queries to fp16;
# its radius carries that): test_extend_kernel_certificate_matches_the_reference_spec_and_is_sound,
# all three cases, with tracebacks. About 90 s.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
timeout ${CHECK_T:-200} python3 -m pytest -v -rfE -p no:cacheprovider tests/test_kernels_extend.py \
  -k "certificate_matches_the_reference_spec" 2>&1 | tee "$OUT/tests_one.log" | grep -E "PASSED|FAILED|^E |passed|failed"
echo "done at $(( $(date +%s) - T0 )) s"
