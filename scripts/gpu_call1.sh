#!/usr/bin/env bash
# GPU call: the >= 1e5 soundness sweeps of the GPU kernels (two seeds x 50k per path, in
# parallel: the exact TV runs on the CPU), the extend/backend tests, an Nsight Compute
# profile of the decode split kernel. Keeps the first half of the bundled GGUF in /tmp.
set -uo pipefail
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/witcert_gpu}; mkdir -p "$OUT"
cp .models/smol.gguf.partaa /tmp/ 2>/dev/null
{ date -u; nvidia-smi -L; git rev-parse HEAD 2>/dev/null
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee "$OUT/env.log"
for p in triton cuda; do for s in 1 2; do
  timeout 330 python3 benchmarks/soundness_sweep.py --paths $p --cases 50000 --seed $s \
    --out "$OUT/sweep_${p}_s$s.jsonl" > "$OUT/sweep_${p}_s$s.log" 2>&1 &
done; done
timeout 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_backend_extend.py > "$OUT/tests_backend_extend.log" 2>&1
tail -3 "$OUT/tests_backend_extend.log"
wait
python3 - "$OUT" <<'PY'
import json, glob, sys
tot = {}
for f in sorted(glob.glob(sys.argv[1] + "/sweep_*_s*.jsonl")):
    for line in open(f):
        r = json.loads(line); t = tot.setdefault(r["path"], dict(certs=0, violations=0, nan=0, negative=0, inf=0, nan_out=0, worst_ratio=0.0, seconds=0.0))
        for k in ("certs", "violations", "nan", "negative", "inf", "nan_out", "seconds"): t[k] += r[k]
        t["worst_ratio"] = max(t["worst_ratio"], r["worst_ratio"])
        print(f, r)
for p, t in tot.items(): print("TOTAL", p, t)
PY
grep -h VIOLATION "$OUT"/sweep_*.log | head
cd benchmarks
for sh in 16,32,8,4096 1,28,4,131072; do
  timeout 120 ncu --kernel-name regex:_decode_split --launch-skip 2 --launch-count 1 --set full \
    --print-details all python3 profile_decode.py --shape $sh --bits 8 > "$OUT/ncu_$sh.log" 2>&1
  grep -E "Duration|Registers Per|Achieved Occupancy|Compute \(SM\) Throughput|Memory Throughput|Executed Ipc A|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Local Memory Spill|Dynamic Shared|Static Shared" "$OUT/ncu_$sh.log" | head -20
done
cd ..
