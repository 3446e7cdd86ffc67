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
- ``radiiearly``, ``radiifirst`` (extend.cu): the certificate's (row, token) radii (their tensor-core
  sums and ``tc_radius_m``) formed before the online softmax, or before the tile's q.k, instead of
  after the softmax (the same values, held in registers; the exp route's redo reuses them): does the
  certificate's cost shrink when its work leaves the softmax's chain? (BENCHMARKS.md 13ay; the
  first is ``reports/gpu-2026-12-07i/radiiearly/radiiearly.patch`` as a real change.) The
  per-tile certificate ``tiledcert`` was timed slower than the per-token form (13ay) and went.
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


_LAMBDA_FROM = "            float4 ax, ay, as2;  // the rows' entries"
_LAMBDA_TO = "            // p expm1(u) (p 0 past Np)"
_AHEAD = "<the radii ahead>"  # an edit's placeholder for _radii_ahead()


def _radii_ahead() -> str:
    """The tile loop's rows' entries and its ``radii`` lambda, moved out of the certificate block, then
    the radii of every n-tile into ``ue`` (the measurement-only radiiearly / radiifirst)."""
    text = (SRC / "extend.cu").read_text()
    return (text[text.index(_LAMBDA_FROM): text.index(_LAMBDA_TO)]
            + "        float ue[NT][4];  // measurement-only radiiearly / radiifirst: the (row, token) radii ahead\n"
            + "        if (a.cert) {\n#pragma unroll\n            for (int nt = 0; nt < NT; nt++) radii(nt, ue[nt]);\n        }\n")


_SOFTMAX = "        // ---- online softmax (rows rA: v 0, 1; rB: v 2, 3; the quad's lanes share a row) ----\n"
_LOGITS = "        // ---- logits of the warp's 16 rows x TN tokens (fp16 keys k^ / r_K)"
_USE_EARLY = [((_LAMBDA_FROM, _LAMBDA_TO), ""),
              ("                float u[4];\n                radii(nt, u);\n", "                const float (&u)[4] = ue[nt];\n"),
              ("                    float u[4];\n                    radii(nt, u);\n",
               "                    const float (&u)[4] = ue[nt];\n")]

EXTEND_EDITS = {
    "tn16": [("#define WC_TN 32", "#define WC_TN 16")],
    "tn16r168": [("#define WC_TN 32", "#define WC_TN 16\n#define WC_MAXREG 168")],
    "noqk": [(None, _NOQK)],
    "radiiearly": _USE_EARLY + [(_SOFTMAX, _AHEAD + _SOFTMAX)],
    "radiifirst": _USE_EARLY + [(_LOGITS, _AHEAD + _LOGITS)],
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
    extend's q.k block; a pair (start, end): from start up to end, end kept; ``_AHEAD`` in new: the
    source's radii block, ``_radii_ahead``)."""
    for old, new in edits:
        if isinstance(old, tuple):
            if not all(text.count(end) == 1 for end in old):
                raise SystemExit(f"floor_variants: {name}: {old!r} not found once in {file}")
            old = text[text.index(old[0]): text.index(old[1])]
        old = _qk_block() if old is None else old
        new = new.replace(_AHEAD, _radii_ahead()) if _AHEAD in new else new
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
