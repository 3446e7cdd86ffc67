#!/usr/bin/env bash
# GPU call (session of 2026-12-05d, issue 19): where the aligned keys' prefix kernel spends its cycles
# against main's (763b328): Nsight Compute's scheduler and warp-state view, one launch each at 4096 + 512,
# certificate on (about 300 s).
source "$(dirname "$0")/gpu_common.sh"
# the baselines (scripts/gpu_prev_aligned.sh: .gpu/prev/{ext0,aligned,copies}, carried or made here)
[ -f .gpu/prev/copies/extend.cu ] || bash scripts/gpu_prev_aligned.sh || { echo "no baselines: carry .gpu/prev"; exit 1; }
T0=$(date +%s)
prof ext_aligned wc_extend_prefix profile_extend.py --shape 4096,512,32,8 --cert on
prof ext_main wc_extend_prefix profile_extend.py --shape 4096,512,32,8 --cert on --src ../.gpu/prev/ext0/extend.cu
echo "done at $(( $(date +%s) - T0 )) s"
