#!/usr/bin/env bash
# GPU call (2026-12-06h; issue 19), about 400 s. (1) tests/test_expm1_bound.py on the device (its GPU
# half last ran in call 89). (2) Ping-pong, measured: the prefix kernel at 8 warps with its two
# warpgroups taking turns at the tensor cores (one group's dots while the other's softmax,
# certificate terms and p.v issue), two measurement-only variants (carry .gpu/var): pp (the turn is
# the integer q.k; three staged tiles) and pp2 (the turn is the previous tile's p.v and this tile's
# q.k, as FlashAttention-3 orders them). Each: bitwise A/B against main's kernel at 8 warps (one
# pass, chunks), then timed against main at 4 (the default) and 8 warps in the same run.
# (3) The extend's kernels one by one at 4096 + 2048.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
timeout 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/test_expm1_bound.py > "$OUT/expm1_probe.log" 2>&1
echo "expm1 probe: $(tail -1 "$OUT/expm1_probe.log")  at $(( $(date +%s) - T0 )) s"
for v in pp pp2; do
  timeout 200 python3 scripts/gpu_extend_ab.py .gpu/var/$v/extend.cu --warps 8 --old-warps 8 > "$OUT/ab_$v.log" 2>&1 &
  timeout 200 python3 scripts/gpu_extend_ab.py .gpu/var/$v/extend.cu --warps 8 --old-warps 8 --chunked > "$OUT/ab_${v}_chunked.log" 2>&1 &
done
wait
ab_summary ab_pp ab_pp_chunked ab_pp2 ab_pp2_chunked
echo "A/B done at $(( $(date +%s) - T0 )) s"
ext_table 240 0,1,2 48 --bits 8 --cuda-warps 8 --cuda-prev ../.gpu/var/pp/extend.cu ../.gpu/var/pp2/extend.cu
echo "table done at $(( $(date +%s) - T0 )) s"
ext_kernels 90 --bits 8
echo "done at $(( $(date +%s) - T0 )) s"
