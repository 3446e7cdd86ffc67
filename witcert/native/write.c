/* Encode new K/V tokens into the paged pool: dithered INT8 codes, fp16 scales, witnesses.
 *
 * wc_encode is witcert.ref.pool.write_ with the dither8 compressor for one side, in one
 * pass per (token, KV head): scale s = max(fp16_round_up(amax / 126.5), 2^-14) per group,
 * y = fl(fl(x / s) + xi), n = round-half-even(y), x^ = (n - xi) s, witness
 * fp16_round_up(||x^ - x||_2 (1 + 2^-40)) per group in float64 (witcert.ref.quant,
 * witcert.ref.witness, DESIGN steps 1-7). A token-head with a non-finite input or a scale
 * that overflows fp16 is flagged: scales +inf, codes 0, witnesses +inf, outl 0.
 *
 * Outlier bypass (dst.m2 = 2m > 0): the channels of dst.oidx are left out of the group
 * amax, get code 0, contribute 0 to the witness, and are stored exactly in outl (fp16); a
 * bypassed value that fp16 cannot hold exactly (bf16 / fp32 input) flags the token-head,
 * since the radii treat those channels as exact.
 *
 * Counter word 0 is the slot, or positions[slot] with the position-keyed dither
 * (wc_counter_words, docs/MATH.md §6).
 *
 * Codes and scales are bitwise the reference by construction (the same IEEE fp32
 * operations in the same order). The witness's float64 sum of G squares is taken in
 * channel order; torch's vectorized sum may group it differently, which moves the double
 * by a few ulps and can change the fp16 round-up only when the norm lies within those
 * ulps of an fp16 value (~2^-40 per witness); either value bounds the error
 * (WC_WITNESS_SLACK covers the rounding of any order).
 */
#include <stdlib.h>

#include "common.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(WC_NO_CLONES)
#define WC_ENCODE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define WC_ENCODE_CLONES
#endif

#define WC_WITNESS_SLACK (1.0 + 0x1p-40) /* witcert.ref.witness.WITNESS_SLACK */
#define WC_AMAX_DIVISOR 126.5f            /* witcert.ref.quant.AMAX_DIVISOR */
#define WC_FP16_INF 0x7C00u
#define WC_FP16_MIN_NORMAL 0x0400u        /* 2^-14, the floor of every scale */

enum { WC_X_F32 = 0, WC_X_F16 = 1, WC_X_BF16 = 2 };

typedef struct {
    const void *x;          /* [T, Hkv, D] in dtype; element strides x_s0, x_s1; last dim contiguous */
    const int64_t *slots;   /* int64 [T], distinct, in [0, num_slots) */
    const int64_t *epochs;  /* int64 [num_slots], the epoch each slot is written at */
    const int64_t *positions; /* int64 [num_slots] (position-keyed dither), or NULL (slot key) */
    wc_side dst;            /* the side's storage (written at the slots) */
    int64_t x_s0, x_s1, T, num_slots;
    uint32_t key0, key1;
    int32_t Hkv, D, G, layer, side, bits, dtype;
    int32_t rounds;         /* Philox rounds: 10 or 7 (QuantConfig.philox_rounds) */
} wc_encode_args;

static inline float load_x(const wc_encode_args *a, int64_t t, int h, int d) {
    int64_t i = t * a->x_s0 + (int64_t)h * a->x_s1 + d;
    if (a->dtype == WC_X_F32) return ((const float *)a->x)[i];
    uint16_t b = ((const uint16_t *)a->x)[i];
    return a->dtype == WC_X_F16 ? wc_h2f(b) : wc_bf2f(b);
}

/* One token-head: x f32 [D], xi f32 [D], bypass mask byp [D] (NULL: none) with its m2
 * channels ix -> its record at dst (codes, scales, wit and, with bypass, outl). */
static inline __attribute__((always_inline)) void encode_row(const float *restrict x, const float *restrict xi, int D, int G,
                              const uint8_t *byp, const int32_t *ix, int m2,
                              int8_t *restrict codes, uint16_t *restrict scales,
                              uint16_t *restrict wit, uint16_t *restrict outl) {
    const int NG = D / G;
    int bad = 0;
    for (int d = 0; d < D; d++) bad |= !isfinite(x[d]);
    uint16_t ob[WC_MAX_D];
    for (int j = 0; j < m2 && !bad; j++) bad |= !wc_f2h_exact(x[ix[j]], &ob[j]);
    float sc[WC_MAX_NG];
    for (int g = 0; g < NG && !bad; g++) {
        float amax = 0.0f;
        for (int c = 0; c < G; c++) {
            if (byp && byp[g * G + c]) continue;
            float m = fabsf(x[g * G + c]);
            amax = m > amax ? m : amax;
        }
        uint16_t h = wc_fp16_round_up((double)(amax / WC_AMAX_DIVISOR)); /* fp32 division */
        if (h < WC_FP16_MIN_NORMAL) h = WC_FP16_MIN_NORMAL;             /* h >= +0 here */
        if (h == WC_FP16_INF) bad = 1;
        scales[g] = h;
        sc[g] = wc_h2f(h);
    }
    if (bad) {
        for (int d = 0; d < D; d++) codes[d] = 0;
        for (int g = 0; g < NG; g++) scales[g] = wit[g] = WC_FP16_INF;
        for (int j = 0; j < m2; j++) outl[j] = 0;
        return;
    }
    for (int g = 0; g < NG; g++) {
        const float s = sc[g];
        double ss = 0.0;
        for (int c = 0; c < G; c++) {
            int d = g * G + c;
            if (byp && byp[d]) { /* stored exactly: error 0 */
                codes[d] = 0;
                continue;
            }
            float y = x[d] / s + xi[d];
            float n = rintf(y); /* round half to even (default rounding mode); |y| < 127.5 */
            codes[d] = (int8_t)n;
            float xh = (n - xi[d]) * s;
            double e = (double)xh - (double)x[d];
            ss += e * e;
        }
        wit[g] = wc_fp16_round_up(sqrt(ss) * WC_WITNESS_SLACK);
    }
    for (int j = 0; j < m2; j++) outl[j] = ob[j];
}

