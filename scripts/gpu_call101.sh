#!/usr/bin/env bash
# GPU call (2026-12-06; issue 14): every GPU test file after b = 8 became the default, in 15 shards,
# the files that run the default configuration first (a short call cuts the last ones: the node
# ids that passed are in $OUT/passed.txt). No sweeps: they set their bits explicitly (8 and 16).
# Then, unless BENCH=0, the decode's issue table at the new default on this card (bench_decode.py
# --quick, about 110 s). About TESTS_S + 130 s; no carry; e.g. TESTS_S=320 with timeout 480.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
FIRST=(tests/test_kernels_decode.py tests/test_cuda_auto.py tests/test_cuda_graph.py tests/test_hf_graph_gpu.py
  tests/test_kernels_write.py tests/test_cuda_write.py tests/test_attention_dtypes.py tests/test_position_dither.py
  tests/test_repair.py tests/test_telemetry.py tests/test_report_runtime.py tests/test_backend_extend.py)
REST=()
for f in "${ALL_GPU_TESTS[@]}"; do [[ " ${FIRST[*]} " == *" $f "* ]] || REST+=("$f"); done
run_shards all 15 ${TESTS_S:-210} "${FIRST[@]}" "${REST[@]}"
wait; report_shards all
tally_shards all
echo "tests done at $(( $(date +%s) - T0 )) s"
if [ "${BENCH:-1}" = 1 ]; then
  decode_table 150 34
fi
echo "done at $(( $(date +%s) - T0 )) s"
