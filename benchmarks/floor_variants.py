"""Measurement-only builds of the CUDA kernels, to price parts of their work (issues 14, 19).

Writes into OUT_DIR one folder per variant with a copy of ``decode.cu``, ``extend.cu`` and an
edited ``common.cuh`` (a quoted include finds the copy next to the kernel first):

- ``r0``: Philox with 0 rounds (the dither words are the counters: no Philox work).
- ``r0codes``: r0, and each logit from its leading digit and the codes only (``digit_term``
  without the dither planes, ``group_logit`` without digits 2 and 3, so the compiler drops
  those integer dots and their combination). Since the extend combines its dots by integer
  pieces in ``extend.cu`` (BENCHMARKS.md 13h) this edit reaches the decode only; ``extend.cu``
  in this folder is r0's.
- ``konly`` (decode.cu, K / V warp pairs): the V warp only takes part in the hand-off (its
  dither, operands and p.v dropped): the K side's time alone.
- ``noqk`` (extend.cu): the prefix kernel without its q.k (each logit a staged record times the
  row factor): the floor of everything else in the tile loop. (The variants that priced the
  aligned keys' q.k, ``f16qk``, ``f16g``, ``noqd`` and ``d2``, went with that route on 2026-12-07:
  BENCHMARKS.md 13s-13ak.)
- ``tn16``, ``tn16r168`` (extend.cu): the prefix kernel on 16-token tiles (about 72 KB of shared
  memory per CTA instead of 98, room for three CTAs per SM), the second also capped at 168
  registers, so that three CTAs (three warps per scheduler) fit. Measurement-only because the
  launcher counts the softmax's rescales per 32-token tile (``EXTEND_TILE``): their ``e_soft``
  is short, their timing is not.
- ``tiledcert`` (extend.cu): the certificate's per-token terms per tile (BENCHMARKS.md 13aw,
  ``tile_cert_study.py``): no per-(row, token) radius, root, minimum or ``expm1``; the tokens'
  radius entries summed with the weights on tensor cores in the p.v loop (three more fp16 mma per
  16 tokens, their B operands the records' fp32 entries converted in place: a real build would
  stage them in fp16), then per (row, tile) the row's entries against those sums, a root, a
  minimum and ``expm1(U_t) / U_t`` with U_t from the row's entries against one token's (a real
  build: the tile's maxima). What the tiled form would cost, not what it computes.
- ``vonly`` (decode.cu, pairs): the K warp hands over constant weights without computing
  logits, softmax or certificate terms: the V side's time alone (with the certificate's V
  scale loads of the hand-off).

Their outputs and certificates are wrong by construction: they only say what the same kernel
costs without that work (``bench_extend.py --cuda-prev DIR/r0/extend.cu ...``,
``bench_decode_cuda_prev.py --prev DIR/r0/decode.cu ...``, each timed against the shipped
source in the same run). Usage: python benchmarks/floor_variants.py OUT_DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "witcert" / "kernels" / "cuda"

EDITS = {
    "r0": [("constexpr int ROUNDS = WC_ROUNDS;", "constexpr int ROUNDS = 0;")],
    "r0codes": [("constexpr int ROUNDS = WC_ROUNDS;", "constexpr int ROUNDS = 0;"),
                ("    if constexpr (BITS == 16)\n        r = __fmaf_rn(__fmaf_rn(__int_as_float(cj1)",
                 "    if constexpr (false)\n        r = __fmaf_rn(__fmaf_rn(__int_as_float(cj1)"),
                ("    else\n        r = __fmaf_rn(__int_as_float(cj0) - 12582912.0f, -2.0f, r);",
                 "    else if constexpr (false)\n        r = __fmaf_rn(__int_as_float(cj0) - 12582912.0f, -2.0f, r);"),
                ("const float tt = __fmaf_rn(__fmaf_rn(t3, 0.0078125f, t2), 0.0078125f, t1);",
                 "const float tt = t1;")],
}

# edits of extend.cu (the variants above leave it as it is); the q.k block is taken from the source
_QK_FROM, _QK_TO = "        // ---- logits of the warp's 16 rows x TN tokens", "        // the logit C 2^e sm r_K, one rounding"
_NOQK = """        // ---- logits (measurement-only noqk: no q.k, a staged record times the row factor) --
        float z[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const float u0 = s_rec[8 * nt + 2 * t], u1 = s_rec[8 * nt + 2 * t + 1];
#pragma unroll
            for (int v = 0; v < 4; v++) z[nt][v] = __fmul_rn(rowf[v >> 1], (v & 1) ? u1 : u0);
        }
