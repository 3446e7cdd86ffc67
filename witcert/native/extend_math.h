/* The arithmetic kernels of the native extend (extend.c), four doubles per vector
 * (common.h's wc_v4d: GCC vector extensions, lowered to AVX2 or SSE2 with the same
 * elementwise IEEE operations, so every clone gives the same bits). All always inlined.
 */
#ifndef WITCERT_NATIVE_EXTEND_MATH_H
#define WITCERT_NATIVE_EXTEND_MATH_H

#include "common.h"

/* no vector crosses a call boundary (everything here is inlined) */
#pragma GCC diagnostic ignored "-Wpsabi"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(WC_NO_CLONES)
/* The decode (decode.c) and the extend (extend.c) run an AVX2 clone where the CPU has AVX2
 * (picked at load time), the plain build elsewhere: the same IEEE operations in the same order
 * per element, so the same bits. The extend's phases are also instantiated for AVX-512 with
 * the 8-wide kernels below (the same operations per element again), chosen per call when the
 * CPU has it (wcx_wide). The portable build (WC_NO_CLONES) has only the plain instantiation;
 * -DWCX_NO_WIDE keeps the clones without it (tests and benchmarks compare the two). */
#define WCX_CLONES __attribute__((target_clones("avx2", "default")))
#ifndef WCX_NO_WIDE
#define WCX_WIDE 1
#define WCX_WIDE_TARGET __attribute__((target("avx512f,avx512dq,avx512vl")))
#else
#define WCX_WIDE 0
#endif
#else
#define WCX_CLONES
#define WCX_WIDE 0
#endif
/* The exact new tokens' dots in bf16 pairs (AVX512-BF16's vdpbf16ps) where every operand is
 * a bf16 number (docs/PROOFS.md 5.3): GCC 10 or later, with the AVX-512 instantiation. */
#if WCX_WIDE && __GNUC__ >= 10 && !defined(WCX_NO_BF16)
#define WCX_BF16 1
#define WCX_BF16_TARGET __attribute__((target("avx512f,avx512dq,avx512vl,avx512bf16")))
#else
#define WCX_BF16 0
#endif
/* A phase's body, instantiated per vector width (`wide` is a constant after inlining). */
#define WCX_BODY static inline __attribute__((always_inline))

#if WCX_WIDE
/* 1 when the CPU runs the AVX-512 instantiation (asked once per call of wc_extend). */
static inline int wcx_wide(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl");
}
#endif

#if WCX_BF16
/* 1 when the CPU has AVX512-BF16 (asked once per call of wc_extend, with wcx_wide). */
static inline int wcx_bf16(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16");
}
#endif

/* x is a bf16 number that vdpbf16ps reads as itself: its fp32 bits end in 16 zeros and it is
 * not a subnormal (which the instruction reads as 0); +-0 is fine. Non-finite values never
 * reach the dots (they are read as 0 and flagged). */
static inline int wcx_bf16_exact(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return (b & 0xffffu) == 0 && ((b & 0x7f800000u) != 0 || (b & 0x7fffffffu) == 0);
}

/* One bf16 pair: *p = bf16(x) | bf16(y) << 16, the bits of a bf16 number being the high half
 * of its fp32 bits. Returns whether both pass wcx_bf16_exact (else *p must not be used). */
static inline int wcx_bf16_pair(float x, float y, uint32_t *p) {
    uint32_t lo, hi;
    memcpy(&lo, &x, sizeof lo);
    memcpy(&hi, &y, sizeof hi);
    *p = (lo >> 16) | (hi & 0xffff0000u);
    return wcx_bf16_exact(x) & wcx_bf16_exact(y);
}

/* The bf16 pairs of n fp32 values (n even): p[c] = the pair of x[2c], x[2c + 1]. Returns
 * whether every value passes wcx_bf16_exact (else p must not be used). */
static inline int wcx_bf16_pairs(const float *x, int n, uint32_t *p) {
    int ok = 1;
    for (int c = 0; c < n / 2; c++) ok &= wcx_bf16_pair(x[2 * c], x[2 * c + 1], p + c);
    return ok;
}

/* The pair layout of a tile x [2 P][W] (fp32): p [P][W], rows 2j and 2j + 1 at column i paired
 * in p[j * W + i] (the operand of one vdpbf16ps per pair j and sixteen columns). A key tile
 * kT [D][WC_TILE] pairs its channels (P = D / 2, W = WC_TILE: the dots), a value tile
 * [WC_TILE][D] its tokens (P = WC_TILE / 2, W = D: the value pass). Returns whether every
 * value passes wcx_bf16_exact. */
static inline int wcx_bf16_rowpairs(const float *x, int P, int W, uint32_t *p) {
    int ok = 1;
    for (int j = 0; j < P; j++)
        for (int i = 0; i < W; i++)
            ok &= wcx_bf16_pair(x[(size_t)(2 * j) * W + i], x[(size_t)(2 * j + 1) * W + i],
                                p + (size_t)j * W + i);
    return ok;
}

/* z[r * zs + i] = scale * (q_r . k_i) for the rows r < nrows and tokens i < tn of a tile
 * kT [D][WC_TILE] (float64: the fp32 operands multiply exactly): one accumulator per (row,
 * token), summed over d in order; two rows at a time share the loads of the tile. */
static inline __attribute__((always_inline)) void dots_tile(
        int nrows, int D, const double *restrict q, const double *restrict kT, double scale,
        double *restrict z, int64_t zs, int tn) {
    double o[2 * WC_TILE];
    int r = 0;
    for (; r + 2 <= nrows; r += 2) {
        const double *q0 = q + (size_t)r * D, *q1 = q0 + D;
        wc_v4d a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, b0 = {0}, b1 = {0}, b2 = {0}, b3 = {0};
        for (int d = 0; d < D; d++) {
            const double *kd = kT + (size_t)d * WC_TILE;
            const wc_v4d k0 = WC_V4_LD(kd), k1 = WC_V4_LD(kd + 4);
            const wc_v4d k2 = WC_V4_LD(kd + 8), k3 = WC_V4_LD(kd + 12);
            const wc_v4d x = WC_V4_SPLAT(q0[d]), y = WC_V4_SPLAT(q1[d]);
            a0 += x * k0; a1 += x * k1; a2 += x * k2; a3 += x * k3;
            b0 += y * k0; b1 += y * k1; b2 += y * k2; b3 += y * k3;
        }
        WC_V4_ST(o, a0); WC_V4_ST(o + 4, a1); WC_V4_ST(o + 8, a2); WC_V4_ST(o + 12, a3);
        WC_V4_ST(o + 16, b0); WC_V4_ST(o + 20, b1); WC_V4_ST(o + 24, b2); WC_V4_ST(o + 28, b3);
        double *z0 = z + (size_t)r * zs, *z1 = z0 + zs;
        for (int i = 0; i < tn; i++) {
            z0[i] = scale * o[i];
            z1[i] = scale * o[WC_TILE + i];
        }
    }
    for (; r < nrows; r++) {
        const double *q0 = q + (size_t)r * D;
        wc_v4d a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int d = 0; d < D; d++) {
            const double *kd = kT + (size_t)d * WC_TILE;
            const wc_v4d x = WC_V4_SPLAT(q0[d]);
            a0 += x * WC_V4_LD(kd); a1 += x * WC_V4_LD(kd + 4);
            a2 += x * WC_V4_LD(kd + 8); a3 += x * WC_V4_LD(kd + 12);
        }
        WC_V4_ST(o, a0); WC_V4_ST(o + 4, a1); WC_V4_ST(o + 8, a2); WC_V4_ST(o + 12, a3);
        double *z0 = z + (size_t)r * zs;
        for (int i = 0; i < tn; i++) z0[i] = scale * o[i];
    }
}

/* acc[r] += sum_i p[r, i] vt_i for the rows r in [r0, nrows) and a tile of WC_TILE value
 * rows vt [WC_TILE][D] (zero rows for tokens that read 0 or are past the tile), the weights
 * p[r, i] = z[r * zs + i] for i < tn (0 beyond). Per element the terms are added in token
 * order, exactly as one token at a time would (adding an exact +0 leaves acc unchanged:
 * acc starts at +0 and round-to-nearest never makes -0 from a sum with a +0 operand). */
