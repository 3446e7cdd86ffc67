#!/usr/bin/env bash
# Ran as call 164 at 8ccc183 (BENCHMARKS 13ay). `tiledcert` has since left floor_variants.py: re-run it
# from a checkout of 8ccc183.
# GPU call prepared in session 2026-12-07h (issue 19): main with the two-halves fp16 keys (13av) timed on
# whatever card comes (meant for an H100, where 13ar's kernel read 0.483-0.488x SDPA at 4096 + 512),
# against the kernel before it (reports/gpu-2026-12-07h/main13ar, 13ar's, through main's launcher:
# timing only) and the measurement-only `tiledcert` (floor_variants.py: the certificate's per-token
# terms per tile, BENCHMARKS 13aw; its certificates are not what it would compute, only its cost) in the
# same run.
# RUNS (default 2) runs of bench_extend.py --queued over SHAPES (default 0,1,2,6,5,8: the issue's three,
# 32768 + 128, 32768 + 16, 4096 + 16), then one run over RSHAPES (default 0,1) pricing the radii
# (--radii min det prob); the host's time per call and its cProfile at 4096 + 512 and 4096 + 16
# (extend_host_cost.py --device cuda).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
python3 benchmarks/floor_variants.py /tmp/fv > /dev/null
for run in $(seq 1 ${RUNS:-2}); do
  ext_bench_smi "$run" "${BENCH_T:-200}" "${SHAPES:-0,1,2,6,5,8}" ../reports/gpu-2026-12-07h/main13ar/extend.cu \
    /tmp/fv/tiledcert/extend.cu --queued
  echo "## bench $run at $(( $(date +%s) - T0 )) s"; grep -v building "$OUT/bench_run$run.log" | grep -v "^{" | tail -45 | cut -c1-120
done
(cd benchmarks && timeout "${BENCH_T:-200}" python3 bench_extend.py --bits 8 --shapes "${RSHAPES:-0,1}" --no-triton \
  --radii min det prob) > "$OUT/bench_radii.log" 2>&1
echo "## radii at $(( $(date +%s) - T0 )) s"; grep -v building "$OUT/bench_radii.log" | grep -v "^{" | tail -9 | cut -c1-120
for sh in 4096_512 4096_16; do
  timeout 90 python3 benchmarks/extend_host_cost.py --device cuda --shape ${sh/_/,},32,8 --top 16 2>&1 | grep -v building \
    | cut -c1-150 > "$OUT/host_$sh.log"; head -3 "$OUT/host_$sh.log"
done
echo "done at $(( $(date +%s) - T0 )) s"
