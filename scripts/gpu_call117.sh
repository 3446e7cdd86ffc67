#!/usr/bin/env bash
# GPU call (2026-12-06e; issue 19): main after the merge of i19-newtok. First where the prefix
# kernel's tile loop waits now that its tiles land by bulk copies (Nsight Compute's stall samples on
# one launch at 4096 + 512, cert on; benchmarks/ncu_stalls.py reads the source page), then every GPU
# test file except the extend's (EXT_TESTS ran in call 116 on the same extend.py), 15 shards.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
ncu_prefix prefix --shape 4096,512,32,8 --bits 8 --cert on  # (its logs were named before the helper: prefix_sass.csv.gz, ncu_details.txt, stalls.txt)
echo "profiled at $(( $(date +%s) - T0 )) s"
EXT=(tests/test_kernels_extend.py tests/test_fp_soundness.py)
REST=()
for f in "${ALL_GPU_TESTS[@]}"; do [[ " ${EXT[*]} " == *" $f "* ]] || REST+=("$f"); done
run_shards all 15 ${TESTS_S:-330} "${REST[@]}"
wait; report_shards all
tally_shards all
echo "done at $(( $(date +%s) - T0 )) s"
