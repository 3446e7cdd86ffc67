#!/usr/bin/env bash
# GPU call (2026-12-06c; issues 14, 19): the issues' tables on an H200 (the card of their first
# tables) at main's kernels: the decode's (bench_decode.py --quick), the extend's (bench_extend.py,
# the three shapes, b 8) and the writer's (bench_write.py), each against its baseline in the same
# run. Exits at once on any other card (the H100's tables: calls 105-106, BENCHMARKS 4v, 4x). About 200 s.
nvidia-smi -L | grep -q H200 || { echo "not an H200:"; nvidia-smi -L; exit 3; }
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
issue_tables
echo "done at $(( $(date +%s) - T0 )) s"
