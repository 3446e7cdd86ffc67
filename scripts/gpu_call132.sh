#!/usr/bin/env bash
# GPU call (2026-12-06h; issue 19), about 330 s. (1) tests/test_expm1_bound.py on the device (its GPU
# half last ran in call 89). (2) Ping-pong, measured: the prefix kernel at 8 warps with its two
# warpgroups taking turns at the integer q.k (one group's dots on the tensor cores while the other's
# softmax, certificate and p.v issue; three staged tiles), the variant .gpu/var/pp/extend.cu (carry
# .gpu/var): bitwise A/B against main's kernel at 8 warps (one pass, chunks), then timed against
# main at 4 (the default) and 8 warps in the same run. (3) The extend's kernels one by one at
# 4096 + 2048 and the new tokens' Triton kernel under Nsight Compute there.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
timeout 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_expm1_bound.py > "$OUT/expm1_probe.log" 2>&1
echo "expm1 probe: $(tail -1 "$OUT/expm1_probe.log")  at $(( $(date +%s) - T0 )) s"
ext_ab .gpu/var/pp/extend.cu 200 - --warps 8 --old-warps 8
echo "A/B done at $(( $(date +%s) - T0 )) s"
ext_table 200 0,1,2 40 --bits 8 --cuda-warps 8 --cuda-prev ../.gpu/var/pp/extend.cu
echo "table done at $(( $(date +%s) - T0 )) s"
ext_kernels 100 --bits 8
prof newtok regex:_extend_kernel profile_extend.py --shape 4096,2048,32,8 --bits 8 --cert on
echo "done at $(( $(date +%s) - T0 )) s"