static inline __attribute__((always_inline)) void accumulate_tile(
        double *restrict acc, const double *restrict z, int64_t zs, int tn,
        const double *restrict vt, int r0, int nrows, int D) {
    for (int r = r0; r < nrows; r++) {
        double p[WC_TILE];
        const double *zr = z + (size_t)r * zs;
        for (int i = 0; i < WC_TILE; i++) p[i] = i < tn ? zr[i] : 0.0;
        double *ar = acc + (size_t)r * D;
        for (int d = 0; d < D; d += 8) {
            wc_v4d x0 = WC_V4_LD(ar + d), x1 = WC_V4_LD(ar + d + 4);
            for (int i = 0; i < WC_TILE; i++) {
                const wc_v4d w = WC_V4_SPLAT(p[i]);
                x0 += w * WC_V4_LD(vt + (size_t)i * D + d);
                x1 += w * WC_V4_LD(vt + (size_t)i * D + d + 4);
            }
            WC_V4_ST(ar + d, x0);
            WC_V4_ST(ar + d + 4, x1);
        }
    }
}

/* ---- The weights and the certificate terms, four tokens at a time -------------------
 *
 * wcx_exp4(x) = exp(x) for x in [-700, 0] within 2^-45 relative: x = k ln2 + r with k the
 * nearest integer to x / ln2 (the 1.5 2^52 shift; its low mantissa bits are k),
 * r = (x - k ln2_hi) - k ln2_lo (fdlibm's split: k ln2_hi is exact for |k| < 2^21 and the
 * subtraction is exact by Sterbenz, so |r - (x - k ln2)| < 2^-54), |r| < 0.3466; e^r by its
 * degree-11 Taylor polynomial in Horner form (truncation |r|^12/12! e^|r| / e^-|r| < 2^-46
 * relative; Horner with positive coefficients, (gamma_22 + u) e^0.35 / e^-0.35 < 2^-47.5);
 * times 2^k, exact (normal range). So |log w - x| < 2^-45, and with the rounding of
 * x = z - m (< 700 u < 2^-43.5) well inside the native model's softmax slack E = 2^-40
 * (docs/PROOFS.md 5.3). Weights with x < -700 are set to 0: the tail of Lemma 5.1
 * (tail_gap 700), covered by the tail term. wc_extend_probe (extend.c) exposes both
 * functions to the tests.
 *
 * wcx_expm1_up4(u) >= expm1(u) for 0 <= u < 1/16: expm1(u) = u + u^2/2 + u^3/6 +
 * sum_{k>=4} u^k/k! and that sum is <= (u^4/24) e^u < 1.0646 u^4/24; the polynomial
 * u(1 + u(1/2 + u(1/6 + u c4))), c4 > 1.0646/24, has positive terms, so its seven
 * rounded operations and the rounded 1/6 lower it by at most a factor (1 - u)^8
 * (u = 2^-53); the factor 1 + 2^-48 (itself rounded) keeps it an upper bound. It exceeds
 * expm1(u) by < 7e-7 relative. Other tokens (u >= 1/16, or a weight below 1e-290 where
 * p expm1(u) could be subnormal) take rare_excess, one at a time.
 *
 * wcx_expm1_mid4(u) >= expm1(u) for 1/16 <= u < 8: (E - 1) (1 + 2^-39) with E = wcx_exp4(u).
 * The proof of wcx_exp4 holds for these u too (k = nearest integer to u / ln2 lies in [0, 12],
 * k ln2_hi is exact and the subtraction exact by Sterbenz, |r| < 0.3466), so |E - e^u| <=
 * 2^-45 e^u; E - 1 is exact for E <= 2 (Sterbenz) and one rounding (2^-53 relative) above;
 * relative to expm1(u) that is at most 2^-45 e^u / (e^u - 1) + 2^-52 <= 16.52 2^-45 + 2^-52 <
 * 2^-40.9 (e^u / (e^u - 1) decreases in u and is 16.52 at u = 1/16); times 1 + 2^-39 (exact in
 * double) with its own rounding (2^-53) the result exceeds expm1(u), by < 2^-38 relative. */
/* The exp above of N independent vectors at once (VD / VI: the vector types, SPLAT: their
 * broadcast), each step applied to all of them before the next (the same operations per
 * element; the interleaving only lets the long dependency chains of the polynomial
 * overlap): the one body of wcx_exp4, wcx_exp8 (N = 1) and the kernels' batched calls. */
#define WCX_EXP_N(VD, VI, SPLAT, N, x, out)                                                     \
    do {                                                                                         \
        static const double c_[12] = {1.0, 1.0, 1.0 / 2, 1.0 / 6, 1.0 / 24, 1.0 / 120,          \
                                      1.0 / 720, 1.0 / 5040, 1.0 / 40320, 1.0 / 362880,         \
                                      1.0 / 3628800, 1.0 / 39916800};                          \
        const VD shift_ = SPLAT(0x1.8p52);                                                       \
        VD t_[N], r_[N], p_[N];                                                                  \
        for (int k_ = 0; k_ < N; k_++) {                                                         \
            t_[k_] = (x)[k_] * SPLAT(1.4426950408889634) + shift_;                               \
            const VD kd_ = t_[k_] - shift_;                                                      \
            r_[k_] = ((x)[k_] - kd_ * SPLAT(6.93147180369123816490e-01))                         \
                     - kd_ * SPLAT(1.90821492927058770002e-10);                                  \
            p_[k_] = SPLAT(c_[11]);                                                              \
        }                                                                                        \
        for (int i_ = 10; i_ >= 0; i_--)                                                         \
            for (int k_ = 0; k_ < N; k_++) p_[k_] = p_[k_] * r_[k_] + SPLAT(c_[i_]);             \
        for (int k_ = 0; k_ < N; k_++) {                                                         \
            const VI kk_ = (VI)t_[k_] - (VI)shift_;                                              \
            const VD scale_ = (VD)((kk_ + 1023) << 52);                                          \
            const VI keep_ = (x)[k_] >= SPLAT(-700.0);                                           \
            (out)[k_] = (VD)((VI)(p_[k_] * scale_) & keep_);                                     \
        }                                                                                        \
    } while (0)

/* wcx_expm1_up4 / wcx_expm1_up8 as one expression (u: the argument, SPLAT as above):
 * u (1 + u (1/2 + u (1/6 + u c4))) (1 + 2^-48), c4 = 1.0646 / 24 (1 + 2^-40). */
#define WCX_EXPM1_UP(SPLAT, u)                                                                  \
    (((u) * (SPLAT(1.0) + (u) * (SPLAT(0.5) + (u) * (SPLAT(1.0 / 6)                             \
                                                     + (u) * SPLAT(1.0646 / 24 * (1 + 0x1p-40)))))) \
     * SPLAT(1.0 + 0x1p-48))

static inline __attribute__((always_inline)) wc_v4d wcx_exp4(wc_v4d x) {
    wc_v4d out;
    WCX_EXP_N(wc_v4d, wc_v4i, WC_V4_SPLAT, 1, &x, &out);
    return out;
}

static inline __attribute__((always_inline)) wc_v4d wcx_expm1_up4(wc_v4d u) {
    return WCX_EXPM1_UP(WC_V4_SPLAT, u);
}

static inline __attribute__((always_inline)) wc_v4d wcx_expm1_mid4(wc_v4d u) {
    return (wcx_exp4(u) - WC_V4_SPLAT(1.0)) * WC_V4_SPLAT(1.0 + 0x1p-39);
}

/* ---- The 8-wide variants (the AVX-512 instantiation of extend.c) ---------------------
 *
 * Eight doubles per vector; only called from functions compiled for AVX-512
 * (extend.c: WCX_WIDE_TARGET). Every element goes through exactly the operations of the
 * 4-wide kernels above, in the same order (a wider vector only puts more independent
 * elements side by side), so the outputs are bitwise those of the 4-wide and portable code:
 * dots_tile8 keeps one accumulator per (row, token) summed over d in order, accumulate_tile8
 * adds per element in token order, wcx_exp8 / wcx_expm1_up8 are wcx_exp4 / wcx_expm1_up4
 * elementwise (their proofs above hold per element). */
