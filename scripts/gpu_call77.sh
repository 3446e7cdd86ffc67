#!/usr/bin/env bash
# GPU call (session of 2026-12-05d, issue 19): the CUDA extend's aligned keys checked. The extend's GPU
# files and its adversarial sweep (ext_checks), the build test, the new CPU emulation test, and the
# decode bitwise against the session start's decode.cu and common.cuh (common.cuh's q_row changed).
source "$(dirname "$0")/gpu_common.sh"
# the baselines (scripts/gpu_prev_aligned.sh: .gpu/prev/{ext0,aligned,copies}, carried or made here)
[ -f .gpu/prev/copies/extend.cu ] || bash scripts/gpu_prev_aligned.sh || { echo "no baselines: carry .gpu/prev"; exit 1; }
T0=$(date +%s)
timeout 300 python3 scripts/gpu_decode_ab.py .gpu/prev/ext0/decode.cu > "$OUT/ab.log" 2>&1 &
OMP_NUM_THREADS=1 timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_build.py tests/test_extend_aligned_keys.py > "$OUT/tests_build.log" 2>&1 &
ext_checks 10 ${EXT_T:-330} ${SEED:-331}
wait
echo "== build + emulation: $(tail -1 "$OUT/tests_build.log")"
echo "== decode A/B: $(grep -c "same bits" "$OUT/ab.log") same-bits lines"; grep -E "DIFFERENT|bitwise|Error|error" "$OUT/ab.log" | head -6; tail -2 "$OUT/ab.log"
echo "done at $(( $(date +%s) - T0 )) s"
