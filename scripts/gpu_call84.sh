#!/usr/bin/env bash
# GPU call (prepared 2026-12-05f for the next GPU session; issue 19, branch i19-tcdot): the extend's
# exact new tokens' q.k on tensor cores (16-bit q and keys; PROOFS 5.4). Before the call, here:
#   mkdir -p .gpu/prev && git show main:witcert/kernels/extend.py > .gpu/prev/extend_main.py
# and pass carry [".gpu/prev"]. First the probe of the signed accumulation model the route stands on
# (if it fails, the route is unsound on this GPU: stop there), then the extend's GPU tests beside
# the fp16 / bf16 adversarial sweeps, then the issue 19 table against main's extend.py in the same run.
source "$(dirname "$0")/gpu_common.sh"
[ -f .gpu/prev/extend_main.py ] || { echo "no .gpu/prev/extend_main.py: see the header"; exit 1; }
T0=$(date +%s); ET=${EXT_T:-260}
timeout 150 python3 -m pytest -q -s -rfE -p no:cacheprovider tests/test_tc_signed_dot.py > "$OUT/probe.log" 2>&1
echo "== probe: $(tail -1 "$OUT/probe.log")"; grep -E "of beta|^FAILED|Error" "$OUT/probe.log" | head -10
grep -q " failed" "$OUT/probe.log" && { echo "the model failed: the tensor-core route is not sound here"; exit 1; }
for p in triton_extend_fp16 triton_extend_bf16; do
  timeout "$ET" python3 benchmarks/soundness_sweep.py --paths $p --seed ${SEED:-337} --max-seconds $((ET - 40)) \
    > "$OUT/sweep_$p.log" 2>&1 &
done
ext_checks 8 "$ET" ${SEED:-337}
wait
for p in triton_extend_fp16 triton_extend_bf16; do grep -E "VIOLATION|^ *$p " "$OUT/sweep_$p.log" | tail -3; done
echo "checks done at $(( $(date +%s) - T0 )) s"
(cd benchmarks && timeout 200 python3 bench_extend.py --bits 16 --shapes 0,1,2 --prev ../.gpu/prev/extend_main.py \
  --out "$OUT/bench_extend16.jsonl") > "$OUT/bench_extend16.log" 2>&1
(cd benchmarks && timeout 40 python3 profile_extend.py --shape 4096,512,32,8 --cert on --reps 3 --kernels) \
  > "$OUT/kernels_4096_512_on.txt" 2>&1
grep -E "wc_extend|_extend_kernel|_new_key_stats" "$OUT/kernels_4096_512_on.txt" | cut -c1-60,100-170
grep -E "^(shape|Np)" "$OUT/bench_extend16.log" | tail -20
echo "done at $(( $(date +%s) - T0 )) s"
