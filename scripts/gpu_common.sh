# Sourced by the scripts/gpu_call*.sh scripts (from the repository root): the environment and
# its log in $OUT, and pytest sharded over the GPU machine's cores (WITCERT_SHARD=i/n,
# tests/conftest.py; the exact-TV checks run on the CPU, the kernels share the GPU).
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/witcert_gpu}; mkdir -p "$OUT"
{ date -u; nvidia-smi -L; git log --oneline -1 2>/dev/null
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee "$OUT/env.log"

run_shards() {  # name, shards, timeout (s), pytest args...: starts the shards in the background
  local name=$1 n=$2 t=$3; shift 3
  for i in $(seq 0 $((n - 1))); do
    OMP_NUM_THREADS=1 WITCERT_SHARD=$i/$n timeout "$t" python3 -m pytest -v -rfE -p no:cacheprovider "$@" \
      > "/tmp/shard_${name}_$i.log" 2>&1 &
  done
}
report_shards() {  # name...: after `wait`, one log per name in $OUT, a summary line, the failures
  local name f
  for name in "$@"; do
    for f in /tmp/shard_${name}_*.log; do echo "### $f"; cat "$f"; done > "$OUT/tests_$name.log"
    echo "== $name: $(grep -hE ' in [0-9.]+s' /tmp/shard_${name}_*.log | tr '\n' ';')"
    grep -h "^FAILED\|^ERROR" /tmp/shard_${name}_*.log | head -10
  done
}
