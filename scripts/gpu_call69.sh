#!/usr/bin/env bash
# GPU call (issue 19; call 68 measured an earlier form that spilled: 888 bytes): the same checks and
# timings as scripts/gpu_call68.sh (the extend's GPU tests and sweep, bench_extend against the previous
# extend.py, the kernels at 4096 + 2048), run on the next form of witcert/kernels/extend.py.
exec bash "$(dirname "$0")/gpu_call68.sh"
