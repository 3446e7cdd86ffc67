#!/usr/bin/env bash
# GPU call (issues 19, 14): where the CUDA extend's cycles go, for the shipped kernel and for its
# skeleton (floor_variants.py r0codes, certificate off: no Philox work, no dither planes, one digit),
# and the decode's skeleton against the shipped decode: Nsight Compute's scheduler and warp-state
# sections, one launch each (4096 + 512; B16 S4096), clocks unlocked as in 4j.
source "$(dirname "$0")/gpu_common.sh"
T0=$(date +%s)
FV=/tmp/fv; python3 benchmarks/floor_variants.py $FV > "$OUT/floor_variants.log" 2>&1
prof ext_default wc_extend_prefix profile_extend.py --shape 4096,512,32,8 --cert on
prof ext_default_off wc_extend_prefix profile_extend.py --shape 4096,512,32,8 --cert off
prof ext_r0codes_off wc_extend_prefix profile_extend.py --shape 4096,512,32,8 --cert off --src $FV/r0codes/extend.cu
prof dec_r0codes_off regex:wc_decode_split profile_decode.py --shape 16,32,8,4096 --bits 16 --cert off --src $FV/r0codes/decode.cu
prof dec_default regex:wc_decode_split profile_decode.py --shape 16,32,8,4096 --bits 16 --cert on
echo "done at $(( $(date +%s) - T0 )) s"