typedef double wc_v8d __attribute__((vector_size(64), aligned(8), may_alias));
typedef long long wc_v8i __attribute__((vector_size(64), aligned(8), may_alias));
#define WC_V8_LD(p) (*(const wc_v8d *)(p))
#define WC_V8_ST(p, x) (*(wc_v8d *)(p) = (x))
#define WC_V8_SPLAT(x) ((wc_v8d){(x), (x), (x), (x), (x), (x), (x), (x)})
#define WC_V8_LO(x) __builtin_shufflevector((x), (x), 0, 1, 2, 3)
#define WC_V8_HI(x) __builtin_shufflevector((x), (x), 4, 5, 6, 7)

/* dots_tile, four rows at a time (two 8-token vectors per row: WC_TILE = 16). */
static inline __attribute__((always_inline)) void dots_tile8(
        int nrows, int D, const double *restrict q, const double *restrict kT, double scale,
        double *restrict z, int64_t zs, int tn) {
    double o[4 * WC_TILE];
    int r = 0;
    for (; r + 4 <= nrows; r += 4) {
        const double *q0 = q + (size_t)r * D, *q1 = q0 + D, *q2 = q1 + D, *q3 = q2 + D;
        wc_v8d a0 = {0}, a1 = {0}, b0 = {0}, b1 = {0}, c0 = {0}, c1 = {0}, e0 = {0}, e1 = {0};
        for (int d = 0; d < D; d++) {
            const double *kd = kT + (size_t)d * WC_TILE;
            const wc_v8d k0 = WC_V8_LD(kd), k1 = WC_V8_LD(kd + 8);
            const wc_v8d w = WC_V8_SPLAT(q0[d]), x = WC_V8_SPLAT(q1[d]);
            const wc_v8d y = WC_V8_SPLAT(q2[d]), v = WC_V8_SPLAT(q3[d]);
            a0 += w * k0; a1 += w * k1; b0 += x * k0; b1 += x * k1;
            c0 += y * k0; c1 += y * k1; e0 += v * k0; e1 += v * k1;
        }
        WC_V8_ST(o, a0); WC_V8_ST(o + 8, a1); WC_V8_ST(o + 16, b0); WC_V8_ST(o + 24, b1);
        WC_V8_ST(o + 32, c0); WC_V8_ST(o + 40, c1); WC_V8_ST(o + 48, e0); WC_V8_ST(o + 56, e1);
        for (int j = 0; j < 4; j++) {
            double *zj = z + (size_t)(r + j) * zs;
            for (int i = 0; i < tn; i++) zj[i] = scale * o[j * WC_TILE + i];
        }
    }
    for (; r < nrows; r++) {
        const double *q0 = q + (size_t)r * D;
        wc_v8d a0 = {0}, a1 = {0};
        for (int d = 0; d < D; d++) {
            const double *kd = kT + (size_t)d * WC_TILE;
            const wc_v8d x = WC_V8_SPLAT(q0[d]);
            a0 += x * WC_V8_LD(kd);
            a1 += x * WC_V8_LD(kd + 8);
        }
        WC_V8_ST(o, a0); WC_V8_ST(o + 8, a1);
        double *z0 = z + (size_t)r * zs;
        for (int i = 0; i < tn; i++) z0[i] = scale * o[i];
    }
}

/* accumulate_tile, two rows x 32 channels at a time (then 8-channel blocks: D is a
 * multiple of 8; an odd last row alone); per element the same adds in token order. */
static inline __attribute__((always_inline)) void accumulate_tile8(
        double *restrict acc, const double *restrict z, int64_t zs, int tn,
        const double *restrict vt, int r0, int nrows, int D) {
    int r = r0;
    for (; r + 2 <= nrows; r += 2) {
        double p0[WC_TILE], p1[WC_TILE];
        const double *z0 = z + (size_t)r * zs, *z1 = z0 + zs;
        for (int i = 0; i < WC_TILE; i++) {
            p0[i] = i < tn ? z0[i] : 0.0;
            p1[i] = i < tn ? z1[i] : 0.0;
        }
        double *a0 = acc + (size_t)r * D, *a1 = a0 + D;
        int d = 0;
        for (; d + 32 <= D; d += 32) {
            wc_v8d x0 = WC_V8_LD(a0 + d), x1 = WC_V8_LD(a0 + d + 8);
            wc_v8d x2 = WC_V8_LD(a0 + d + 16), x3 = WC_V8_LD(a0 + d + 24);
            wc_v8d y0 = WC_V8_LD(a1 + d), y1 = WC_V8_LD(a1 + d + 8);
            wc_v8d y2 = WC_V8_LD(a1 + d + 16), y3 = WC_V8_LD(a1 + d + 24);
            for (int i = 0; i < WC_TILE; i++) {
                const double *v = vt + (size_t)i * D + d;
                const wc_v8d v0 = WC_V8_LD(v), v1 = WC_V8_LD(v + 8);
                const wc_v8d v2 = WC_V8_LD(v + 16), v3 = WC_V8_LD(v + 24);
                const wc_v8d w = WC_V8_SPLAT(p0[i]), e = WC_V8_SPLAT(p1[i]);
                x0 += w * v0; x1 += w * v1; x2 += w * v2; x3 += w * v3;
                y0 += e * v0; y1 += e * v1; y2 += e * v2; y3 += e * v3;
            }
            WC_V8_ST(a0 + d, x0); WC_V8_ST(a0 + d + 8, x1);
            WC_V8_ST(a0 + d + 16, x2); WC_V8_ST(a0 + d + 24, x3);
            WC_V8_ST(a1 + d, y0); WC_V8_ST(a1 + d + 8, y1);
            WC_V8_ST(a1 + d + 16, y2); WC_V8_ST(a1 + d + 24, y3);
        }
        for (; d < D; d += 8) {
            wc_v8d x0 = WC_V8_LD(a0 + d), y0 = WC_V8_LD(a1 + d);
            for (int i = 0; i < WC_TILE; i++) {
                const wc_v8d v0 = WC_V8_LD(vt + (size_t)i * D + d);
                x0 += WC_V8_SPLAT(p0[i]) * v0;
                y0 += WC_V8_SPLAT(p1[i]) * v0;
            }
            WC_V8_ST(a0 + d, x0);
            WC_V8_ST(a1 + d, y0);
        }
    }
    for (; r < nrows; r++) {
        double p[WC_TILE];
        const double *zr = z + (size_t)r * zs;
        for (int i = 0; i < WC_TILE; i++) p[i] = i < tn ? zr[i] : 0.0;
        double *ar = acc + (size_t)r * D;
        for (int d = 0; d < D; d += 8) {
            wc_v8d x0 = WC_V8_LD(ar + d);
            for (int i = 0; i < WC_TILE; i++)
                x0 += WC_V8_SPLAT(p[i]) * WC_V8_LD(vt + (size_t)i * D + d);
            WC_V8_ST(ar + d, x0);
        }
    }
}

/* wcx_exp4 and wcx_expm1_up4, eight lanes: the same bodies. */
static inline __attribute__((always_inline)) wc_v8d wcx_exp8(wc_v8d x) {
    wc_v8d out;
    WCX_EXP_N(wc_v8d, wc_v8i, WC_V8_SPLAT, 1, &x, &out);
    return out;
}

static inline __attribute__((always_inline)) wc_v8d wcx_expm1_up8(wc_v8d u) {
    return WCX_EXPM1_UP(WC_V8_SPLAT, u);
}

/* common.h's wc_radius_rows at eight tokens per vector: the same body (WC_RADIUS_ROWS_BODY),
 * so the same radii bit for bit. */
static inline __attribute__((always_inline)) void wcx_radius_rows8(
        const wc_radius_consts *c, int nrows, int NG, int tn, const double *qn2,
        const double *qn1, const double *lf, const float *kwT, const float *ksT,
        const uint8_t *flag, double *u, int64_t ustride) {
    WC_RADIUS_ROWS_BODY(8, wc_v8d, wc_v8i, WC_V8_LD, WC_V8_ST, WC_V8_SPLAT);
}

