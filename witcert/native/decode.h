/* The arguments of wc_decode (decode.c) and the pieces the gate's row repair (repair.c)
   shares with it: the exact copy's rows and live flags, the fixed-order q.k dots. */
#ifndef WC_DECODE_H
#define WC_DECODE_H

#include "common.h"

enum { WC_X_F32 = 0, WC_X_F16 = 1, WC_X_BF16 = 2 };

typedef struct {
    const float *q;              /* f32 [B, Hq, D], contiguous */
    wc_side k, v;
    const int64_t *epochs;       /* int64 [num_slots] */
    const int64_t *positions;    /* int64 [num_slots] (position-keyed dither), or NULL */
    const int32_t *block_table;  /* int32 [B, pages], row stride bt_s0 */
    const int32_t *seq_lens;     /* int32 [B], each in [1, pages * P] */
    const double *delta_loc;     /* f64 [B], in (0, 1) (prob / min radius only) */
    float *out;                  /* f32 [B, Hq, D] */
    float *cert;                 /* f32 [B, Hq], or NULL (no certificate, no radii) */
    int64_t num_slots, bt_s0, pages;
    double sm_scale;
    uint32_t key0, key1;         /* Philox key: seed low 32 bits, high 32 bits */
    int32_t B, Hq, Hkv, D, G, page_size, layer, bits, radius, num_threads;
    float *lse;                  /* f32 [B, Hq], or NULL */
    float *vbound;               /* f32 [B, Hq], or NULL (needs cert) */
    const void *xk, *xv;         /* exact overlay [num_slots, Hkv, D], or NULL (no overlay) */
    const uint8_t *xflag;        /* [num_slots, Hkv] */
    const int64_t *xepoch;       /* [num_slots, Hkv] */
    const int64_t *xslot_epochs; /* [num_slots] */
    int32_t xdtype;              /* WC_X_F32 | WC_X_F16 | WC_X_BF16 */
    /* the arithmetic of this path (witcert.ref.arith.native_model, docs/PROOFS.md 5):
     * u_arith = arith_rel_s * sm * S_t + arith_abs + softmax_slack, with
     * S_t >= sum_i |q_i k^_i|; cert = (1 + sum_rel) a / l + N exp(2 U - tail_gap) */
    double arith_rel_s, arith_abs, softmax_slack, tail_gap, sum_rel;
    int32_t rounds;              /* Philox rounds: 10 or 7 */
    int64_t dbg_n;               /* row length of the two debug outputs below */
    float *dbg_radius;           /* f32 [B, Hq, dbg_n] whole radii (rounded up), or NULL */
    double *dbg_logits;          /* f64 [B, Hq, dbg_n] logits used, or NULL */
    double xw_rel, xw_abs;       /* exact overlay rounding witness constants (0, 0: exact) */
    const uint8_t *kv_sel;       /* [B, Hkv]: decode only the items (b, kvh) set; the outputs
                                  * of the others are left as they were. NULL: every item */
    int32_t dbg_fired;           /* 1 (needs cert): the debug outputs only of query heads whose
                                  * f32 certificate is >= dbg_tau (the gate's fired heads; the
                                  * others' entries are left unset); 0: every query head */
    double dbg_tau;
} wc_decode_args;

int wc_decode(const wc_decode_args *a);

/* Row [D] of an exact copy (xk or xv) at (slot, kvh), converted to f32 exactly (decode.c's
   overlay, repair.c's exact terms). */
static inline __attribute__((always_inline)) void exact_row(const wc_decode_args *a, const void *base, int64_t slot,
                                                            int kvh, float *dst) {
    const int64_t off = (slot * a->Hkv + kvh) * (int64_t)a->D;
    if (a->xdtype == WC_X_F32) {
        memcpy(dst, (const float *)base + off, sizeof(float) * a->D);
    } else {
        const uint16_t *src = (const uint16_t *)base + off;
        if (a->xdtype == WC_X_BF16)
            for (int d = 0; d < a->D; d++) dst[d] = wc_bf2f(src[d]);
        else
            for (int d = 0; d < a->D; d++) dst[d] = wc_h2f(src[d]);
    }
}

/* Whether (slot, kvh) is a live entry of the exact overlay. */
static inline int exact_live(const wc_decode_args *a, int64_t slot, int kvh) {
    if (!a->xk) return 0;
    const int64_t i = slot * a->Hkv + kvh;
    return a->xflag[i] && a->xepoch[i] == a->xslot_epochs[slot];
}

/* z[r * zstride] = sm (q_r . k) for the R query heads, in float64 (the fp32 operands
 * multiply exactly): four fixed partial sums per head (d mod 4), combined in a fixed
 * order, so the bits do not depend on the ISA. D % 4 == 0. */
static inline __attribute__((always_inline)) void dots_blk(
        const double *restrict q, const double *restrict kd, const int NR, int D, double sm,
        double *restrict z, size_t zstride) {
    wc_v4d acc[4] = {{0.0, 0.0, 0.0, 0.0}, {0.0, 0.0, 0.0, 0.0}, {0.0, 0.0, 0.0, 0.0},
                     {0.0, 0.0, 0.0, 0.0}};
    for (int d = 0; d < D; d += 4) {
        const wc_v4d kv = WC_V4_LD(kd + d);
        for (int h = 0; h < NR; h++) acc[h] += WC_V4_LD(q + (size_t)h * D + d) * kv;
    }
    for (int h = 0; h < NR; h++)
        z[(size_t)h * zstride] = sm * ((acc[h][0] + acc[h][1]) + (acc[h][2] + acc[h][3]));
}

static inline void dots_qk(const double *restrict q, const float *restrict k, int R, int D,
                           double sm, double *restrict z, size_t zstride) {
    double kd[WC_MAX_D];
    for (int d = 0; d < D; d++) kd[d] = (double)k[d];
    /* the heads' chains side by side, up to four at a time (each head's sums as above) */
    int r = 0;
    for (; r + 4 <= R; r += 4) dots_blk(q + (size_t)r * D, kd, 4, D, sm, z + (size_t)r * zstride, zstride);
    switch (R - r) {
    case 3: dots_blk(q + (size_t)r * D, kd, 3, D, sm, z + (size_t)r * zstride, zstride); break;
    case 2: dots_blk(q + (size_t)r * D, kd, 2, D, sm, z + (size_t)r * zstride, zstride); break;
    case 1: dots_blk(q + (size_t)r * D, kd, 1, D, sm, z + (size_t)r * zstride, zstride); break;
    default: break;
    }
}

#endif
