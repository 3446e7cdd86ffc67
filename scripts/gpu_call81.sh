#!/usr/bin/env bash
# GPU call (session of 2026-12-05f, issue 19): after call 80, the extend's GPU tests it did not reach
# (its passed.txt copied to .gpu/prev/ext_passed.txt; carry .gpu/prev), with the lse check of the CUDA prefix
# test now bounded by the two kernels' logit difference; then the issue 19 table at the head, with
# main's extend.cu (ext0, .gpu/prev) in the same run.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
DES=(); while read -r id; do DES+=(--deselect "$id"); done < .gpu/prev/ext_passed.txt
run_shards rest 8 ${EXT_T:-280} "${EXT_TESTS[@]}" "${DES[@]}"
wait; report_shards rest
echo "tests done at $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout 200 python3 bench_extend.py --bits 16 --shapes 0,1,2 --cuda-prev ../.gpu/prev/ext0/extend.cu \
  --out "$OUT/bench_extend16.jsonl") > "$OUT/bench_extend16.log" 2>&1
grep -E "^(shape|Np)" "$OUT/bench_extend16.log" | tail -20
# Nsight Compute of main's prefix kernel (call 80 has the head's), if the time allows
[ "${NCU:-1}" = 1 ] && [ $(( $(date +%s) - T0 )) -lt 330 ] && \
  prof ext_main wc_extend_prefix profile_extend.py --shape 4096,512,32,8 --cert on --src ../.gpu/prev/ext0/extend.cu
echo "done at $(( $(date +%s) - T0 )) s"
