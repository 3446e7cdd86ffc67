#!/usr/bin/env bash
# GPU call (session of 2026-12-05d, issue 19): where the aligned keys' prefix kernel spends its cycles
# against main's (763b328): Nsight Compute's scheduler and warp-state view, one launch each at 4096 + 512,
# certificate on (about 300 s).
source "$(dirname "$0")/gpu_common.sh"
# the baselines, each folder a decode.cu, extend.cu and common.cuh side by side: main before the aligned
# keys (ext0: 763b328), the aligned keys alone (aligned: 4bbf71c), with the copies at constant offsets
# (copies: 33e66dd); the branch's head is the package's own
for pair in ext0:763b328 aligned:4bbf71c copies:33e66dd; do
  d=_gpu_prev/${pair%%:*}; mkdir -p $d
  for f in decode.cu extend.cu common.cuh; do
    git show ${pair##*:}:witcert/kernels/cuda/$f > $d/$f || { echo "no git base for the baselines"; exit 1; }; done; done
T0=$(date +%s)
prof ext_aligned wc_extend_prefix profile_extend.py --shape 4096,512,32,8 --cert on
prof ext_main wc_extend_prefix profile_extend.py --shape 4096,512,32,8 --cert on --src ../_gpu_prev/ext0/extend.cu
echo "done at $(( $(date +%s) - T0 )) s"
