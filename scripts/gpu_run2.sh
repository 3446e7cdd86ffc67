#!/usr/bin/env bash
# One GPU call: fp probe, then the decode contract tests (CUDA kernel first), within a time limit.
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/witcert_gpu}; mkdir -p "$OUT"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
timeout 60 python3 benchmarks/probe_fp.py --n 2000000 2>&1 | tee "$OUT/probe_fp.log"
timeout "${TESTS_TIMEOUT:-240}" python3 -m pytest -q -rfE --maxfail=6 -p no:cacheprovider --durations=5 \
  tests/test_cuda_graph.py tests/test_kernels_decode.py -k "${TESTS_K:-cuda}" 2>&1 | tee "$OUT/tests.log" | tail -40