"""


def _qk_block() -> str:
    text = (SRC / "extend.cu").read_text()
    return text[text.index(_QK_FROM): text.index(_QK_TO)]


_CERT_FROM = "        // ---- certificate terms of (row, token) -----"
_PV_FROM = "        // ---- p.v: weights (A, fp16) x the staged values"
_TILED_U = """        // ---- certificate (measurement-only tiledcert): U_t and f(U_t) per row; the tokens' entries
        // summed with the weights in the p.v loop, folded after it ----
        float ft[2] = {0.0f, 0.0f}, ce[3][4];
        if (a.cert) {
#pragma unroll
            for (int e = 0; e < 3; e++)
#pragma unroll
                for (int v = 0; v < 4; v++) ce[e][v] = 0.0f;
            const float4 ax = lds_f4(&s_afr[tid][0]), ay = lds_f4(&s_afr[tid][1]);
            const float4 as2 = lds_f4(&s_afr[tid][2]);
            const float *const mb = s_rec + R_B + t * BST + 2 * g;
#pragma unroll
            for (int x = 0; x < 2; x++) {
                float ux = __fmaf_rn(x ? ax.y : ax.x, mb[0], (x ? ax.w : ax.z) * mb[1]);
                float uy = __fmaf_rn(x ? ay.y : ay.x, mb[4 * BST], (x ? ay.w : ay.z) * mb[4 * BST + 1]);
                float us = __fmaf_rn(x ? as2.y : as2.x, mb[8 * BST], (x ? as2.w : as2.z) * mb[8 * BST + 1]);
#pragma unroll
                for (int o = 1; o < 4; o <<= 1) {
                    ux += __shfl_xor_sync(FULL, ux, o);
                    uy += __shfl_xor_sync(FULL, uy, o);
                    us += __shfl_xor_sync(FULL, us, o);
                }
                const float U = tc_radius_m<RM>(ux, uy, us, rtail[x]);
                ft[x] = U > 0.0f ? __fdividef(expm1_up_exp(U), U) : 1.0f;
                cu[x] = (rovf[x] || !(U <= INF)) ? INF : fmaxf(cu[x], U);
            }
        }

"""
_PV_LOOP = "#pragma unroll\n            for (int n2 = 0; n2 < HD / 16; n2++) {"
_TILED_MMA = """            if (a.cert) {  // measurement-only tiledcert: the tokens' entries (x, y, s2) by the weights
#pragma unroll
                for (int e = 0; e < 3; e++) {
                    const float *const eb = s_rec + R_B + (4 * e + (g & 3)) * BST + 2 * (16 * kc + 2 * t);
                    const float2 e0 = *reinterpret_cast<const float2 *>(eb);
                    const float2 e1 = *reinterpret_cast<const float2 *>(eb + 16);
                    mma_f16(ce[e], pa, h2bits(__floats2half2_rn(e0.x, e0.y)),
                            h2bits(__floats2half2_rn(e1.x, e1.y)));
                }
            }
"""
_PV_END = "        __syncwarp();\n        if (lane == 0) mbar_arrive(bar0 + 16 + 8 * (it & 1));"
_TILED_FOLD = """        if (a.cert) {  // measurement-only tiledcert: per row, the sums against its entries, f(U_t)
            const float4 ax = lds_f4(&s_afr[tid][0]), ay = lds_f4(&s_afr[tid][1]);
            const float4 as2 = lds_f4(&s_afr[tid][2]);
#pragma unroll
            for (int x = 0; x < 2; x++) {
                float sx = __fmaf_rn(x ? ax.y : ax.x, ce[0][2 * x], (x ? ax.w : ax.z) * ce[0][2 * x + 1]);
                float sy = __fmaf_rn(x ? ay.y : ay.x, ce[1][2 * x], (x ? ay.w : ay.z) * ce[1][2 * x + 1]);
                float ss = __fmaf_rn(x ? as2.y : as2.x, ce[2][2 * x], (x ? as2.w : as2.z) * ce[2][2 * x + 1]);
#pragma unroll
                for (int o = 1; o < 4; o <<= 1) {
                    sx += __shfl_xor_sync(FULL, sx, o);
                    sy += __shfl_xor_sync(FULL, sy, o);
                    ss += __shfl_xor_sync(FULL, ss, o);
                }
                const float r = tc_radius_m<RM>(sx, sy, ss * ps[x], 0.0f);  // (ps: this lane's share)
                add[x] = t == 0 ? ft[x] * r : 0.0f;
                ca[x] = (ca[x] == INF ? INF : ca[x] * alpha[x]) + add[x];
            }
        }
