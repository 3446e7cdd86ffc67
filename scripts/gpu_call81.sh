#!/usr/bin/env bash
# GPU call (session of 2026-12-05e, issue 19), for a short lease: gpu_call80.sh reordered, the timings first
# (the head against main's extend.cu in one run, b 16 at 4096 / 32768 + 512), then as much of the
# extend's GPU tests and sweep as ${EXT_T:-150} s allow (the passed node ids in passed.txt), with the
# build + emulation tests beside them. Logs packed into $OUT/logs.tgz.
FINAL_OUT=${OUT:-/tmp/witcert_gpu}; export OUT=$FINAL_OUT/w
source "$(dirname "$0")/gpu_common.sh"
[ -f .gpu/prev/ext0/extend.cu ] || bash scripts/gpu_prev_aligned.sh || { echo "no baselines: carry .gpu/prev"; exit 1; }
T0=$(date +%s)
(cd benchmarks && timeout 100 python3 bench_extend.py --bits 16 --shapes 0,1 --cuda-prev ../.gpu/prev/ext0/extend.cu --out "$OUT/bench_extend16.jsonl") > "$OUT/bench_extend16.log" 2>&1
echo "## bench_extend16 (done at $(( $(date +%s) - T0 )) s)"; grep -E "\|" "$OUT/bench_extend16.log" | tail -12; tail -3 "$OUT/bench_extend16.log"
OMP_NUM_THREADS=1 timeout "${EXT_T:-150}" python3 -m pytest -q -p no:cacheprovider tests/test_cuda_build.py tests/test_extend_aligned_keys.py > "$OUT/tests_build.log" 2>&1 &
ext_checks 12 "${EXT_T:-150}" "${SEED:-331}"
wait
echo "== build + emulation: $(tail -1 "$OUT/tests_build.log")"
echo "done at $(( $(date +%s) - T0 )) s"
(cd "$FINAL_OUT" && tar czf logs.tgz w && rm -rf w)