/* ---- The fp32 arithmetic (wc_extend_args.arith32; docs/PROOFS.md 5.3, "The C extend's fp32
 * arithmetic") ---------------------------------------------------------------------------
 *
 * dots32_tile: z[r * zs + i] = scale * (double)dot32(q_r, k_i). dot32 sums the fp32 products
 * q_r[d] * k_i[d] (no FMA: -ffp-contract=off) in eight partial sums per (row, token) of D/8
 * terms each (D is a multiple of 8), each summed in order from +0, then combined as a
 * balanced tree (WCX_HALF4): a term goes through its product's rounding, at most D/8
 * additions of its partial and the three of the tree, D/8 + 4 roundings, so
 * |dot32 - q.k| <= gamma_{D/8+4}(2^-24) sum_d |q_d k_d| + D 2^-150 (underflow: each product
 * is off by at most half the smallest subnormal; sums of subnormals are exact) whenever
 * dot32 is finite (an overflow anywhere leaves it +-inf or NaN). A non-finite dot32 is
 * recomputed in float64 (exact products, the float64 path's dot: a smaller error than the
 * fp32 bound, so the same radius covers it). The fp32 operands are exact copies (q and the
 * keys are fp32 values).
 * Every width runs these operations per element in this order: the same bits.
 *
 * accumulate32_tile: acc[r] += (double)x_r with x_r = sum_i fl32(p[r, i]) vt_i over the tile's
 * 16 tokens in order in fp32 (per element; the weights rounded to fp32, zero past tn). The
 * output's float tier (outside the certificate, like the GPU kernels' fp16 p.v). */
typedef float wc_v8f __attribute__((vector_size(32), aligned(4), may_alias));
typedef int wc_v8si __attribute__((vector_size(32), aligned(4), may_alias));
#define WC_F8_LD(p) (*(const wc_v8f *)(p))
#define WC_F8_ST(p, x) (*(wc_v8f *)(p) = (x))
#define WC_F8_SPLAT(x) ((wc_v8f){(x), (x), (x), (x), (x), (x), (x), (x)})
typedef float wc_v16f __attribute__((vector_size(64), aligned(4), may_alias));
#define WC_F16_LD(p) (*(const wc_v16f *)(p))
#define WC_F16_ST(p, x) (*(wc_v16f *)(p) = (x))
#define WC_F16_SPLAT(x) ((wc_v16f){(x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), (x), \
                                   (x), (x), (x), (x)})

/* The float64 dot of row q [D] (float64 copy) and token i of an fp32 tile kT [D][WC_TILE]:
 * the float64 path's dot (exact products, summed over d in order). */
static inline double dot64_col(const double *q, const float *kT, int D, int i) {
    double acc = 0.0;
    for (int d = 0; d < D; d++) acc += q[d] * (double)kT[(size_t)d * WC_TILE + i];
    return acc;
}

/* Writes the logits of `nr` rows from their fp32 dots o [nr][WC_TILE] (tokens < tn): a row
 * whose dots are all finite converts them eight at a time (exact) and multiplies by scale (the
 * same IEEE operations per element as one at a time); a token whose dot is not finite takes
 * the float64 dot of q64 (row-major [nr][D]). */
static inline __attribute__((always_inline)) void dots32_store(
        int nr, int D, const float *restrict o, const double *restrict q64,
        const float *restrict kT, double scale, double *restrict z, int64_t zs, int tn) {
    const wc_v8d sc = WC_V8_SPLAT(scale);
    for (int j = 0; j < nr; j++) {
        double *zj = z + (size_t)j * zs;
        const float *oj = o + j * WC_TILE;
        const wc_v8si e0 = (wc_v8si)WC_F8_LD(oj) & 0x7f800000;
        const wc_v8si e1 = (wc_v8si)WC_F8_LD(oj + 8) & 0x7f800000;
        const wc_v8si inf = (e0 == 0x7f800000) | (e1 == 0x7f800000);
        int any = 0;
        for (int k = 0; k < 8; k++) any |= inf[k];
        if (tn == WC_TILE && !any) {
            WC_V8_ST(zj, sc * __builtin_convertvector(WC_F8_LD(oj), wc_v8d));
            WC_V8_ST(zj + 8, sc * __builtin_convertvector(WC_F8_LD(oj + 8), wc_v8d));
            continue;
        }
        for (int i = 0; i < tn; i++)
            zj[i] = scale * (isfinite(oj[i]) ? (double)oj[i]
                                             : dot64_col(q64 + (size_t)j * D, kT, D, i));
    }
}

/* The dots' eight partial sums, two halves of d (h = 0: d < D/2) times four residues mod 4:
 * s[h][j] over d = h D/2 + j, h D/2 + j + 4, ... (D/8 terms each, in order from +0), combined
 * as ((s00 + s01) + (s02 + s03)) + ((s10 + s11) + (s12 + s13)). */
#define WCX_HALF4(a) (((a)[0] + (a)[1]) + ((a)[2] + (a)[3]))

/* dots32_tile with 8-float vectors (portable / AVX2): two rows x two token vectors x two of
 * the four partial sums at a time (eight accumulators: with the two key vectors and the two
 * query splats, twelve of AVX2's sixteen registers, so nothing spills in the loop), one half
 * of d after the other. Each partial sum runs over its own d in order from +0 whichever pair
 * it is computed with: the same operations per element as dots32_tile16. */
static inline __attribute__((always_inline)) void dots32_tile(
        int nrows, int D, const float *restrict q, const double *restrict q64,
        const float *restrict kT, double scale, double *restrict z, int64_t zs, int tn) {
    float o[2 * WC_TILE];
    for (int r = 0; r < nrows; r += 2) {
        const int nr = nrows - r < 2 ? nrows - r : 2;
        const float *q0 = q + (size_t)r * D, *q1 = nr > 1 ? q0 + D : q0;
        wc_v8f lo[2][2]; /* the first half's combined sums: [row][token vector] */
        for (int h = 0; h < 2; h++) {
            wc_v8f s[2][2][4]; /* [row][token vector][partial] */
            for (int jp = 0; jp < 4; jp += 2) {
                wc_v8f a[2][2][2] = {{{{0}}}}; /* partials jp, jp + 1 */
                for (int d = h * (D / 2); d < (h + 1) * (D / 2); d += 4)
                    for (int j = 0; j < 2; j++) {
                        const float *kd = kT + (size_t)(d + jp + j) * WC_TILE;
                        const wc_v8f k0 = WC_F8_LD(kd), k1 = WC_F8_LD(kd + 8);
                        const wc_v8f x = WC_F8_SPLAT(q0[d + jp + j]), y = WC_F8_SPLAT(q1[d + jp + j]);
                        a[0][0][j] += x * k0; a[0][1][j] += x * k1;
                        a[1][0][j] += y * k0; a[1][1][j] += y * k1;
                    }
                for (int i = 0; i < 2; i++)
                    for (int v = 0; v < 2; v++)
                        for (int j = 0; j < 2; j++) s[i][v][jp + j] = a[i][v][j];
            }
            for (int i = 0; i < 2; i++)
                for (int v = 0; v < 2; v++) {
                    if (h == 0) lo[i][v] = WCX_HALF4(s[i][v]);
                    else WC_F8_ST(o + i * WC_TILE + 8 * v, lo[i][v] + WCX_HALF4(s[i][v]));
                }
        }
        dots32_store(nr, D, o, q64 + (size_t)r * D, kT, scale, z + (size_t)r * zs, zs, tn);
    }
}

/* dots32_tile with 16-float vectors (AVX-512): four rows x four partial sums, one half of d
 * after the other. */
