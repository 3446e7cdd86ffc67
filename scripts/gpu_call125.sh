#!/usr/bin/env bash
# GPU call (2026-12-06f; issue 19; branch i19-prologue): call 124's first shape was an outlier for
# main's kernel (688 us, cert on and off alike); the table again with shape 0 run twice (the first a
# warm-up) and 4096 + 2048, against main's extend.cu in the same run. Carry .gpu/var; about 60 s.
source "$(dirname "$0")/gpu_common.sh"
ext_table 200 0,0,2,1 24 --cuda-prev ../.gpu/var/main/extend.cu
