#!/usr/bin/env bash
# GPU call (issue 15): one cell of the end-to-end benchmark with the torch.compile
# (reduce-overhead) StaticCache baseline, which compiles for minutes; then (issue 19) the
# extend kernel's contract tests at full size for what time is left.
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/witcert_gpu}; mkdir -p "$OUT"
{ date -u; nvidia-smi -L; cat .commit 2>/dev/null
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"; } | tee "$OUT/env.log"
timeout ${E2E_S:-430} python3 benchmarks/bench_e2e_gpu.py --archs ${ARCH:-llama3-8b} --contexts ${CTX:-8192} --batches ${BATCH:-4} \
  --methods ${METHODS:-sdpa-dynamic,sdpa-static,sdpa-static-compiled,witcert-graph,witcert-graph-nocert} --compile-cells ${CELLS:-6} \
  --budget-s $(( ${E2E_S:-430} - 30 )) --out "$OUT/e2e" > "$OUT/e2e.log" 2>&1
tail -30 "$OUT/e2e.log"
timeout ${TESTS_S:-100} python3 -m pytest -q -rfE -p no:cacheprovider tests/test_kernels_extend.py > "$OUT/tests_extend.log" 2>&1
tail -4 "$OUT/tests_extend.log"