static inline __attribute__((always_inline)) void dots32_tile16(
        int nrows, int D, const float *restrict q, const double *restrict q64,
        const float *restrict kT, double scale, double *restrict z, int64_t zs, int tn) {
    float o[4 * WC_TILE];
    for (int r = 0; r < nrows; r += 4) {
        const int nr = nrows - r < 4 ? nrows - r : 4;
        const float *qr[4];
        for (int i = 0; i < 4; i++) qr[i] = q + (size_t)(r + (i < nr ? i : 0)) * D;
        wc_v16f lo[4];
        for (int h = 0; h < 2; h++) {
            wc_v16f a[4][4] = {{{0}}}; /* [row][partial] */
            for (int d = h * (D / 2); d < (h + 1) * (D / 2); d += 4)
                for (int j = 0; j < 4; j++) {
                    const wc_v16f k = WC_F16_LD(kT + (size_t)(d + j) * WC_TILE);
                    for (int i = 0; i < 4; i++) a[i][j] += WC_F16_SPLAT(qr[i][d + j]) * k;
                }
            for (int i = 0; i < 4; i++) {
                if (h == 0) lo[i] = WCX_HALF4(a[i]);
                else WC_F16_ST(o + i * WC_TILE, lo[i] + WCX_HALF4(a[i]));
            }
        }
        dots32_store(nr, D, o, q64 + (size_t)r * D, kT, scale, z + (size_t)r * zs, zs, tn);
    }
}

#if WCX_BF16
/* The dots of rows [0, nrows) (qp: their bf16 pairs [nrows][D/2]; q64: the same queries in
 * float64, row-major) with a key tile in pairs kp [D/2][WC_TILE] (kT: the tile in fp32
 * [D][WC_TILE], for the float64 fallback): per (row, token) four fp32 partial sums, partial j
 * over the pairs c = j, j + 4, ... (D/8 vdpbf16ps steps from +0: each step adds the pair's
 * odd product, then its even one, rounding to nearest after each; the products of bf16
 * numbers are exact, results below 2^-126 flush to 0), combined as (s0 + s1) + (s2 + s3);
 * then dots32_store's logits (fl64(scale dot), a non-finite dot through the float64 dot).
 * Every product passes at most 2 D/8 + 2 roundings (docs/PROOFS.md 5.3). D a multiple of 8. */
WCX_BF16_TARGET static void dotsbf_tile16(int nrows, int D, const uint32_t *restrict qp,
                                         const double *restrict q64, const uint32_t *restrict kp,
                                         const float *restrict kT, double scale,
                                         double *restrict z, int64_t zs, int tn) {
    float o[4 * WC_TILE] __attribute__((aligned(64)));
    const int H = D / 2;
    for (int r = 0; r < nrows; r += 4) {
        const int nr = nrows - r < 4 ? nrows - r : 4;
        const uint32_t *qr[4];
        for (int i = 0; i < 4; i++) qr[i] = qp + (size_t)(r + (i < nr ? i : 0)) * H;
        __m512 acc[4][4];
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_ps();
        for (int c = 0; c < H; c += 4)
            for (int j = 0; j < 4; j++) {
                const __m512bh k = (__m512bh)_mm512_loadu_si512(kp + (size_t)(c + j) * WC_TILE);
                for (int i = 0; i < 4; i++)
                    acc[i][j] = _mm512_dpbf16_ps(
                            acc[i][j], (__m512bh)_mm512_set1_epi32((int)qr[i][c + j]), k);
            }
        for (int i = 0; i < 4; i++)
            _mm512_store_ps(o + i * WC_TILE, _mm512_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]),
                                                          _mm512_add_ps(acc[i][2], acc[i][3])));
        dots32_store(nr, D, o, q64 + (size_t)r * D, kT, scale, z + (size_t)r * zs, zs, tn);
    }
}
#endif

/* The fp32 weights of row r of a tile: fl32(z[r * zs + i]) for i < tn, 0 beyond. */
static inline __attribute__((always_inline)) void weights32(const double *zr, int tn, float *w) {
    if (tn == WC_TILE) { /* eight at a time: the same roundings */
        WC_F8_ST(w, __builtin_convertvector(WC_V8_LD(zr), wc_v8f));
        WC_F8_ST(w + 8, __builtin_convertvector(WC_V8_LD(zr + 8), wc_v8f));
        return;
    }
    for (int i = 0; i < WC_TILE; i++) w[i] = i < tn ? (float)zr[i] : 0.0f;
}

/* accumulate32_tile over 8 channels of two rows from channel d (both widths end with it). */
/* One block of W channels (VT: W-float vectors) of two rows: their tile sums in fp32 per
 * element, then added to the float64 accumulators. */
#define WCX_ACC32_1V(VT, W, LD, SPLAT, a0, a1, w0, w1, vt, D, d)                              \
    do {                                                                                      \
        VT x_ = {0}, y_ = {0};                                                                \
        for (int i_ = 0; i_ < WC_TILE; i_++) {                                                \
            const VT v_ = LD((vt) + (size_t)i_ * (D) + (d));                                  \
            x_ += SPLAT((w0)[i_]) * v_;                                                       \
            y_ += SPLAT((w1)[i_]) * v_;                                                       \
        }                                                                                     \
        for (int e_ = 0; e_ < (W); e_++) {                                                    \
            (a0)[(d) + e_] += (double)x_[e_];                                                 \
            (a1)[(d) + e_] += (double)y_[e_];                                                 \
        }                                                                                     \
    } while (0)
#define WCX_ACC32_8(a0, a1, w0, w1, vt, D, d) \
    WCX_ACC32_1V(wc_v8f, 8, WC_F8_LD, WC_F8_SPLAT, a0, a1, w0, w1, vt, D, d)

/* Four blocks of W channels at once (4 W channels of two rows; the same operations per
 * element as WCX_ACC32_1V). */
#define WCX_ACC32_4V(VT, W, LD, SPLAT, a0, a1, w0, w1, vt, D, d)                              \
    do {                                                                                      \
        VT x_[4] = {{0}}, y_[4] = {{0}};                                                      \
        for (int i_ = 0; i_ < WC_TILE; i_++) {                                                \
            const float *v_ = (vt) + (size_t)i_ * (D) + (d);                                  \
            const VT p_ = SPLAT((w0)[i_]), e_ = SPLAT((w1)[i_]);                              \
            for (int k_ = 0; k_ < 4; k_++) {                                                  \
                const VT vk_ = LD(v_ + (W) * k_);                                             \
                x_[k_] += p_ * vk_;                                                           \
                y_[k_] += e_ * vk_;                                                           \
            }                                                                                 \
        }                                                                                     \
        for (int k_ = 0; k_ < 4; k_++)                                                        \
            for (int e_ = 0; e_ < (W); e_++) {                                                \
                (a0)[(d) + (W) * k_ + e_] += (double)x_[k_][e_];                              \
                (a1)[(d) + (W) * k_ + e_] += (double)y_[k_][e_];                              \
            }                                                                                 \
    } while (0)

/* The fp32 weights of rows r and r + 1 of a tile and their accumulator rows; without a row r + 1
 * (r + 1 == nrows) the second pair member repeats row r into the zeroed scratch row `spare`
 * (discarded). */
static inline __attribute__((always_inline)) void acc32_pair(
        double *restrict acc, const double *restrict z, int64_t zs, int tn, int r, int nrows, int D,
        double *restrict spare, float *restrict w0, float *restrict w1, double **a0, double **a1) {
    const int two = r + 1 < nrows;
    weights32(z + (size_t)r * zs, tn, w0);
    if (two) {
        weights32(z + (size_t)(r + 1) * zs, tn, w1);
    } else {
        memcpy(w1, w0, sizeof(float) * WC_TILE);
        memset(spare, 0, sizeof(double) * (size_t)D);
    }
    *a0 = acc + (size_t)r * D;
    *a1 = two ? *a0 + D : spare;
}

/* accumulate32_tile / accumulate32_tile16: two rows at a time (an odd last row is paired with
 * itself into a scratch row), 8-float vectors (32 channels at a time, then 8-channel blocks;
 * D is a multiple of 8) or 16-float vectors (AVX-512: 64 channels, then 16, then 8); per
 * element the same operations either way. vt: fp32 [WC_TILE][D]. */
