#!/usr/bin/env bash
# GPU call (issue 14): the decode's software-pipelined token records and line prefetch.
# Builds the variants in parallel, runs the CUDA decode's GPU tests (sharded) and its adversarial
# sweep alongside, then, alone on the GPU, bench_decode_cuda_prev: the new decode.cu (prefetch
# into L1, WC_PF 2) against the previous one (_dec_head.cu, git show e8728ef:...decode.cu) and the
# new one without prefetch (WC_PF 0) and with L2 prefetch (WC_PF 1), b16 on the four shapes.
# Then (NCU=1, the default) Nsight Compute's warp-state sections of the new and the previous kernel.
# As run (BENCHMARKS.md 4j): common.cuh then had a switch WC_PF (0 none, 1 prefetch.global.L2, 2
# prefetch.global.L1, the default); _dec_pf0.cu / _dec_pf1.cu were decode.cu with "#define WC_PF 0" /
# "#define WC_PF 1" prepended, _dec_head.cu e8728ef's decode.cu. The switch was removed after
# this call (L1 and L2 measured the same; the tested L1 build is the source now).
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s); left() { echo $(( ${DEADLINE_S:-585} - ($(date +%s) - T0) )); }
TS=${TESTS_S:-240}
VARS="_dec_head.cu _dec_pf0.cu _dec_pf1.cu"
python3 - $VARS > "$OUT/prebuild.log" 2>&1 <<'PY' &
import sys, concurrent.futures as cf
from pathlib import Path
from witcert.kernels import cuda as wc
jobs = [(src, qgp, bits) for src in [None, *sys.argv[1:]] for qgp in (4, 8) for bits in (16,)]
def one(j):
    src, qgp, bits = j
    wc.library(qgp=qgp, group=32, bits=bits, rounds=10, arch="90", src=Path(src) if src else None)
    return j
with cf.ThreadPoolExecutor(8) as ex:
    for j in ex.map(one, jobs): print("built", j, flush=True)
PY
run_shards dec 10 $TS tests/test_kernels_decode.py tests/test_cuda_graph.py tests/test_fp_soundness.py \
  tests/test_cuda_auto.py tests/test_position_dither.py tests/test_hf_graph_gpu.py
timeout $TS python3 benchmarks/soundness_sweep.py --paths cuda --seed 61 --max-seconds $((TS - 40)) > "$OUT/sweep_cuda.log" 2>&1 &
wait; report_shards dec
grep -E "VIOLATION|certs|^ *cuda" "$OUT/sweep_cuda.log" | tail -4; tail -3 "$OUT/prebuild.log"
timeout $(( $(left) - ${NCU_S:-150} - 5 )) python3 benchmarks/bench_decode_cuda_prev.py --prev $VARS --shapes 0 1 2 3 --bits 16 \
  --no-triton --out "$OUT/bench_ab.json" > "$OUT/bench_ab.log" 2>&1
tail -28 "$OUT/bench_ab.log"
if [ "${NCU:-1}" = 1 ]; then  # where a tile's cycles go: the new kernel and the previous one, B16 S4096 b16
  for v in now head; do
    src=""; [ $v = head ] && src="--src _dec_head.cu"
    timeout $(( $(left) / 2 - 5 )) ncu --clock-control none --kernel-name regex:wc_decode_split --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
      python3 benchmarks/profile_decode.py --shape 16,32,8,4096 --bits 16 $src > "$OUT/ncu_$v.txt" 2>&1
    echo "## ncu $v"; grep -E "Duration|Throughput|Achieved Occupancy|Issued Warp|No Eligible|Eligible Warps|Warp Cycles Per Issued|Registers|L1/TEX Hit|L2 Hit" "$OUT/ncu_$v.txt" | head -16
    grep -E "stalled" "$OUT/ncu_$v.txt" | sort -k3 -n -r | head -8
  done
fi
echo "done at $(( $(date +%s) - T0 )) s"
