#!/usr/bin/env bash
# GPU call (2026-12-07c; issue 19, branch i19-f16keys): the rest of call 142's GPU tests. Call 142
# (reports/gpu-2026-12-07c/call142) ran every GPU test file in 16 shards of 200 s, too short: 274
# tests passed, one failed without its traceback (killed with its shard), 226 never ran. This call
# collects the same files here, takes out the 273 passed node ids (call142/passed.txt) and runs the
# rest, the failed one among them (its upper tolerance now allows the fp16 route's slack, as the
# CUDA-vs-Triton comparison does), with tracebacks. About 300 s.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
python3 -m pytest --collect-only -q -p no:cacheprovider "${ALL_GPU_TESTS[@]}" 2>/dev/null | grep "::" | sort -u > "$OUT/all_ids.txt"
sort -u reports/gpu-2026-12-07c/call142/passed.txt > /tmp/p142.txt
comm -23 "$OUT/all_ids.txt" /tmp/p142.txt > "$OUT/todo.txt"
echo "collected $(wc -l < "$OUT/all_ids.txt"), passed in call 142 $(wc -l < /tmp/p142.txt), to run $(wc -l < "$OUT/todo.txt") (at $(( $(date +%s) - T0 )) s)"
mapfile -t TODO < "$OUT/todo.txt"
run_shards rest 16 "${CHECK_T:-300}" "${TODO[@]}"
wait; report_shards rest; tally_shards rest
grep -h -B2 -A25 "^___" /tmp/shard_rest_*.log | head -80
echo "done at $(( $(date +%s) - T0 )) s"
