#!/usr/bin/env bash
# GPU call: the tensor-core extend (issue 19): contract + soundness tests at full size, the
# extend benchmark against SDPA fp16 with plan variants; then the end-to-end benchmark's
# missing cells (issue 15: the GQA-7 shape, the compiled HF baseline).
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/witcert_gpu}; mkdir -p "$OUT"
{ date -u; git rev-parse HEAD 2>/dev/null; } | tee "$OUT/env.log"
(cd benchmarks && timeout ${BENCH_S:-170} python3 bench_extend.py ${BENCH_ARGS:---variants} --out "$OUT/bench_extend.jsonl") \
  > "$OUT/bench_extend.log" 2>&1
sed -n '/^shape /,$p' "$OUT/bench_extend.log"; grep -m3 -i "error\|Traceback" "$OUT/bench_extend.log"
timeout ${TESTS_S:-150} python3 -m pytest -q -rfE -x -p no:cacheprovider tests/test_kernels_extend.py tests/test_backend_extend.py \
  "tests/test_fp_soundness.py::test_triton_extend_certificates_are_sound_on_adversarial_inputs" > "$OUT/tests.log" 2>&1
tail -4 "$OUT/tests.log"
if [ -n "${E2E_S:-}" ]; then
  timeout $((E2E_S + 60)) python3 benchmarks/bench_e2e_gpu.py --budget-s "$E2E_S" ${E2E_ARGS:-} --out "$OUT/e2e" > "$OUT/e2e.log" 2>&1
  tail -40 "$OUT/e2e.log"
fi
