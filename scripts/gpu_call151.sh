#!/usr/bin/env bash
# GPU call (2026-12-07d; issue 19, branch i19-tf32row), run as one command line on call 150's warm
# machine: the GPU tests of call 150's shards killed at 300 s (its /tmp shard logs still on the
# machine): every collected id of ALL_GPU_TESTS not PASSED there, in 8 shards, summaries only.
source "$(dirname "$0")/gpu_common.sh" >/dev/null
comm -23 <(python3 -m pytest --collect-only -q -p no:cacheprovider "${ALL_GPU_TESTS[@]}" 2>/dev/null | grep "::" | sort -u) \
  <(grep -hE "::.* PASSED" /tmp/shard_all_*.log | grep -o "tests/[^ ]*" | sort -u) > "$OUT/todo.txt"
wc -l < "$OUT/todo.txt"; mapfile -t TODO < "$OUT/todo.txt"
for i in $(seq 0 7); do
  OMP_NUM_THREADS=2 WITCERT_SHARD=$i/8 timeout 150 python3 -m pytest -q -rfE -p no:cacheprovider "${TODO[@]}" > "$OUT/s_$i.log" 2>&1 &
done
wait; cat "$OUT"/s_*.log | grep -E " in [0-9.]+s|^FAILED|^ERROR"; cat "$OUT"/s_*.log > "$OUT/rest.log"; rm "$OUT"/s_*.log
