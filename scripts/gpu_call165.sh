#!/usr/bin/env bash
# GPU call prepared in session 2026-12-07i (issue 19; not run: the device budget ran out in failed
# starts). Does the certificate cost less when its (row, token) radii leave the softmax's chain?
# 1. RUNS (default 2) runs of bench_extend.py --queued over SHAPES (default 0,1,2, the issue's three):
#    main against floor_variants.py's measurement-only `radiiearly` (the radii formed before the online
#    softmax) and `radiifirst` (before the tile's q.k), through main's launcher.
# 2. The same change as a real one (reports/gpu-2026-12-07i/radiiearly/radiiearly.patch, `git apply`;
#    with it the launcher's fewer allocations a call): the bitwise A/B against main's kernel (copied to
#    /tmp/wc_main first; one pass and chunked at 4 warps, one pass at 8 warps) in parallel, CHECK_T s
#    (default 100); with CHECKS=1 also the extend's GPU tests in 12 shards and its sweep (seed 426).
# 3. The host's time per call at 4096 + 16 and 4096 + 512 (extend_host_cost.py --device cuda), the
#    patched launcher against main's (git stash of witcert/kernels/extend.py), HOSTREPS (default 2)
#    times, alternating.
# 4. (main's launcher and kernel again: git checkout) The kernels one by one at 32768 + 16, certificate on
#    and off (profile_extend.py --kernels): why is the call without the certificate about 7% slower
#    there (13at, 13av, 13ay)?
# The patch's spilled bytes at 64-token tiles and 8 warps (136-144, nvcc 13 on the dev machine) pass
# tests/test_cuda_build.py's limit of 128 for the instances a call runs: a real build must lower them
# or say why the limit moves.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
mkdir -p /tmp/wc_main && cp witcert/kernels/cuda/extend.cu witcert/kernels/cuda/common.cuh /tmp/wc_main/
python3 benchmarks/floor_variants.py /tmp/fv > /dev/null
for run in $(seq 1 ${RUNS:-2}); do
  ext_bench_smi "$run" "${BENCH_T:-150}" "${SHAPES:-0,1,2}" /tmp/fv/radiiearly/extend.cu /tmp/fv/radiifirst/extend.cu --queued
  echo "## bench $run at $(( $(date +%s) - T0 )) s"; grep -v building "$OUT/bench_run$run.log" | grep -v "^{" | tail -16 | cut -c1-120
done
git apply reports/gpu-2026-12-07i/radiiearly/radiiearly.patch && echo "radiiearly patch applied" || { echo "patch did not apply"; exit 1; }
timeout "${CHECK_T:-100}" python3 scripts/gpu_extend_ab.py /tmp/wc_main/extend.cu --warps 8 --old-warps 8 > "$OUT/ab_w8.log" 2>&1 &
if [ "${CHECKS:-0}" = 1 ]; then ext_ab /tmp/wc_main/extend.cu "${CHECK_T:-100}" 426; else ext_ab /tmp/wc_main/extend.cu "${CHECK_T:-100}" -; fi
wait; ab_summary ab_w8
echo "## checks at $(( $(date +%s) - T0 )) s"
for rep in $(seq 1 ${HOSTREPS:-2}); do
  for side in new old; do
    [ $side = old ] && git stash push -q -- witcert/kernels/extend.py
    for sh in 4096_16 4096_512; do
      echo "host $side $sh: $(timeout 40 python3 benchmarks/extend_host_cost.py --device cuda --shape ${sh/_/,},32,8 --top 0 2>&1 \
        | grep "host's work" | sed 's/.*real launches, [^)]*)//')"
    done
    [ $side = old ] && git stash pop -q
  done
done 2>&1 | tee "$OUT/host.log"
git checkout -q -- witcert/kernels/extend.py witcert/kernels/cuda/extend.cu
for c in on off; do
  (cd benchmarks && timeout 40 python3 profile_extend.py --shape 32768,16,32,8 --bits 8 --cert $c --reps 3 --kernels) \
    > "$OUT/kernels_32768_16_$c.txt" 2>&1
  echo "## kernels 32768+16 cert $c"; grep -vE "building|^ *$" "$OUT/kernels_32768_16_$c.txt" | tail -8 | cut -c1-150
done
echo "done at $(( $(date +%s) - T0 )) s"
