#!/usr/bin/env bash
# The baselines of GPU call 80 (issue 19, the aligned keys), each folder a decode.cu, extend.cu and
# common.cuh side by side: main before the aligned keys (ext0: 763b328), the aligned keys alone
# (aligned: 4bbf71c), with the copies at constant offsets (copies: 33e66dd). Run it here, where the
# history is, before the calls (it writes .gpu/prev, which git ignores: pass carry [".gpu/prev"] to
# the device tool); the calls run it themselves when the folder did not travel and git can.
set -euo pipefail
cd "$(dirname "$0")/.."
for pair in ext0:763b328 aligned:4bbf71c copies:33e66dd; do
  d=.gpu/prev/${pair%%:*}; mkdir -p "$d"
  for f in decode.cu extend.cu common.cuh; do git show "${pair##*:}:witcert/kernels/cuda/$f" > "$d/$f"; done
done
echo "baselines in .gpu/prev: $(ls .gpu/prev | tr '\n' ' ')"
