#!/usr/bin/env bash
# GPU call (issue 19): the extend benchmark at the final commit (the CUDA prefix phase, the default,
# against the Triton kernel alone and SDPA fp16 in the same run), then Nsight Compute's view of one
# launch of extend.cu at 4096 + 512 (throughput, occupancy, warp stall reasons).
source "$(dirname "$0")/gpu_common.sh"
timeout ${BENCH_S:-200} python3 benchmarks/bench_extend.py --out "$OUT/bench_extend.json" > "$OUT/bench_extend.log" 2>&1
tail -17 "$OUT/bench_extend.log"
cat > /tmp/one_extend.py <<'PY'
import sys, torch
sys.path.insert(0, "benchmarks"); sys.path.insert(0, "tests")
from bench_extend import build
from witcert.config import CertConfig
from witcert.kernels.extend import extend_attention
layer, slots, q, kn, vn, kp, vp = build(4096, 512, 32, 8, 16, torch.Generator(device="cuda").manual_seed(0))
for _ in range(2):
    extend_attention(q, kn, vn, layer, slots, sm_scale=128 ** -0.5, cert=CertConfig(radius="min"), delta_loc=1e-9)
torch.cuda.synchronize()
PY
timeout ${NCU_S:-150} ncu --kernel-name wc_extend_prefix --launch-skip 1 --launch-count 1 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats --section InstructionStats \
  python3 /tmp/one_extend.py > "$OUT/ncu_extend.txt" 2>&1
grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Stall|Executed Ipc|Registers" "$OUT/ncu_extend.txt" | head -40