"""

EXTEND_EDITS = {
    "tn16": [("#define WC_TN 32", "#define WC_TN 16")],
    "tn16r168": [("#define WC_TN 32", "#define WC_TN 16\n#define WC_MAXREG 168")],
    "noqk": [(None, _NOQK)],
    "tiledcert": [((_CERT_FROM, _PV_FROM), _TILED_U), (_PV_LOOP, _TILED_MMA + _PV_LOOP),
                  (_PV_END, _TILED_FOLD + _PV_END)],
}

# edits of decode.cu (the variants above leave it as it is)
_KONLY = "        if constexpr (SPLIT) { if (t0 + step < t_hi) bar_arrive(bar_empty, 64); } else __syncwarp();\n"
DECODE_EDITS = {
    "konly": [(_KONLY, _KONLY + "        if constexpr (SPLIT) return;\n")],
    "vonly": [("        float p[NV], alpha[NHL];\n", ""),
              ("        // ---- logits: per group,",
               "        float p[NV], alpha[NHL];\n        if constexpr (!SPLIT) {\n        // ---- logits: per group,"),
              ("        // ---- hand the tile's weights",
               "        } else {\n#pragma unroll\n            for (int v = 0; v < NV; v++) p[v] = 0.25f;\n"
               "#pragma unroll\n            for (int j = 0; j < NHL; j++) alpha[j] = 1.0f;\n        }\n"
               "        // ---- hand the tile's weights")],
}


def _edited(text: str, edits, name: str, file: str) -> str:
    """``text`` with each (old, new) edit applied; each old must occur exactly once (old None: the
    extend's q.k block; a pair (start, end): from start up to end, end kept)."""
    for old, new in edits:
        if isinstance(old, tuple):
            if not all(text.count(end) == 1 for end in old):
                raise SystemExit(f"floor_variants: {name}: {old!r} not found once in {file}")
            old = text[text.index(old[0]): text.index(old[1])]
        old = _qk_block() if old is None else old
        if text.count(old) != 1:
            raise SystemExit(f"floor_variants: {name}: {old!r} not found once in {file}")
        text = text.replace(old, new)
    return text


def write(out: Path) -> list[Path]:
    """The variant folders under ``out`` (created), each with its own decode.cu, extend.cu (the
    extend only for the common.cuh variants) and common.cuh; the tag line makes each variant's
    build cache key its own."""
    made = []
    common, decode = (SRC / "common.cuh").read_text(), (SRC / "decode.cu").read_text()
    variants = [(name, {"decode.cu": _edited(decode, edits, name, "decode.cu"), "common.cuh": common})
                for name, edits in DECODE_EDITS.items()]
    variants += [(name, {"common.cuh": _edited(common, edits, name, "common.cuh"), "decode.cu": decode,
                         "extend.cu": (SRC / "extend.cu").read_text()}) for name, edits in EDITS.items()]
    extend = (SRC / "extend.cu").read_text()
    variants += [(name, {"extend.cu": _edited(extend, edits, name, "extend.cu"), "common.cuh": common,
                         "decode.cu": decode}) for name, edits in EXTEND_EDITS.items()]
    for name, files in variants:
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        for file, text in files.items():
            tag = "" if file == "common.cuh" else f"// measurement-only variant {name}\n"
            (d / file).write_text(tag + text)
        made.append(d)
    return made


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    for d in write(Path(sys.argv[1])):
        print(d)
