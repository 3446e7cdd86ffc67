#!/usr/bin/env bash
# GPU call (issue 19; calls 68-69 measured earlier forms, slower: a per-row reduction of each tile, call
# 70): the same checks and timings as scripts/gpu_call68.sh, run on the kept form of
# witcert/kernels/extend.py (committed as d2954ff).
exec bash "$(dirname "$0")/gpu_call68.sh"