static inline __attribute__((always_inline)) void accumulate32_rows(
        double *restrict acc, const double *restrict z, int64_t zs, int tn,
        const float *restrict vt, int r0, int nrows, int D, const int wide) {
    double spare[WC_MAX_D];
    for (int r = r0; r < nrows; r += 2) {
        float w0[WC_TILE], w1[WC_TILE];
        double *a0, *a1;
        acc32_pair(acc, z, zs, tn, r, nrows, D, spare, w0, w1, &a0, &a1);
        int d = 0;
        if (wide) {
            for (; d + 64 <= D; d += 64)
                WCX_ACC32_4V(wc_v16f, 16, WC_F16_LD, WC_F16_SPLAT, a0, a1, w0, w1, vt, D, d);
            for (; d + 16 <= D; d += 16)
                WCX_ACC32_1V(wc_v16f, 16, WC_F16_LD, WC_F16_SPLAT, a0, a1, w0, w1, vt, D, d);
        } else {
            for (; d + 32 <= D; d += 32)
                WCX_ACC32_4V(wc_v8f, 8, WC_F8_LD, WC_F8_SPLAT, a0, a1, w0, w1, vt, D, d);
        }
        for (; d < D; d += 8) WCX_ACC32_8(a0, a1, w0, w1, vt, D, d);
    }
}

static inline __attribute__((always_inline)) void accumulate32_tile(
        double *restrict acc, const double *restrict z, int64_t zs, int tn,
        const float *restrict vt, int r0, int nrows, int D) {
    accumulate32_rows(acc, z, zs, tn, vt, r0, nrows, D, 0);
}

static inline __attribute__((always_inline)) void accumulate32_tile16(
        double *restrict acc, const double *restrict z, int64_t zs, int tn,
        const float *restrict vt, int r0, int nrows, int D) {
    accumulate32_rows(acc, z, zs, tn, vt, r0, nrows, D, 1);
}

#if WCX_BF16
/* The value pass of an item's exact new tokens [0, jn) whose values are bf16 numbers (vp:
 * their tiles in token pairs, wcx_bf16_rowpairs; D a multiple of 16), for rows [0, nrows) (z: their
 * weights from the first new token, row stride zs; row rho sees the new tokens up to
 * last[rho] exclusive, its weights beyond are 0). Per row: the weights fl32(p) rounded to
 * bf16 (round to nearest even; a weight below 2^-126 reads as 0); per channel, fp32 sums over
 * chunks of WCX_BFV_CHUNK tokens from +0, over the token pairs in order, each vdpbf16ps step
 * adding w_{2i+1} v_{2i+1}, then w_{2i} v_{2i} (exact products; round to nearest after each
 * addition, results below 2^-126 flushed to 0); each chunk's sum then added to acc[rho] in
 * float64, chunks in order. The output's float tier of this route: docs/PROOFS.md 5.3 (the
 * weights' bf16 rounding, relative 2^-9, as bf16 attention's). */
#define WCX_BFV_CHUNK 128

/* The bf16 weights of tile k of a row (16 tokens; those at or past n read as 0): 8 pairs. */
WCX_BF16_TARGET static inline __m256i wcx_bf16_weights(const double *z, int k, int n) {
    const int t0 = k * WC_TILE, left = n - t0;
    __m512d a, b;
    if (left >= WC_TILE) {
        a = _mm512_loadu_pd(z + t0);
        b = _mm512_loadu_pd(z + t0 + 8);
    } else if (left <= 0) {
        return _mm256_setzero_si256();
    } else {
        const __mmask8 ma = left >= 8 ? 0xff : (__mmask8)((1u << left) - 1u);
        const __mmask8 mb = left <= 8 ? 0 : (__mmask8)((1u << (left - 8)) - 1u);
        a = _mm512_maskz_loadu_pd(ma, z + t0);
        b = _mm512_maskz_loadu_pd(mb, z + t0 + 8);
    }
    const __m512 w = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(a)),
                                        _mm512_cvtpd_ps(b), 1);
    return (__m256i)_mm512_cvtneps_pbh(w);
}

/* acc[0..16 nv) += (double)x[0..nv) (fp32 sums of 16 channels each). */
WCX_BF16_TARGET static inline void wcx_bfv_flush(double *a, const __m512 *x, int nv) {
    for (int k = 0; k < nv; k++) {
        const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x[k]));
        const __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(x[k], 1));
        _mm512_storeu_pd(a + 16 * k, _mm512_add_pd(_mm512_loadu_pd(a + 16 * k), lo));
        _mm512_storeu_pd(a + 16 * k + 8, _mm512_add_pd(_mm512_loadu_pd(a + 16 * k + 8), hi));
    }
}

WCX_BF16_TARGET static void accumulatebf_rows(double *restrict acc, const double *restrict z,
                                             int64_t zs, const int *restrict last,
                                             const uint32_t *restrict vp, int nrows, int D) {
    enum { CT = WCX_BFV_CHUNK / WC_TILE }; /* tiles per chunk */
    uint32_t w[2][WCX_BFV_CHUNK / 2] __attribute__((aligned(64)));
    for (int r = 0; r < nrows; r += 2) {
        const int two = r + 1 < nrows;
        const int n0 = last[r], n1 = two ? last[r + 1] : 0, n = n0 > n1 ? n0 : n1;
        const int tiles = (n + WC_TILE - 1) / WC_TILE;
        double *a0 = acc + (size_t)r * D, *a1 = a0 + D;
        for (int k0 = 0; k0 < tiles; k0 += CT) {
            const int k1 = k0 + CT < tiles ? k0 + CT : tiles;
            for (int k = k0; k < k1; k++) {
                _mm256_store_si256((__m256i *)(w[0] + (k - k0) * (WC_TILE / 2)),
                                   wcx_bf16_weights(z + (size_t)r * zs, k, n0));
                _mm256_store_si256((__m256i *)(w[1] + (k - k0) * (WC_TILE / 2)),
                                   two ? wcx_bf16_weights(z + (size_t)(r + 1) * zs, k, n1)
                                       : _mm256_setzero_si256());
            }
            const int pairs = (k1 - k0) * (WC_TILE / 2);
            const uint32_t *vc = vp + (size_t)k0 * (WC_TILE / 2) * D;
            for (int d = 0; d < D; d += 64) {
                const int nv = D - d >= 64 ? 4 : (D - d) / 16;
                __m512 x[4], y[4];
                for (int k = 0; k < 4; k++) x[k] = y[k] = _mm512_setzero_ps();
                for (int i = 0; i < pairs; i++) {
                    const __m512bh e0 = (__m512bh)_mm512_set1_epi32((int)w[0][i]);
                    const __m512bh e1 = (__m512bh)_mm512_set1_epi32((int)w[1][i]);
                    const uint32_t *v = vc + (size_t)i * D + d;
                    for (int k = 0; k < nv; k++) {
                        const __m512bh vk = (__m512bh)_mm512_loadu_si512(v + 16 * k);
                        x[k] = _mm512_dpbf16_ps(x[k], e0, vk);
                        y[k] = _mm512_dpbf16_ps(y[k], e1, vk);
                    }
                }
                wcx_bfv_flush(a0 + d, x, nv);
                if (two) wcx_bfv_flush(a1 + d, y, nv);
            }
        }
    }
}
#endif

/* max(x[0..n)) (n >= 1; no NaN), sixteen tokens a step in four independent 4-lane maxima
 * (one dependency chain per vector, so the compares overlap), then four, then one at a
 * time. The maximum of a set is the same number in any order; only the sign of a zero
 * maximum could depend on it, and m enters the results only through z - m and m + log(l),
 * whose values (the weights, lse) are the same for m = +0 and m = -0 (exp(+-0) = 1,
 * +-0 + log(l) with l >= 1). */
#define WCX_MAX4(m, y)                                                                       \
    do {                                                                                     \
        const wc_v4d y_ = (y);                                                               \
        const wc_v4i gt_ = y_ > (m);                                                         \
        (m) = (wc_v4d)(((wc_v4i)y_ & gt_) | ((wc_v4i)(m) & ~gt_));                           \
    } while (0)