static int cmp_i64(const void *p, const void *q) {
    int64_t a = *(const int64_t *)p, b = *(const int64_t *)q;
    return (a > b) - (a < b);
}

/* The encoding of every (token, KV head) of the call (wc_encode's arguments checked): an AVX2
 * clone where the CPU has AVX2 (rintf, ceil and floor become single instructions instead of
 * libm calls, the per-element fp32 operations vectorize), the plain build elsewhere: the same
 * IEEE operations per element in the same order, so the same bits. */
WC_ENCODE_CLONES static void encode_all(const wc_encode_args *a) {
    const int D = a->D, G = a->G;
    const int cpc = wc_cpc(a->bits), nch = (D + cpc - 1) / cpc;
    wc_words wb;
    float xi[WC_MAX_D], x[WC_MAX_D];
    uint32_t s32[WC_TILE], e32[WC_TILE];
    uint8_t byp[WC_MAX_D];
    const int m2 = a->dst.m2;
    for (int h = 0; h < a->Hkv; h++) {
        const uint32_t c1 = ((uint32_t)a->layer << 16) | (uint32_t)h;
        const int32_t *ix = m2 ? a->dst.oidx + (int64_t)h * m2 : NULL;
        if (m2) wc_bypass_mask(&a->dst, h, D, byp);
        for (int64_t t0 = 0; t0 < a->T; t0 += WC_TILE) {
            int tn = a->T - t0 < WC_TILE ? (int)(a->T - t0) : WC_TILE;
            for (int i = 0; i < tn; i++) /* checked by wc_encode */
                wc_counter_words(a->positions, a->epochs, a->slots[t0 + i], &s32[i], &e32[i]);
            wc_words_tile(tn, s32, e32, c1, (uint32_t)a->side, nch, a->key0, a->key1, a->rounds, &wb);
            for (int i = 0; i < tn; i++) {
                int64_t t = t0 + i, sl = a->slots[t];
                for (int d = 0; d < D; d++) x[d] = load_x(a, t, h, d);
                wc_xi(a->bits, &wb, (size_t)i * nch * cpc, D, xi);
                encode_row(x, xi, D, G, m2 ? byp : NULL, ix, m2,
                           a->dst.codes + sl * a->dst.codes_s0 + (int64_t)h * a->dst.codes_s1,
                           a->dst.scales + sl * a->dst.scales_s0 + (int64_t)h * a->dst.scales_s1,
                           a->dst.wit + sl * a->dst.wit_s0 + (int64_t)h * a->dst.wit_s1,
                           m2 ? a->dst.outl + sl * a->dst.outl_s0 + (int64_t)h * a->dst.outl_s1
                              : NULL);
            }
        }
    }
}

/* Returns WC_OK or a negative WC_ERR_* code (then nothing was written). */
int wc_encode(const wc_encode_args *a) {
    const int D = a->D, G = a->G;
    if (D < 1 || D > WC_MAX_D || G < 1 || D % G || D / G > WC_MAX_NG || a->Hkv < 1 ||
        a->Hkv > 0x10000 || a->layer < 0 || a->layer > 0xFFFF || (a->side != 0 && a->side != 1) ||
        (a->bits != 8 && a->bits != 16 && a->bits != 24) || a->dtype < 0 || a->dtype > 2 ||
        a->T < 0 || (a->rounds != 7 && a->rounds != 10) || !wc_side_ok(&a->dst, a->Hkv, D))
        return WC_ERR_ARGS;
    if (a->T == 0) return WC_OK;
    int64_t *sorted = malloc(sizeof(int64_t) * (size_t)a->T);
    if (!sorted) return WC_ERR_NOMEM;
    memcpy(sorted, a->slots, sizeof(int64_t) * (size_t)a->T);
    qsort(sorted, (size_t)a->T, sizeof(int64_t), cmp_i64);
    int err = WC_OK;
    for (int64_t i = 0; i < a->T && !err; i++) {
        int64_t sl = sorted[i];
        if (sl < 0 || sl >= a->num_slots) err = WC_ERR_SLOT;
        else if (i && sorted[i - 1] == sl) err = WC_ERR_ARGS; /* slots must be distinct */
        else {
            uint32_t w0, w3;
            err = wc_counter_words(a->positions, a->epochs, sl, &w0, &w3);
        }
    }
    free(sorted);
    if (err) return err;
    encode_all(a);
    return WC_OK;
}
