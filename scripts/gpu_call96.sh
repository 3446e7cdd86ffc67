#!/usr/bin/env bash
# GPU call (prepared 2026-12-05h for the next GPU session; issue 19, main): what 13u left unchecked
# or unmeasured at the new tokens' 64 rows a program: the adversarial sweeps of the three extend
# paths (the new tokens' fp16 / bf16 tensor-core dots at the new tiles among them), then the
# new tokens' tiles around the new default (128 x 32, 64 x 16, 128 x 32 on 8 warps) and the
# Triton-only prefix path (impl triton: still 32 rows) at 32 and 64 rows; and the measurement-only
# variant d2 of floor_variants.py (two 8-bit query digits: 1,040 SASS in the loop, 202 registers).
# No carry; timeout 560.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
for p in triton_extend triton_extend_fp16 triton_extend_bf16; do
  timeout 120 python3 benchmarks/soundness_sweep.py --paths $p --seed ${SEED:-353} --max-seconds 100 > "$OUT/sweep_$p.log" 2>&1 &
done
wait
for p in triton_extend triton_extend_fp16 triton_extend_bf16; do grep -E "VIOLATION|^ *$p " "$OUT/sweep_$p.log" | tail -2; done
cat "$OUT"/sweep_*.log > "$OUT/sweeps.log" && rm "$OUT"/sweep_triton*.log
echo "sweeps done at $(( $(date +%s) - T0 )) s"
python3 benchmarks/floor_variants.py .gpu/fv > /dev/null  # d2: the price of two 8-bit query digits
(cd benchmarks && timeout 200 python3 bench_extend.py --bits 16 --shapes 0,1,2 --auto-plans 128,32,4 64,16,4 128,32,8 \
  --plans 32,32,4 64,32,4 --cuda-prev ../.gpu/fv/d2/extend.cu) > "$OUT/bench_tiles.log" 2>&1
grep -E "^Np" "$OUT/bench_tiles.log"
echo "done at $(( $(date +%s) - T0 )) s"
