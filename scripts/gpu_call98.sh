#!/usr/bin/env bash
# GPU call (2026-12-05i; issues 14, 19): every GPU test file at main's head (15 shards), the CUDA
# decode's and the extend's adversarial sweeps beside them, then the decode's issue table on this card
# (bench_decode.py --quick) where the call has time left. About 480 s: run it with timeout 590 (the
# tests alone: about 340 s). Leaves 6 files in $OUT.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
run_shards all 15 ${TESTS_S:-340} "${ALL_GPU_TESTS[@]}"
SW=${SWEEP_S:-200}
timeout $((SW + 60)) python3 benchmarks/soundness_sweep.py --paths cuda --seed ${SEED_DEC:-107} --max-seconds $SW > "$OUT/sweep_cuda.log" 2>&1 &
timeout $((SW + 60)) python3 benchmarks/soundness_sweep.py --paths triton_extend --seed ${SEED_EXT:-361} --max-seconds $SW > "$OUT/sweep_extend.log" 2>&1 &
wait; report_shards all
tally_shards all
for f in sweep_cuda sweep_extend; do echo "## $f"; grep -E "VIOLATION|^ *(cuda|triton_extend) " "$OUT/$f.log" | tail -2; done
echo "tests done at $(( $(date +%s) - T0 )) s"
if [ $(( $(date +%s) - T0 )) -lt ${BENCH_BEFORE:-340} ]; then  # the decode table only where the call has time left
  decode_table 150 14
fi
echo "done at $(( $(date +%s) - T0 )) s"
