#!/usr/bin/env bash
# GPU call (issue 19): the extend GPU tests that call 34's shards did not reach in their time
# (the same selection minus reports/gpu-2026-12-03c/call34/passed_call34.txt, the node ids that
# passed there), in parallel groups with more room.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
python3 -m pytest --collect-only -q -p no:cacheprovider "${EXT_TESTS[@]}" 2>/dev/null | grep "::" | sort > /tmp/all.txt
sort reports/gpu-2026-12-03c/call34/passed_call34.txt | comm -23 /tmp/all.txt - > "$OUT/rest.txt"
echo "selected $(wc -l < /tmp/all.txt), left $(wc -l < "$OUT/rest.txt")"
split -n r/${NGRP:-8} "$OUT/rest.txt" /tmp/grp_
for f in /tmp/grp_*; do
  OMP_NUM_THREADS=2 timeout ${TS:-480} python3 -m pytest -v -rfE -p no:cacheprovider $(cat "$f") > "$f.log" 2>&1 &
done
wait
cat /tmp/grp_*.log > "$OUT/tests_rest.log"
grep -hE "^=+ .* in [0-9.]+s" /tmp/grp_*.log
grep -hE "::.* (PASSED|FAILED|ERROR)" /tmp/grp_*.log | sed 's/.*:://' | cut -c1-120
echo "done at $(( $(date +%s) - T0 )) s"
