#!/usr/bin/env bash
# GPU call (2026-12-06c; issues 14, 19): on an H200 (the card of the issues' first tables) the issues'
# tables at main's kernels: the decode's (bench_decode.py --quick), the extend's (bench_extend.py, the
# three shapes, b 8) and the writer's (bench_write.py), each against its baseline in the same run;
# then, on any card, end to end at model scale against the compiled HF baseline, which was last
# measured (9c) with the first decode kernel: Llama-3-8B shape, random bf16 weights (the text is
# meaningless, the cost is real), contexts 8k / 32k, batches 1 / 4 / 16, HF StaticCache under
# torch.compile against witcert's captured step, certificates on and off. About 560 s.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
if nvidia-smi -L | grep -q H200; then
  issue_tables
  echo "tables at $(( $(date +%s) - T0 )) s"
fi
E2E=$(( 575 - ($(date +%s) - T0) ))
timeout $E2E python3 benchmarks/bench_e2e_gpu.py --archs llama3-8b --contexts 8192,32768 --batches 1,4,16 \
  --methods sdpa-static-compiled,witcert-graph,witcert-graph-nocert --compile-cells 6 \
  --budget-s $(( E2E - 25 )) --out "$OUT/e2e" > "$OUT/e2e.log" 2>&1
tail -32 "$OUT/e2e.log"
echo "done at $(( $(date +%s) - T0 )) s"
