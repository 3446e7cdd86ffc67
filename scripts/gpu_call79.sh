#!/usr/bin/env bash
# GPU call (session of 2026-12-05d, issue 19): where the aligned keys' prefix kernel spends its cycles
# against main's (763b328): Nsight Compute's scheduler and warp-state view, one launch each at 4096 + 512,
# certificate on (about 300 s).
source "$(dirname "$0")/gpu_common.sh"
# the baseline: main before the aligned keys (763b328), its decode.cu, extend.cu and common.cuh side by side
mkdir -p _gpu_prev/ext0 && for f in decode.cu extend.cu common.cuh; do
  git show 763b328:witcert/kernels/cuda/$f > _gpu_prev/ext0/$f || { echo "no git base for the baseline"; exit 1; }; done
T0=$(date +%s)
prof ext_aligned wc_extend_prefix profile_extend.py --shape 4096,512,32,8 --cert on
prof ext_main wc_extend_prefix profile_extend.py --shape 4096,512,32,8 --cert on --src ../_gpu_prev/ext0/extend.cu
echo "done at $(( $(date +%s) - T0 )) s"
