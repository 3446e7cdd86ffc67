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
- ``f16qk`` (extend.cu): the prefix kernel's q.k as the fp16 route of BENCHMARKS.md 13s would run
  it: per 16 channels one ``ldmatrix`` of the query rows, one of two fp16 key pieces and two
  ``m16n8k16`` MMAs into one fp32 accumulator, the logit that accumulator times the row factor
  and ``U_t``; the staging pass writes four byte planes (two fp16 pieces' bytes), the fourth 0.
  The bytes it reads are the aligned keys' and digits', so its logits are meaningless: it prices
  the route's instructions, registers and copies only.
- ``noqk`` (extend.cu): the prefix kernel without its q.k (each logit the token's unit times the
  row factor): the floor of everything else in the tile loop.
- ``noqd`` (extend.cu): the prefix kernel without the query digits' ``ldmatrix`` loads (48 per
  warp and 32-token tile, 24 KB of shared-memory reads): the key fragments, xor'd with a
  digit-dependent byte (no two MMAs alike, so none merge), stand in as the A operands of the same
  integer MMAs. It prices the digits' shared-memory traffic (with 4 LOP3 a digit added).
- ``d2`` (extend.cu): the prefix kernel's q.k with two 8-bit query digits instead of three 7-bit
  ones: five integer MMAs a k-step instead of seven, the two pairs of equal weight ((1,0) and
  (0,1), (1,1) and (0,2)) chained on one accumulator each, so three accumulators (12 registers)
  instead of seven (28) and three pieces to combine. It reads the 7-bit digits, so its logits are
  wrong: it prices the design's instructions and registers (whose slack would grow, the third
  digit's part joining the query's residual).
- ``tn16``, ``tn16r168`` (extend.cu): the prefix kernel on 16-token tiles (about 72 KB of shared
  memory per CTA instead of 98, room for three CTAs per SM), the second also capped at 168
  registers, so that three CTAs (three warps per scheduler) fit. Measurement-only because the
  launcher counts the softmax's rescales per 32-token tile (``EXTEND_TILE``): their ``e_soft``
  is short, their timing is not.
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
_QK_FROM, _QK_TO = "        // ---- logits of the warp's 16 rows x TN tokens (aligned keys)", "        // a logit is finite or +-inf"
_F16QK = """        // ---- logits (measurement-only f16qk: fp16 q x two fp16 key pieces, one fp32 accumulator) --
        float z[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int ks = 0; ks < HD / 16; ks++) {
                uint32_t qa[4], kb[4];
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                             : "=r"(qa[0]), "=r"(qa[1]), "=r"(qa[2]), "=r"(qa[3])
                             : "r"(qd_lane + (uint32_t)((ks / 4) * ROWS * QROW + 32 * (ks % 4))));
                const uint32_t ka = s_kb + (uint32_t)key_offset(2 * (ks / 4), 8 * nt, 32 * (ks % 4));
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                             : "=r"(kb[0]), "=r"(kb[1]), "=r"(kb[2]), "=r"(kb[3]) : "r"(ka + kl01));
                mma_f16(c, qa, kb[0], kb[1]);  // hi
                mma_f16(c, qa, kb[2], kb[3]);  // lo
            }
            const float u0 = s_rec[8 * nt + 2 * t], u1 = s_rec[8 * nt + 2 * t + 1];
#pragma unroll
            for (int v = 0; v < 4; v++)
                z[nt][v] = __fmul_rn(__fmul_rn(c[v], rowf[v >> 1]), (v & 1) ? u1 : u0);
        }
"""

_NOQK = """        // ---- logits (measurement-only noqk: no q.k, the token's unit times the row factor) --
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


# noqd: the digits' A fragments not loaded (the key fragments stand in; the same integer MMAs)
_QD_LOAD = """                    uint32_t qa[4];  // the rows' digit j over k-step ks (A fragment)
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                                 : "=r"(qa[0]), "=r"(qa[1]), "=r"(qa[2]), "=r"(qa[3])
                                 : "r"(qd_lane + (uint32_t)(j * ROWS * QROW + 32 * ks)));
"""
_QD_NONE = """                    const uint32_t xj = 0x01010101u * j, qa[4] = {kb[0][0] ^ xj, kb[0][1] ^ xj, kb[1][0] ^ xj, kb[1][1] ^ xj};  // noqd
"""

# d2: edits of the q.k block (its loads stay the kernel's): two digits, three chained accumulators
_D2 = [
    ("            int c[NKEPT][4];  // D_jp of the kept (j, p) = (dj(i), dp(i)), int32, exact\n"
     "#pragma unroll\n            for (int i = 0; i < NKEPT; i++)\n#pragma unroll\n"
     "                for (int v = 0; v < 4; v++) c[i][v] = dmagic(i) ? MAGIC : 0;\n",
     "            int c[3][4];  // measurement-only d2: D00; D10 + D01; D11 + D02 (equal weights chained)\n"
     "#pragma unroll\n            for (int i = 0; i < 3; i++)\n#pragma unroll\n"
     "                for (int v = 0; v < 4; v++) c[i][v] = MAGIC;\n"),
    ("                for (int j = 0; j < 3; j++) {\n                    uint32_t qa[4];  // the rows' digit j",
     "                for (int j = 0; j < 2; j++) {\n                    uint32_t qa[4];  // the rows' digit j"),
    ("                    for (int i = 0; i < NKEPT; i++)\n"
     "                        if (dj(i) == j) mma_s8(c[i], qa[0], qa[1], qa[2], qa[3], kb[dp(i)][0], kb[dp(i)][1]);",
     "                    for (int p = 0; p + j < 3; p++) mma_s8(c[p + j], qa[0], qa[1], qa[2], qa[3], kb[p][0], kb[p][1]);"),
    ("z[nt][v] = __fmul_rn(__fmul_rn(aligned_value(c, v), rowf[v >> 1]), (v & 1) ? u1 : u0);",
     "z[nt][v] = __fmul_rn(__fmul_rn(__fmaf_rn(__int_as_float(c[0][v]) - MAGICF, 65536.0f, __fmaf_rn("
     "__int_as_float(c[1][v]) - MAGICF, 256.0f, __int_as_float(c[2][v]) - MAGICF)), rowf[v >> 1]), (v & 1) ? u1 : u0);"),
]

EXTEND_EDITS = {
    "noqd": [(_QD_LOAD, _QD_NONE)],
    "d2": _D2,
    "tn16": [("#define WC_TN 32", "#define WC_TN 16")],
    "tn16r168": [("#define WC_TN 32", "#define WC_TN 16\n#define WC_MAXREG 168")],
    "f16qk": [("constexpr int KPL = 3; ", "constexpr int KPL = 4; "),
              ("pw[0][w] = pw[1][w] = pw[2][w] = 0u;", "pw[0][w] = pw[1][w] = pw[2][w] = pw[KPL - 1][w] = 0u;"),
              (None, _F16QK)],
    "noqk": [(None, _NOQK)],
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
    extend's q.k block)."""
    for old, new in edits:
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