static inline __attribute__((always_inline)) double max_of(const double *x, int64_t n) {
    const int64_t n4 = n & ~(int64_t)3, n16 = n & ~(int64_t)15;
    double m = x[0];
    if (n4) {
        wc_v4d m0 = WC_V4_LD(x), m1 = m0, m2 = m0, m3 = m0;
        int64_t t = 0;
        for (; t < n16; t += 16) {
            WCX_MAX4(m0, WC_V4_LD(x + t));
            WCX_MAX4(m1, WC_V4_LD(x + t + 4));
            WCX_MAX4(m2, WC_V4_LD(x + t + 8));
            WCX_MAX4(m3, WC_V4_LD(x + t + 12));
        }
        for (; t < n4; t += 4) WCX_MAX4(m0, WC_V4_LD(x + t));
        WCX_MAX4(m0, m1);
        WCX_MAX4(m2, m3);
        WCX_MAX4(m0, m2);
        for (int j = 0; j < 4; j++) m = m0[j] > m ? m0[j] : m;
    }
    for (int64_t t = n4; t < n; t++) m = x[t] > m ? x[t] : m;
    return m;
}

/* The excess term of a token off the fast path: a tail token (weight set to 0) adds
 * nothing (Lemma 5.1 covers it with the tail term) unless its radius is +inf, which makes
 * the certificate +inf as the spec does; otherwise wc_excess. The callers take the radii in
 * [1/16, 8) on weights above 1e-290 (the common case of a stored token) through
 * wcx_rare_terms4 / softmax64 instead: four or eight at a time, no libm call. */
static inline double rare_excess(double p, double x, double u) {
    if (p == 0.0) return u == INFINITY ? INFINITY : 0.0;
    return wc_excess(p, x, u);
}

/* The rare terms of four tokens (weights p, shifted logits x, radii u; fast: the lanes the
 * fast path took), added to ex_rare one at a time in token order; returns the new sum. Lanes
 * whose radius lies in [1/16, 8) and whose weight exceeds 1e-290 take p expm1_mid(u), computed
 * for the four at once and only when there is one; every path calls it (softmax64 for lanes
 * 0-3, then 4-7), so every path gives the same bits. Four such lanes (a stored token's common
 * case) add their terms in a straight line: the same four adds in the same order. */
static inline __attribute__((always_inline)) double wcx_rare_terms4(wc_v4d p, wc_v4d x, wc_v4d u,
                                                                   wc_v4i fast, double ex_rare) {
    const wc_v4i mid = ~fast & (u >= WC_V4_SPLAT(0.0625)) & (u < WC_V4_SPLAT(8.0))
                       & (p > WC_V4_SPLAT(1e-290));
    if (!(mid[0] | mid[1] | mid[2] | mid[3])) {
        for (int j = 0; j < 4; j++)
            if (!fast[j]) ex_rare += rare_excess(p[j], x[j], u[j]);
        return ex_rare;
    }
    const wc_v4d mt = p * wcx_expm1_mid4(u);
    if (mid[0] & mid[1] & mid[2] & mid[3]) return (((ex_rare + mt[0]) + mt[1]) + mt[2]) + mt[3];
    for (int j = 0; j < 4; j++)
        if (!fast[j]) ex_rare += mid[j] ? mt[j] : rare_excess(p[j], x[j], u[j]);
    return ex_rare;
}

/* What one row's softmax leaves: l = sum_t w_t, ex = sum_t w_t expm1_up(u_t), umax = max_t u_t. */
typedef struct {
    double lsum, ex, umax;
} wcx_row_sums;

/* The softmax of one row, shared by the C decode and extend (docs/PROOFS.md 5.3): its nl
 * logits z (the maximum m = max_of(z, nl)) become the weights w_t = exp(z_t - m) (wcx_exp4:
 * within 2^-45 relative), and with cert the terms w_t expm1_up(u_t) (u < 1/16 and w > 1e-290,
 * else rare_excess) and the radii's maximum are summed. Tokens from t on (the AVX-512 softmax64
 * of extend.c may have taken the first ones into l4, e4, umax4, ex_rare): sixteen a step (the
 * exp chains interleaved; wide: eight-lane exps, the same operations per lane), then four,
 * then one; the sums take the tokens four by four in order (token t in lane t mod 4), the
 * last nl mod 4 one at a time, the rare terms one at a time in order: the same bits for any
 * thread count or clone. */
static inline __attribute__((always_inline)) wcx_row_sums wcx_softmax_row(
        double *z, const double *u, double m, int64_t nl, const int cert, const int wide,
        int64_t t, wc_v4d l4, wc_v4d e4, wc_v4d umax4, double ex_rare) {
    double umax = 0.0;
    const wc_v4d m4 = WC_V4_SPLAT(m), small = WC_V4_SPLAT(0.0625), tiny = WC_V4_SPLAT(1e-290);
    const int64_t n4 = nl & ~(int64_t)3;
    /* sixteen tokens a step, the exp chains of the step interleaved; the sums still take
     * the tokens four by four, in order (the same bits as four at a time) */
    const int64_t n16 = nl & ~(int64_t)15;
    for (; t < n16; t += 16) {
        wc_v4d x[4], p[4], ut[4];
        if (wide) {
            wc_v8d x8[2], p8[2];
            for (int k = 0; k < 2; k++) x8[k] = WC_V8_LD(z + t + 8 * k) - WC_V8_SPLAT(m);
            WCX_EXP_N(wc_v8d, wc_v8i, WC_V8_SPLAT, 2, x8, p8);
            for (int k = 0; k < 2; k++) {
                WC_V8_ST(z + t + 8 * k, p8[k]);
                x[2 * k] = WC_V8_LO(x8[k]);
                x[2 * k + 1] = WC_V8_HI(x8[k]);
                p[2 * k] = WC_V8_LO(p8[k]);
                p[2 * k + 1] = WC_V8_HI(p8[k]);
            }
        } else {
            for (int k = 0; k < 4; k++) x[k] = WC_V4_LD(z + t + 4 * k) - m4;
            WCX_EXP_N(wc_v4d, wc_v4i, WC_V4_SPLAT, 4, x, p);
            for (int k = 0; k < 4; k++) WC_V4_ST(z + t + 4 * k, p[k]);
        }
        for (int k = 0; k < 4; k++) l4 += p[k];
        if (!cert) continue;
        wc_v4i fast[4];
        for (int k = 0; k < 4; k++) {
            ut[k] = WC_V4_LD(u + t + 4 * k);
            const wc_v4i gt = ut[k] > umax4;
            umax4 = (wc_v4d)(((wc_v4i)ut[k] & gt) | ((wc_v4i)umax4 & ~gt));
            fast[k] = (ut[k] < small) & (p[k] > tiny);
            /* a masked-off term is +0, which leaves e4 (sums of terms >= +0) as it is: four
             * lanes off the fast path (a stored token's common case) skip the polynomial */
            if (fast[k][0] | fast[k][1] | fast[k][2] | fast[k][3])
                e4 += (wc_v4d)((wc_v4i)(p[k] * wcx_expm1_up4(ut[k])) & fast[k]);
        }
        const wc_v4i all = (fast[0] & fast[1]) & (fast[2] & fast[3]);
        if (!(all[0] & all[1] & all[2] & all[3]))
            for (int k = 0; k < 4; k++) ex_rare = wcx_rare_terms4(p[k], x[k], ut[k], fast[k], ex_rare);
    }
    for (; t < n4; t += 4) {
        const wc_v4d x = WC_V4_LD(z + t) - m4, p = wcx_exp4(x);
        WC_V4_ST(z + t, p);
        l4 += p;
        if (!cert) continue;
        const wc_v4d ut = WC_V4_LD(u + t);
        const wc_v4i fast = (ut < small) & (p > tiny);
        e4 += (wc_v4d)((wc_v4i)(p * wcx_expm1_up4(ut)) & fast);
        const wc_v4i gt = ut > umax4;
        umax4 = (wc_v4d)(((wc_v4i)ut & gt) | ((wc_v4i)umax4 & ~gt));
        if (!(fast[0] & fast[1] & fast[2] & fast[3])) ex_rare = wcx_rare_terms4(p, x, ut, fast, ex_rare);
    }
    double ltail = 0.0, etail = 0.0;
    for (int64_t t = n4; t < nl; t++) { /* the last nl mod 4 tokens, one lane each */
        const double x = z[t] - m, p = wcx_exp4(WC_V4_SPLAT(x))[0];
        z[t] = p;
        ltail += p;
        if (!cert) continue;
        if (u[t] < 0.0625 && p > 1e-290) etail += p * wcx_expm1_up4(WC_V4_SPLAT(u[t]))[0];
        else if (u[t] < 8.0 && p > 1e-290) ex_rare += p * wcx_expm1_mid4(WC_V4_SPLAT(u[t]))[0];
        else ex_rare += rare_excess(p, x, u[t]);
    }
    if (cert) { /* radii are >= 0 (no NaN): the max in any order is the same */
        for (int j = 0; j < 4; j++) umax = umax4[j] > umax ? umax4[j] : umax;
        for (int64_t t = n4; t < nl; t++) umax = u[t] > umax ? u[t] : umax;
    }
    wcx_row_sums rs;
    rs.lsum = ((l4[0] + l4[1]) + (l4[2] + l4[3])) + ltail;
    rs.ex = ((e4[0] + e4[1]) + (e4[2] + e4[3])) + etail + ex_rare;
    rs.umax = umax;
    return rs;
}

