#!/usr/bin/env bash
# GPU call: the write kernel's tests (with the new bf16-subnormal-in-a-bypassed-channel case, which
# the Triton interpreter cannot check) and the extend's float-tier / certificate cases that the
# 330 s shards of calls 56-57 did not reach, all of them again, in 8 shards.
source "$(dirname "$0")/gpu_common.sh"
run_shards write 2 400 tests/test_kernels_write.py
run_shards tier 8 ${TIER_S:-470} tests/test_kernels_extend.py -k float_tier_and_sound_certificate
wait; report_shards write tier
for n in write tier; do echo "$n: $(grep -h "PASSED\|FAILED\|ERROR" /tmp/shard_${n}_*.log | grep -o " PASSED\| FAILED\| ERROR" | sort | uniq -c | tr '\n' ' ')"; done
