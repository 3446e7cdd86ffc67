#!/usr/bin/env bash
# GPU call (issue 19; branch i19-chunk): the CUDA extend's prefix in chunks under a workspace cap
# (each chunk carries the prefix kernel's per-thread state to the next). Checks: the CUDA extend
# tests with the new bitwise chunks-vs-one-pass test and the probe (4 shards), the extend's sweep;
# then the extend timed at 32768 and 131072 + 512 under caps 64 / 256 (default) / 4096 MiB, against
# main's extend.cu (_gpu_prev/ext: main's extend.cu and common.cuh, one pass). Before the call, here:
#   mkdir -p _gpu_prev/ext; for f in extend.cu common.cuh; do git show main:witcert/kernels/cuda/$f > _gpu_prev/ext/$f; done
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-460} - ($(date +%s) - T0) )); }
run_shards chk 4 200 tests/test_kernels_extend.py -k "cuda or accumulation or chunks"
timeout 170 python3 benchmarks/soundness_sweep.py --paths triton_extend --seed 311 --max-seconds 130 \
  > "$OUT/sweep_extend.log" 2>&1 &
wait; report_shards chk
grep -h "PASSED\|FAILED\|ERROR" /tmp/shard_chk_*.log | grep -c PASSED
grep -E "VIOLATION|certs|^ *triton_extend" "$OUT/sweep_extend.log" | tail -3
echo "tests done at $(( $(date +%s) - T0 )) s"
timeout $(( $(left) - 3 )) python3 benchmarks/bench_extend.py --bits 16 --shapes 1,4 --workspace-mib 64 4096 \
  --cuda-prev _gpu_prev/ext/extend.cu --out "$OUT/bench_extend.json" > "$OUT/bench_extend.log" 2>&1
grep -v "^{" "$OUT/bench_extend.log" | grep -v "building" | tail -16
echo "done at $(( $(date +%s) - T0 )) s"
