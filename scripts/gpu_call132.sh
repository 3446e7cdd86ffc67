#!/usr/bin/env bash
# GPU call (prepared 2026-12-06g for a later session; issue 19): where the extend's time goes outside
# the prefix kernel. At 4096 + 2048 the exact new tokens' Triton kernel took 602 us of a 2,373 us call
# in 13u (before its 64-row tiles and the sanitized copies), on a causal block whose SDPA equivalent is
# about a fifth of SDPA's whole call (~110 us): the kernels one by one at 4096 + 2048 and at 4096 + 512,
# cert on and off, then Nsight Compute's view of the new tokens' kernel and of the prefix kernel at
# 4096 + 2048 (cert on); first tests/test_expm1_bound.py on the device. About 230 s; main's tree,
# nothing to carry.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
# first the GPU test file the list lacked until 2026-12-06g (its GPU half last ran in call 89)
timeout 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_expm1_bound.py > "$OUT/expm1_probe.log" 2>&1
echo "expm1 probe: $(tail -1 "$OUT/expm1_probe.log")"
ext_kernels 120 --bits 8
(cd benchmarks && timeout 120 python3 profile_extend.py --shape 4096,512,32,8 --bits 8 --cert on --reps 3 --kernels) > "$OUT/kernels_4096_512_on.txt" 2>&1
echo "## kernels 4096+512 cert on"; grep -E "wc_extend|_extend_kernel|_new_key_stats" "$OUT/kernels_4096_512_on.txt" | cut -c1-60,100-170
echo "listed at $(( $(date +%s) - T0 )) s"
prof newtok regex:_extend_kernel profile_extend.py --shape 4096,2048,32,8 --bits 8 --cert on
prof prefix2048 regex:wc_extend_prefix profile_extend.py --shape 4096,2048,32,8 --bits 8 --cert on
echo "done at $(( $(date +%s) - T0 )) s"
