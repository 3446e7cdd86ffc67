#!/usr/bin/env bash
# GPU check: kernel tests at full size, then all benchmarks. Logs go to $OUT;
# a short table is printed last. Usage (repo root, GPU machine): bash scripts/gpu_check.sh
# With WITCERT_GGUF=path/to/model.gguf (and gguf installed) it also runs the HF generation
# on that model through the kernels (scripts/gpu_hf.py).
# PHASES (default "tests bench tune hf") picks the parts, so the check can be split over
# several calls of a limited length; TESTS_TIMEOUT (default 200 s) bounds the test phase,
# TEST_FILES (default: extend, write, CUDA graph, decode) picks the test files.
set -uo pipefail
OUT=${OUT:-/tmp/witcert_gpu}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{
  date -u; nvidia-smi -L
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
  git rev-parse HEAD 2>/dev/null || echo "commit: (no git)"
} 2>&1 | tee "$OUT/env.log"

PHASES=${PHASES:-probe tests bench hf}
has() { [[ " $PHASES " == *" $1 "* ]]; }
TEST_FILES=${TEST_FILES:-tests/test_kernels_extend.py tests/test_kernels_write.py tests/test_cuda_graph.py tests/test_kernels_decode.py}

if has probe; then
  timeout 120 python3 benchmarks/probe_fp.py 2>&1 | tee "$OUT/probe_fp.log"
fi

if has tests; then
  t0=$SECONDS
  # shellcheck disable=SC2086
  timeout "${TESTS_TIMEOUT:-200}" python3 -m pytest -q -rfE --durations=8 --maxfail=5 -p no:cacheprovider \
    $TEST_FILES 2>&1 | tee "$OUT/tests.log"
  tests_rc=${PIPESTATUS[0]}
  echo "tests: rc=$tests_rc in $((SECONDS - t0)) s" | tee -a "$OUT/tests.log"
fi

if has bench; then
  t0=$SECONDS
  if [ -z "${SKIP_WRITE:-}" ]; then
    (cd benchmarks && timeout 60 python3 bench_write.py --out "$OUT/bench_write.jsonl") 2>&1 | tee "$OUT/bench_write.log"
    echo "bench_write: $((SECONDS - t0)) s"
  fi
  t0=$SECONDS
  (cd benchmarks && timeout "${BENCH_TIMEOUT:-300}" python3 bench_decode.py ${BENCH_DECODE_ARGS:-} \
    --out "$OUT/bench_decode.jsonl") 2>&1 | tee "$OUT/bench_decode.log"
  echo "bench_decode: $((SECONDS - t0)) s"
fi

if has hf && [ -n "${WITCERT_GGUF:-}" ]; then
  timeout 240 python3 scripts/gpu_hf.py --gguf "$WITCERT_GGUF" --out "$OUT/hf.json" 2>&1 | tee "$OUT/hf.log"
fi

echo "==== SUMMARY ===="
[ -f "$OUT/probe_fp.log" ] && tail -n 4 "$OUT/probe_fp.log"
[ -f "$OUT/tests.log" ] && tail -n 3 "$OUT/tests.log"
[ -f "$OUT/bench_write.log" ] && sed -n '/^case /,$p' "$OUT/bench_write.log"
[ -f "$OUT/bench_decode.log" ] && sed -n '/^shape /,$p' "$OUT/bench_decode.log"
[ -f "$OUT/hf.log" ] && tail -n 12 "$OUT/hf.log"
exit 0
