#!/usr/bin/env bash
# One GPU call: kernel tests at full size, then all benchmarks. Logs go to $OUT;
# a short table is printed last. Usage (repo root, GPU machine): bash scripts/gpu_check.sh
# With WITCERT_GGUF=path/to/model.gguf (and gguf installed) it also runs the HF generation
# on that model through the kernels (scripts/gpu_hf.py).
set -uo pipefail
OUT=${OUT:-/tmp/witcert_gpu}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{
  date -u; nvidia-smi -L
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
  git rev-parse HEAD 2>/dev/null || echo "commit: (no git)"
} 2>&1 | tee "$OUT/env.log"

t0=$SECONDS
timeout 200 python3 -m pytest -q --maxfail=5 -p no:cacheprovider tests/test_kernels_write.py tests/test_kernels_decode.py \
  tests/test_kernels_extend.py tests/test_cuda_graph.py 2>&1 | tee "$OUT/tests.log"
tests_rc=$?
echo "tests: rc=$tests_rc in $((SECONDS - t0)) s" | tee -a "$OUT/tests.log"

t0=$SECONDS
(cd benchmarks && timeout 60 python3 bench_write.py --out "$OUT/bench_write.jsonl") 2>&1 | tee "$OUT/bench_write.log"
echo "bench_write: $((SECONDS - t0)) s"
t0=$SECONDS
(cd benchmarks && timeout 300 python3 bench_decode.py ${BENCH_DECODE_ARGS:-} --out "$OUT/bench_decode.jsonl") 2>&1 | tee "$OUT/bench_decode.log"
echo "bench_decode: $((SECONDS - t0)) s"

t0=$SECONDS
(cd benchmarks && timeout 200 python3 tune_decode.py --shape 16,32,8,4096 --shape 1,28,4,131072 \
  --out "$OUT/tune_decode.jsonl") 2>&1 | tee "$OUT/tune_decode.log"
echo "tune_decode: $((SECONDS - t0)) s"
if [ -n "${WITCERT_GGUF:-}" ]; then
  timeout 240 python3 scripts/gpu_hf.py --gguf "$WITCERT_GGUF" --out "$OUT/hf.json" 2>&1 | tee "$OUT/hf.log"
fi

echo "==== SUMMARY ===="
tail -n 3 "$OUT/tests.log"
sed -n '/^case /,$p' "$OUT/bench_write.log"
sed -n '/^shape /,$p' "$OUT/bench_decode.log"
sed -n '/^shape /,$p' "$OUT/tune_decode.log"
[ -f "$OUT/hf.log" ] && tail -n 12 "$OUT/hf.log"
exit 0
