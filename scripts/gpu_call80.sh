#!/usr/bin/env bash
# GPU call (session of 2026-12-05e, issue 19): the aligned keys checked and timed in one command (one
# machine start): the extend's GPU checks, its timings, then Nsight Compute if the time allows. Every
# log goes to $OUT/w, packed into $OUT/logs.tgz at the end (the device returns at most 8 files).
FINAL_OUT=${OUT:-/tmp/witcert_gpu}; export OUT=$FINAL_OUT/w
source "$(dirname "$0")/gpu_common.sh"
[ -f .gpu/prev/copies/extend.cu ] || bash scripts/gpu_prev_aligned.sh || { echo "no baselines: carry .gpu/prev"; exit 1; }
T0=$(date +%s)
# checks: the extend's GPU tests and sweep, the build + emulation tests, the decode bitwise against main's
timeout 300 python3 scripts/gpu_decode_ab.py .gpu/prev/ext0/decode.cu > "$OUT/ab.log" 2>&1 &
OMP_NUM_THREADS=1 timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_build.py tests/test_extend_aligned_keys.py > "$OUT/tests_build.log" 2>&1 &
ext_checks 10 ${EXT_T:-300} ${SEED:-331}
wait
echo "== build + emulation: $(tail -1 "$OUT/tests_build.log")"
echo "== decode A/B: $(grep -c "same bits" "$OUT/ab.log") same-bits lines"; grep -E "DIFFERENT|bitwise|Error|error" "$OUT/ab.log" | head -6; tail -2 "$OUT/ab.log"
echo "checks done at $(( $(date +%s) - T0 )) s"
# timings: the head against main (ext0) and the two steps, in one run
(cd benchmarks && timeout 150 python3 bench_extend.py --bits 16 --shapes 0,1 --cuda-prev ../.gpu/prev/ext0/extend.cu ../.gpu/prev/aligned/extend.cu ../.gpu/prev/copies/extend.cu --out "$OUT/bench_extend16.jsonl") > "$OUT/bench_extend16.log" 2>&1
echo "b16 done at $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout 60 python3 bench_extend.py --bits 8 --shapes 0 --cuda-prev ../.gpu/prev/ext0/extend.cu --out "$OUT/bench_extend8.jsonl") > "$OUT/bench_extend8.log" 2>&1
echo "b8 done at $(( $(date +%s) - T0 )) s"
for c in on off; do
  (cd benchmarks && timeout 40 python3 profile_extend.py --shape 4096,512,32,8 --cert $c --reps 3 --kernels) > "$OUT/kernels_4096_512_$c.txt" 2>&1
  echo "## kernels 4096+512 cert $c"; grep -E "wc_extend|_extend_kernel" "$OUT/kernels_4096_512_$c.txt" | cut -c1-60,100-170
done
for f in bench_extend16 bench_extend8; do echo "## $f"; grep -E "\|" "$OUT/$f.log" | tail -12; done
echo "timings done at $(( $(date +%s) - T0 )) s"
# Nsight Compute of the two prefix kernels, while its 150 s limits still end inside the call
if [ "${NCU:-1}" = 1 ] && [ $(( $(date +%s) - T0 )) -lt 400 ]; then
  prof ext_aligned wc_extend_prefix profile_extend.py --shape 4096,512,32,8 --cert on
  [ $(( $(date +%s) - T0 )) -lt 420 ] && prof ext_main wc_extend_prefix profile_extend.py --shape 4096,512,32,8 --cert on --src ../.gpu/prev/ext0/extend.cu
fi
echo "done at $(( $(date +%s) - T0 )) s"
(cd "$FINAL_OUT" && tar czf logs.tgz w && rm -rf w)