#if WCX_WIDE
/* The AVX-512 softmax's main loop: 64 tokens a step from *t while 64 remain, eight 8-wide
 * exp chains interleaved (a 16-token step leaves the polynomial's latency exposed); the
 * weights replace z. The sums take the weights and certificate terms four by four in token
 * order into the same four lanes (*l4, *e4: token t in lane t mod 4), the rare terms one at
 * a time in token order into *ex_rare, the radii's maximum into *umax4 (a maximum of numbers
 * >= 0: any order): the same bits as the 16-token step. The certificate's masks are AVX-512
 * mask registers (a masked-off term is +0, as the 16-token step's bitwise and gives). */
WCX_WIDE_TARGET static inline void softmax64(double *z, const double *u, double m, int64_t nl, int cert,
                                      int64_t *t, wc_v4d *l4, wc_v4d *e4, wc_v4d *umax4,
                                      double *ex_rare) {
    const __m512d small = _mm512_set1_pd(0.0625), tiny = _mm512_set1_pd(1e-290);
    __m512d umax8 = _mm512_setzero_pd();
    for (; *t + 64 <= nl; *t += 64) {
        double *zt = z + *t;
        wc_v8d x[8], p[8];
        for (int k = 0; k < 8; k++) x[k] = WC_V8_LD(zt + 8 * k) - WC_V8_SPLAT(m);
        WCX_EXP_N(wc_v8d, wc_v8i, WC_V8_SPLAT, 8, x, p);
        for (int k = 0; k < 8; k++) {
            WC_V8_ST(zt + 8 * k, p[k]);
            *l4 += WC_V8_LO(p[k]);
            *l4 += WC_V8_HI(p[k]);
        }
        if (!cert) continue;
        const double *ut = u + *t;
        for (int k = 0; k < 8; k++) {
            const wc_v8d uk = WC_V8_LD(ut + 8 * k);
            const __m512d um = (__m512d)uk, pm = (__m512d)p[k];
            umax8 = _mm512_mask_blend_pd(_mm512_cmp_pd_mask(um, umax8, _CMP_GT_OQ), umax8, um);
            const __mmask8 fast = _mm512_cmp_pd_mask(um, small, _CMP_LT_OQ)
                                  & _mm512_cmp_pd_mask(pm, tiny, _CMP_GT_OQ);
            const wc_v8d term = (wc_v8d)_mm512_maskz_mov_pd(
                    fast, (__m512d)(p[k] * wcx_expm1_up8(uk)));
            *e4 += WC_V8_LO(term);
            *e4 += WC_V8_HI(term);
            if (fast != 0xFF) { /* the rare terms, lanes 0-3 then 4-7: token order */
                wc_v4i flo, fhi;
                for (int j = 0; j < 4; j++) {
                    flo[j] = -(long long)((fast >> j) & 1);
                    fhi[j] = -(long long)((fast >> (j + 4)) & 1);
                }
                *ex_rare = wcx_rare_terms4(WC_V8_LO(p[k]), WC_V8_LO(x[k]), WC_V8_LO(uk), flo, *ex_rare);
                *ex_rare = wcx_rare_terms4(WC_V8_HI(p[k]), WC_V8_HI(x[k]), WC_V8_HI(uk), fhi, *ex_rare);
            }
        }
    }
    double um[8];
    _mm512_storeu_pd(um, umax8);
    for (int j = 0; j < 4; j++) {
        const double v = um[j] > um[j + 4] ? um[j] : um[j + 4];
        (*umax4)[j] = v > (*umax4)[j] ? v : (*umax4)[j];
    }
}
#endif

/* A row's logits that are not finite (finite inputs whose float64 product sm q.k overflows:
 * |sm q.k| > DBL_MAX needs sm far above any head's scale, but sm is the caller's) are replaced
 * by a finite value, +-DBL_MAX (0 for a NaN, which the dots cannot produce), and, with cert,
 * get the radius +inf: "no guarantee", as the reference does with the fp32 logits that
 * overflow (witcert.ref.arith.logits_f32). So the softmax never sees inf - inf, its weights
 * and the output stay finite, and the certificate is +inf, never NaN (docs/PROOFS.md 5.1).
 * The check is a vector pass over the exponent bits; the fix-up runs only for such a row.
 * Called before a row's logits and radii are read (the debug outputs show the values used).
 * Returns whether it replaced any logit. */
static inline int wcx_finite_row(double *z, double *u, int64_t nl, const int cert) {
    const int64_t n4 = nl & ~(int64_t)3;
    const wc_v4i ex = {0x7ff0000000000000LL, 0x7ff0000000000000LL, 0x7ff0000000000000LL, 0x7ff0000000000000LL};
    wc_v4i bad = {0, 0, 0, 0};
    for (int64_t t = 0; t < n4; t += 4) bad |= ((wc_v4i)WC_V4_LD(z + t) & ex) == ex;
    int any = (int)((bad[0] | bad[1]) | (bad[2] | bad[3]));
    for (int64_t t = n4; t < nl; t++) any |= !(fabs(z[t]) <= DBL_MAX);
    if (!any) return 0;
    for (int64_t t = 0; t < nl; t++) {
        if (fabs(z[t]) <= DBL_MAX) continue;
        z[t] = z[t] != z[t] ? 0.0 : copysign(DBL_MAX, z[t]);
        if (cert) u[t] = INFINITY;
    }
    return 1;
}

/* The weights and certificate sums of a row's n tokens z[0, n) for a given maximum m (every
 * token's z <= m): wcx_softmax_row from token 0, its first 64-token steps in softmax64 when
 * wide. */
static inline __attribute__((always_inline)) wcx_row_sums wcx_row_softmax_at(
        double *z, const double *u, double m, int64_t n, const int cert, const int wide) {
    wc_v4d l4 = {0}, e4 = {0}, umax4 = {0};
    int64_t t = 0;
    double ex_rare = 0.0;
#if WCX_WIDE
    if (wide) softmax64(z, u, m, n, cert, &t, &l4, &e4, &umax4, &ex_rare);
#endif
    return wcx_softmax_row(z, u, m, n, cert, wide, t, l4, e4, umax4, ex_rare);
}

/* One row's softmax and certificate sums (the decode's and the extend's): m = max_of(z, nl),
 * then wcx_row_softmax_at. */
static inline __attribute__((always_inline)) wcx_row_sums wcx_row_softmax(
        double *z, const double *u, int64_t nl, const int cert, const int wide, double *m) {
    *m = max_of(z, nl);
    return wcx_row_softmax_at(z, u, *m, nl, cert, wide);
}

/* The certificate of a row from its sums (nl tokens): (1 + sum_rel) ex / l, plus the tail
 * term: tokens whose float64 weight underflowed carry at most N exp(2U - gap). */
static inline double wcx_cert_of(wcx_row_sums rs, int64_t nl, double tail_gap, double sum_rel) {
    const double tail = rs.umax == INFINITY ? INFINITY
                        : (double)nl * exp(fmin(2.0 * rs.umax - tail_gap, 800.0));
    return rs.ex / rs.lsum * (1.0 + sum_rel) + tail;
}

#endif
