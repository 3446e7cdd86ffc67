#!/usr/bin/env bash
# GPU call (2026-12-05h; issue 19, main after the i19-expm1 merge): the extend tests call 89 did not
# reach (its three shards that ran out of time: every EXT_TESTS node id on this machine less call 89's
# passed.txt), then the issue 19 table twice (run-to-run spread) against main before the merge
# (.gpu/prev/ext_main: `git show f03d650:witcert/kernels/cuda/{extend.cu,common.cuh}`), the
# measurement-only variant noqd (floor_variants.py: the query digits' shared-memory loads removed)
# and 8 warps per CTA, then Nsight Compute's memory and compute sections of one prefix launch (is the
# shared-memory pipe what bounds it?). Carry [".gpu/prev"]; timeout 560. At most 8 files come back.
source "$(dirname "$0")/gpu_common.sh"
[ -f .gpu/prev/ext_main/extend.cu ] || { echo "no .gpu/prev/ext_main: see the header"; exit 1; }
T0=$(date +%s)
timeout 100 python3 -m pytest --collect-only -q -p no:cacheprovider "${EXT_TESTS[@]}" 2>/dev/null | grep "::" | sort -u > /tmp/all_ext.txt
comm -23 /tmp/all_ext.txt <(sort -u reports/gpu-2026-12-05h/call89/passed.txt) > "$OUT/rest_ids.txt"
echo "== ext tests on this machine: $(wc -l < /tmp/all_ext.txt); not passed in call 89: $(wc -l < "$OUT/rest_ids.txt")"
mapfile -t IDS < "$OUT/rest_ids.txt"
[ ${#IDS[@]} -gt 0 ] && { run_shards rest 10 ${REST_T:-230} "${IDS[@]}"; wait; report_shards rest; }
grep -hE "::.* PASSED" /tmp/shard_rest_*.log 2>/dev/null | grep -o "tests/[^ ]*" | sort -u > /tmp/rest_passed.txt
echo "rest passed $(wc -l < /tmp/rest_passed.txt) of ${#IDS[@]}; still missing: $(comm -23 "$OUT/rest_ids.txt" /tmp/rest_passed.txt | wc -l)"
comm -23 "$OUT/rest_ids.txt" /tmp/rest_passed.txt | head -5
echo "tests done at $(( $(date +%s) - T0 )) s"
python3 benchmarks/floor_variants.py .gpu/fv > /dev/null
for r in 1 2; do
  (cd benchmarks && timeout 150 python3 bench_extend.py --bits 16 --shapes 0,1,2 --cuda-warps 8 \
    --cuda-prev ../.gpu/prev/ext_main/extend.cu ../.gpu/fv/noqd/extend.cu) > "$OUT/bench_extend16_$r.log" 2>&1
  echo "== bench run $r"; grep -E "^(shape|Np)" "$OUT/bench_extend16_$r.log" | grep -v triton
done
echo "bench done at $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout 120 ncu --clock-control none --kernel-name regex:wc_extend_prefix --launch-skip 1 --launch-count 1 \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
  --section ComputeWorkloadAnalysis --section Occupancy --section SchedulerStats \
  python3 profile_extend.py --shape 4096,512,32,8 --cert on) > "$OUT/ncu_prefix_mem.txt" 2>&1
grep -iE "Duration|Shared|Throughput|Pipe|Issue Slots|Ipc|Bank|Occupancy|L2 Hit|Registers" "$OUT/ncu_prefix_mem.txt" | head -40
echo "done at $(( $(date +%s) - T0 )) s"
