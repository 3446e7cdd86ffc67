#!/usr/bin/env bash
# One GPU call: Triton decode contract tests, the captured HF decode step tests, the GPU
# soundness sweep, then the end-to-end benchmark at model scale (issue 15).
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/witcert_gpu}; mkdir -p "$OUT"
timeout 110 python3 -m pytest -q -rfE --maxfail=6 -p no:cacheprovider tests/test_kernels_decode.py -k triton \
  > "$OUT/tests_triton.log" 2>&1; tail -4 "$OUT/tests_triton.log"
timeout 80 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_hf_graph_gpu.py > "$OUT/tests_graph.log" 2>&1
tail -6 "$OUT/tests_graph.log"
timeout 90 python3 benchmarks/soundness_sweep.py --paths triton cuda --cases 20000 --out "$OUT/sweep_gpu.jsonl" \
  > "$OUT/sweep.log" 2>&1; grep -v Warn "$OUT/sweep.log" | tail -5
timeout 250 python3 benchmarks/bench_e2e_gpu.py --budget-s ${E2E_BUDGET:-210} --out "$OUT/e2e" > "$OUT/e2e.log" 2>&1
tail -45 "$OUT/e2e.log"
