#!/usr/bin/env bash
# GPU call (prepared 2026-12-06, branch i14-write; issue 14 item 5): the CUDA writer without its
# int -> float and float -> int conversions (dither_xi: the dither field under a float exponent by
# one byte permute; the codes from the rounding sum's low byte, packed by byte permutes), the same
# values by construction. Checks the writer's GPU test files bitwise against the reference (8
# shards), then times it against main's writer (.gpu/prev/wr0: write.cu and common.cuh of main at
# the branch point) and the ablations in the same run. Setup on the dev machine:
#   mkdir -p .gpu/prev/wr0 && git show main:witcert/kernels/cuda/write.cu > .gpu/prev/wr0/write.cu \
#     && git show main:witcert/kernels/cuda/common.cuh > .gpu/prev/wr0/common.cuh
# Carry .gpu/prev; about 250 s; timeout 400.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
run_shards wr 8 200 tests/test_cuda_write.py tests/test_kernels_write.py
wait; report_shards wr; tally_shards wr
echo "checks done at $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout 180 python3 ablate_write_cuda.py --prev ../.gpu/prev/wr0/write.cu) > "$OUT/ablate_write.log" 2>&1
grep -vE "^\{|building" "$OUT/ablate_write.log" | tail -20
echo "done at $(( $(date +%s) - T0 )) s"
