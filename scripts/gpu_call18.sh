#!/usr/bin/env bash
# GPU call (issue 19): the CUDA extend prefix kernel (witcert/kernels/cuda/extend.cu): a smoke
# comparison with the Triton kernel, its GPU tests, then the extend benchmark (CUDA default vs
# Triton alone, SDPA fp16 in the same run). PARTS selects: smoke cudatests bench matrix decode sweep.
source "$(dirname "$0")/gpu_common.sh"
PARTS=${PARTS:-"smoke cudatests bench"}
has() { [[ " $PARTS " == *" $1 "* ]]; }
if has smoke; then
  timeout 120 python3 - <<'PY' 2>&1 | tee "$OUT/smoke.log"
import sys, torch
sys.path.insert(0, "tests")
from cases import make_layer, random_kv
from witcert.config import CertConfig
from witcert.kernels.extend import extend_attention
from witcert.kernels.plan import ExtendPlan
from witcert.kernels.write import write_kv_
for (np_, T, hq, hkv, bits) in [(100, 20, 8, 2, 16), (1000, 130, 32, 8, 16), (513, 64, 28, 4, 8)]:
    gen = torch.Generator().manual_seed(np_)
    layer = make_layer(hkv=hkv, d=128, num_slots=np_ + 8, bits=bits, device="cuda", gen=gen)
    slots = torch.randperm(np_ + 8, generator=gen)[:np_].cuda()
    kp, vp = random_kv(np_, hkv, 128, gen=gen)
    write_kv_(layer, kp.cuda(), vp.cuda(), slots=slots)
    kn, vn = (x.cuda() for x in random_kv(T, hkv, 128, gen=gen))
    q = torch.randn(T, hq, 128, generator=gen).cuda().half()
    r = {}
    for name, plan in (("triton", ExtendPlan(impl="triton")), ("cuda", ExtendPlan(impl="cuda")),
                       ("cuda w8", ExtendPlan(impl="cuda", cuda_warps=8))):
        dbg = {}
        r[name] = (extend_attention(q, kn, vn, layer, slots, sm_scale=128 ** -0.5, cert=CertConfig(), delta_loc=1e-6,
                                    debug=dbg, plan=plan), dbg)
    b, db = r["triton"]
    live = torch.isfinite(db["logits"])
    for name in ("cuda", "cuda w8"):
        a, da = r[name]
        print(np_, T, hq, hkv, bits, name, "impl", da["impl"], "out", (a.out - b.out).abs().max().item(),
              "lse", (a.lse - b.lse).abs().max().item(), "cert cuda/triton", a.cert.mean().item(), b.cert.mean().item(),
              "max rel", ((a.cert - b.cert).abs() / b.cert).max().item(),
              "logits", (da["logits"] - db["logits"])[live].abs().max().item(), "same live", torch.equal(live, torch.isfinite(da["logits"])))
PY
fi
if has cudatests; then
  timeout 200 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_kernels_extend.py -k "cuda or plan" \
    tests/test_cuda_build.py > "$OUT/tests_cuda_extend.log" 2>&1; tail -15 "$OUT/tests_cuda_extend.log"
fi
if has bench; then
  timeout ${BENCH_S:-240} python3 benchmarks/bench_extend.py --shapes ${BENCH_SHAPES:-0,1,2,3} ${BENCH_ARGS:-} --out "$OUT/bench_extend.json" \
    > "$OUT/bench_extend.log" 2>&1; tail -20 "$OUT/bench_extend.log"
fi
if has matrix; then
  run_shards ext ${EXT_N:-12} ${TESTS_S:-300} tests/test_kernels_extend.py
  wait; report_shards ext
fi
if has decode; then
  run_shards dec 12 ${DEC_S:-200} tests/test_kernels_decode.py tests/test_cuda_graph.py tests/test_backend_extend.py tests/test_cuda_build.py tests/test_position_dither.py tests/test_hf_graph_gpu.py \
    tests/test_fp_soundness.py tests/test_cuda_auto.py
  wait; report_shards dec
fi
if has sweep; then
  timeout ${SWEEP_S:-150} python3 benchmarks/soundness_sweep.py --paths triton_extend --seed 37 \
    --max-seconds $((${SWEEP_S:-150} - 30)) > "$OUT/sweep_extend.log" 2>&1; grep -E "VIOLATION|^triton|certificates" "$OUT/sweep_extend.log" | tail -5
fi
