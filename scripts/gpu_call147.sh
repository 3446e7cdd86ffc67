#!/usr/bin/env bash
# GPU call (2026-12-07d; issue 19, branch i19-lean-cert): the GPU tests call 146 left unreported. Its 16
# shards of every GPU test file ran on this kernel (only comments changed since), 449 passed, 2
# skipped, and four shards ran past their 300 s (killed mid-test; call 145: two):
# the 54 node ids in call146/not_passed.txt run here in 8 shards, each logging straight into $OUT.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
mapfile -t TODO < reports/gpu-2026-12-07d/call146/not_passed.txt
echo "to run: ${#TODO[@]}"
for i in $(seq 0 7); do
  OMP_NUM_THREADS=2 WITCERT_SHARD=$i/8 timeout "${CHECK_T:-300}" python3 -m pytest -v -rfE -p no:cacheprovider \
    "${TODO[@]}" > "$OUT/shard_$i.log" 2>&1 &
done
wait
for i in $(seq 0 7); do echo "shard $i: $(grep -cE ' PASSED' "$OUT/shard_$i.log") passed, $(grep -E ' in [0-9.]+s' "$OUT/shard_$i.log" | tail -1)"; done
grep -h "PASSED\|FAILED\|ERROR\|SKIPPED" "$OUT"/shard_*.log | grep -o " PASSED\| FAILED\| ERROR\| SKIPPED" | sort | uniq -c
grep -h "^FAILED\|^ERROR\|SKIPPED" "$OUT"/shard_*.log | head -20
grep -h -B2 -A30 "^___" "$OUT"/shard_*.log | head -100
echo "done at $(( $(date +%s) - T0 )) s"
