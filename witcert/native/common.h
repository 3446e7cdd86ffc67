/* Shared pieces of witcert's native CPU path: fp16 bits, Philox4x32-10, the dither.
 *
 * Bitwise contract: every value here equals the torch reference (witcert/ref/philox.py,
 * witcert/ref/quant.py, witcert/ref/fp.py) bit for bit. Built without -ffast-math and
 * with -ffp-contract=off, so every float operation is one IEEE round-to-nearest op in
 * the order written; the integer Philox is exact by construction.
 */
#ifndef WITCERT_NATIVE_COMMON_H
#define WITCERT_NATIVE_COMMON_H

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#define WC_PHILOX_M0 0xD2511F53u
#define WC_PHILOX_M1 0xCD9E8D57u
#define WC_PHILOX_W0 0x9E3779B9u
#define WC_PHILOX_W1 0xBB67AE85u
/* rounds: 10 (Random123 philox4x32_10, the default) or 7 (QuantConfig.philox_rounds) */

#define WC_MAX_D 256  /* head dims up to 256 (checked by the Python launchers) */
#define WC_MAX_NG 32  /* scale groups per head (G >= 8) */
#define WC_MAX_R 16   /* query heads per KV head (GQA ratio) */
#define WC_TILE 16    /* tokens per tile: the Philox lanes of a tile are TILE * D / cpc */
#define WC_MAX_LANES (WC_TILE * WC_MAX_D / 4)

/* Error codes shared with witcert/native/decode.py (ERRORS). */
#define WC_OK 0
#define WC_ERR_SLOT -1    /* a slot outside [0, num_slots) */
#define WC_ERR_EPOCH -2   /* an epoch outside [0, 2^32) */
#define WC_ERR_ARGS -3    /* a shape / mode argument out of range */
#define WC_ERR_NOMEM -4   /* scratch allocation failed */
#define WC_ERR_THREAD -5  /* pthread_create failed */
#define WC_ERR_POS -6     /* a position (position-keyed dither) outside [0, 2^32) */

/* Run worker(arg) on nt threads (at most 64), the calling thread one of them; the workers
   take items from a shared counter in arg. A thread that cannot be started stores
   WC_ERR_THREAD in *err; the started ones still finish every item. */
static inline void wc_run_workers(void *(*worker)(void *), void *arg, int nt, atomic_int *err) {
    pthread_t th[64];
    if (nt > 64) nt = 64;
    int started = 0;
    for (; started < nt - 1; started++)
        if (pthread_create(&th[started], NULL, worker, arg)) {
            atomic_store(err, WC_ERR_THREAD);
            break;
        }
    worker(arg);
    for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
}

/* One side (K or V) of a layer's storage: element (slot, head, i) of each field sits at
 * base + slot * s0 + head * s1 + i (strides in elements; the last dim is contiguous).
 * Outlier bypass (DESIGN steps 2-7): m2 = 2m channels per head are stored exactly in
 * outl (fp16) instead of the codes; oidx [Hkv, m2] lists them (distinct, in [0, D)).
 * m2 = 0 (outl and oidx NULL): no bypass. */
typedef struct {
    int8_t *codes;     /* int8 [num_slots, Hkv, D] */
    uint16_t *scales;  /* fp16 bits [num_slots, Hkv, NG] */
    uint16_t *wit;     /* fp16 bits [num_slots, Hkv, NG] */
    int64_t codes_s0, codes_s1, scales_s0, scales_s1, wit_s0, wit_s1;
    uint16_t *outl;      /* fp16 bits [num_slots, Hkv, m2], or NULL when m2 = 0 */
    int64_t outl_s0, outl_s1;
    const int32_t *oidx; /* int32 [Hkv, m2], contiguous, or NULL when m2 = 0 */
    int32_t m2;
} wc_side;

/* fp16 bit pattern -> float, exact (fp16 is a subset of fp32; a NaN stays a NaN with its
 * payload). Branch-free, so loops over it vectorize: a subnormal (or zero) m 2^-24 comes from
 * the exact integer conversion, a normal number from its rebiased exponent, inf / NaN from
 * exponent 255; the sign bit is copied. (Every input pattern is checked against torch's
 * conversion by tests/test_native_decode.py.) */
static inline float wc_h2f(uint16_t h) {
    const uint32_t x = h, e = (x >> 10) & 0x1Fu, m = x & 0x3FFu;
    const float sub = (float)(int32_t)m * 0x1p-24f;
    uint32_t sb;
    memcpy(&sb, &sub, sizeof sb);
    const uint32_t nrm = ((e == 31u ? 255u : e + 112u) << 23) | (m << 13);
    const uint32_t f = ((x & 0x8000u) << 16) | (e == 0u ? sb : nrm);
    float out;
    memcpy(&out, &f, sizeof out);
    return out;
}

/* bf16 bit pattern -> float, exact. */
static inline float wc_bf2f(uint16_t h) {
    uint32_t f = (uint32_t)h << 16;
    float out;
    memcpy(&out, &f, sizeof out);
    return out;
}

/* Smallest fp16 >= x as fp16 bits (witcert.ref.fp.fp16_round_up): NaN and x > 65504 give
 * +inf. Ceiling of x on the fp16 grid of its binade; every step is exact in double. */
static inline uint16_t wc_fp16_round_up(double x) {
    if (isnan(x) || x > 65504.0) return 0x7C00u;
    if (x < -65504.0) return isinf(x) ? 0xFC00u : 0xFBFFu;
    double a = fabs(x);
    int e = a < 0x1p-14 ? -14 : ilogb(a); /* fp16 binade (subnormals share 2^-14's ulp) */
    double k = ldexp(a, 10 - e);          /* a / ulp, exact */
    k = x > 0 ? ceil(k) : floor(k);       /* toward +inf; +-0 stay 0 */
    if (k >= 2048.0) { e += 1; k = 1024.0; }
    uint32_t mag = k < 1024.0 ? (uint32_t)k /* subnormal or zero: bits = k */
                              : ((uint32_t)(e + 15) << 10) | ((uint32_t)k - 1024u);
    return (uint16_t)(signbit(x) ? (0x8000u | mag) : mag);
}

/* fp16 bits of x when x is exactly an fp16 value (returns 1), else returns 0: the
 * reference's "bypassed value fp16 cannot hold" test (kept.to(fp16) != kept). The
 * round-up lands on x itself exactly when x is on the fp16 grid (signed zeros kept). */
static inline int wc_f2h_exact(float x, uint16_t *h) {
    if (!isfinite(x)) return 0;
    uint16_t b = wc_fp16_round_up((double)x);
    if (wc_h2f(b) != x) return 0;
    *h = b;
    return 1;
}

/* Whether the side's bypass description is memory safe: m2 in [0, D], and with m2 > 0
 * outl / oidx given and every index in [0, D). */
static inline int wc_side_ok(const wc_side *sd, int Hkv, int D) {
    if (sd->m2 < 0 || sd->m2 > D) return 0;
    if (sd->m2 == 0) return 1;
    if (!sd->outl || !sd->oidx) return 0;
    for (int64_t i = 0; i < (int64_t)Hkv * sd->m2; i++)
        if (sd->oidx[i] < 0 || sd->oidx[i] >= D) return 0;
    return 1;
}

/* Bypass mask of one head: byp[d] = 1 on its m2 exact channels, 0 elsewhere. */
static inline void wc_bypass_mask(const wc_side *sd, int head, int D, uint8_t *byp) {
    memset(byp, 0, (size_t)D);
    for (int j = 0; j < sd->m2; j++) byp[sd->oidx[(int64_t)head * sd->m2 + j]] = 1;
}

/* The stored exact values of the bypassed channels of (slot, head) over a dequantized
 * row (witcert.ref.quant.dequantize_dither8: bypassed channels take outl). */
static inline void wc_apply_outl(const wc_side *sd, int64_t slot, int head, float *row) {
    if (sd->m2 == 0) return;
    const uint16_t *o = sd->outl + slot * sd->outl_s0 + (int64_t)head * sd->outl_s1;
    const int32_t *ix = sd->oidx + (int64_t)head * sd->m2;
    for (int j = 0; j < sd->m2; j++) row[ix[j]] = wc_h2f(o[j]);
}

/* Reads NG fp16 values of (slot, head); returns 1 if any is non-finite. */
static inline int wc_load_groups(const uint16_t *base, int64_t s0, int64_t s1, int64_t slot,
                                 int head, int NG, float *dst) {
    const uint16_t *p = base + slot * s0 + (int64_t)head * s1;
    int bad = 0;
    for (int g = 0; g < NG; g++) {
        dst[g] = wc_h2f(p[g]);
        bad |= !isfinite(dst[g]);
    }
    return bad;
}

/* Random123 philox4x32 with `rounds` rounds on n lanes in place, portable C (structure of
 * arrays, so the compiler can vectorize the 32x32->64 multiplies across lanes). */
static inline void wc_philox_c(int n, uint32_t *restrict x0, uint32_t *restrict x1,
                               uint32_t *restrict x2, uint32_t *restrict x3, uint32_t k0,
                               uint32_t k1, int rounds) {
    for (int r = 0; r < rounds; r++) {
        for (int i = 0; i < n; i++) {
            uint64_t p0 = (uint64_t)WC_PHILOX_M0 * x0[i];
            uint64_t p1 = (uint64_t)WC_PHILOX_M1 * x2[i];
            uint32_t y0 = (uint32_t)(p1 >> 32) ^ x1[i] ^ k0;
            uint32_t y2 = (uint32_t)(p0 >> 32) ^ x3[i] ^ k1;
            x1[i] = (uint32_t)p1;
            x3[i] = (uint32_t)p0;
            x0[i] = y0;
            x2[i] = y2;
        }
        k0 += WC_PHILOX_W0;
        k1 += WC_PHILOX_W1;
    }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(WC_NO_CLONES)
#include <immintrin.h>
#define WC_PHILOX_AVX2 1

/* (hi, lo) 32-bit halves of x * m for 8 uint32 lanes: vpmuludq on the even lanes and on
 * the odd lanes shifted down, halves blended back into place. */
__attribute__((target("avx2"))) static inline void wc_mulhilo8(__m256i x, __m256i m,
                                                               __m256i *hi, __m256i *lo) {
    __m256i e = _mm256_mul_epu32(x, m);
    __m256i o = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), m);
    *lo = _mm256_blend_epi32(e, _mm256_slli_epi64(o, 32), 0xAA);
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(e, 32), o, 0xAA);
}

/* The vector Philox loop: while W * V lanes remain, V vectors of W lanes (VT), their rounds
 * interleaved (independent chains, so the multiplies' latencies overlap; BENCHMARKS.md 10k);
 * the same integers as wc_philox_c per lane. LD / ST / SET1 / XOR / MULHILO: the width's
 * load, store, broadcast, xor and wc_mulhilo8 / wc_mulhilo16. */
#define WC_PHILOX_VEC_LOOP(VT, W, V, LD, ST, SET1, XOR, MULHILO)                              \
    for (; i + (W) * (V) <= n; i += (W) * (V)) {                                              \
        VT a[V], b[V], c[V], d[V];                                                            \
        for (int v = 0; v < (V); v++) {                                                       \
            a[v] = LD(x0 + i + (W) * v);                                                      \
            b[v] = LD(x1 + i + (W) * v);                                                      \
            c[v] = LD(x2 + i + (W) * v);                                                      \
            d[v] = LD(x3 + i + (W) * v);                                                      \
        }                                                                                     \
        uint32_t ka = k0, kb = k1;                                                            \
        for (int r = 0; r < rounds; r++) {                                                    \
            const VT va = SET1((int)ka), vb = SET1((int)kb);                                  \
            for (int v = 0; v < (V); v++) {                                                   \
                VT h0, l0, h1, l1;                                                            \
                MULHILO(a[v], m0, &h0, &l0);                                                  \
                MULHILO(c[v], m1, &h1, &l1);                                                  \
                a[v] = XOR(XOR(h1, b[v]), va);                                                \
                c[v] = XOR(XOR(h0, d[v]), vb);                                                \
                b[v] = l1;                                                                    \
                d[v] = l0;                                                                    \
            }                                                                                 \
            ka += WC_PHILOX_W0;                                                               \
            kb += WC_PHILOX_W1;                                                               \
        }                                                                                     \
        for (int v = 0; v < (V); v++) {                                                       \
            ST(x0 + i + (W) * v, a[v]);                                                       \
            ST(x1 + i + (W) * v, b[v]);                                                       \
            ST(x2 + i + (W) * v, c[v]);                                                       \
            ST(x3 + i + (W) * v, d[v]);                                                       \
        }                                                                                     \
    }
#define WC_LD8(p) _mm256_loadu_si256((const __m256i *)(p))
#define WC_ST8(p, x) _mm256_storeu_si256((__m256i *)(p), (x))
#define WC_LD16(p) _mm512_loadu_si512((const void *)(p))
#define WC_ST16(p, x) _mm512_storeu_si512((void *)(p), (x))

/* wc_philox_c with AVX2 intrinsics: two 8-lane vectors at a time (16 registers hold no more),
 * then one, then the portable loop. */
__attribute__((target("avx2"))) static void wc_philox_avx2(int n, uint32_t *x0, uint32_t *x1,
                                                           uint32_t *x2, uint32_t *x3,
                                                           uint32_t k0, uint32_t k1, int rounds) {
    const __m256i m0 = _mm256_set1_epi32((int)WC_PHILOX_M0), m1 = _mm256_set1_epi32((int)WC_PHILOX_M1);
    int i = 0;
    WC_PHILOX_VEC_LOOP(__m256i, 8, 2, WC_LD8, WC_ST8, _mm256_set1_epi32, _mm256_xor_si256, wc_mulhilo8)
    WC_PHILOX_VEC_LOOP(__m256i, 8, 1, WC_LD8, WC_ST8, _mm256_set1_epi32, _mm256_xor_si256, wc_mulhilo8)
    if (i < n) wc_philox_c(n - i, x0 + i, x1 + i, x2 + i, x3 + i, k0, k1, rounds);
}

/* (hi, lo) 32-bit halves of x * m for 16 uint32 lanes (wc_mulhilo8 at 512 bits). */
__attribute__((target("avx512f"))) static inline void wc_mulhilo16(__m512i x, __m512i m,
                                                                  __m512i *hi, __m512i *lo) {
    __m512i e = _mm512_mul_epu32(x, m);
    __m512i o = _mm512_mul_epu32(_mm512_srli_epi64(x, 32), m);
    *lo = _mm512_mask_blend_epi32(0xAAAA, e, _mm512_slli_epi64(o, 32));
    *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(e, 32), o);
}

/* wc_philox_c with AVX-512F intrinsics: four 16-lane vectors at a time, then one; the rest of
 * the lanes through the AVX2 path. */
__attribute__((target("avx512f,avx2"))) static void wc_philox_avx512(
        int n, uint32_t *x0, uint32_t *x1, uint32_t *x2, uint32_t *x3, uint32_t k0, uint32_t k1,
        int rounds) {
    const __m512i m0 = _mm512_set1_epi32((int)WC_PHILOX_M0), m1 = _mm512_set1_epi32((int)WC_PHILOX_M1);
    int i = 0;
    WC_PHILOX_VEC_LOOP(__m512i, 16, 4, WC_LD16, WC_ST16, _mm512_set1_epi32, _mm512_xor_si512, wc_mulhilo16)
    WC_PHILOX_VEC_LOOP(__m512i, 16, 1, WC_LD16, WC_ST16, _mm512_set1_epi32, _mm512_xor_si512, wc_mulhilo16)
    if (i < n) wc_philox_avx2(n - i, x0 + i, x1 + i, x2 + i, x3 + i, k0, k1, rounds);
}
#endif

/* philox4x32 on n lanes: the AVX-512 or AVX2 path when the CPU has it, else portable C. */
static inline void wc_philox(int n, uint32_t *restrict x0, uint32_t *restrict x1,
                             uint32_t *restrict x2, uint32_t *restrict x3, uint32_t k0,
                             uint32_t k1, int rounds) {
#ifdef WC_PHILOX_AVX2
    if (n >= 16 && __builtin_cpu_supports("avx512f")) {
        wc_philox_avx512(n, x0, x1, x2, x3, k0, k1, rounds);
        return;
    }
    if (__builtin_cpu_supports("avx2")) {
        wc_philox_avx2(n, x0, x1, x2, x3, k0, k1, rounds);
        return;
    }
#endif
    wc_philox_c(n, x0, x1, x2, x3, k0, k1, rounds);
}

static inline int wc_cpc(int bits) { return bits == 8 ? 16 : bits == 16 ? 8 : 4; }

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "witcert native: the channel order of the Philox words assumes a little-endian CPU"
#endif

/* Philox words of a tile, call after call, words 0..3 of each call in order. On a
 * little-endian CPU that byte stream IS the channel order of the dither
 * (witcert.ref.philox.words_to_dither): b=8 channel j of a call is byte j, b=16 half j,
 * b=24 word j (its top 24 bits). So token t's r values start at element t * nch * cpc of
 * b / h / w, channel order, no shuffling. (Union punning is defined C.) */
typedef union {
    uint32_t w[WC_MAX_LANES * 4];
    uint16_t h[WC_MAX_LANES * 8];
    uint8_t b[WC_MAX_LANES * 16];
} wc_words;

/* Words of tn tokens of one (layer, KV head, side): counter (slot, layer << 16 | head,
 * side << 31 | chunk, epoch) (witcert.ref.philox.dither_counter), chunks 0..nch-1; `slot`
 * holds each token's word 0 (the slot or its position, wc_counter_words). */
static inline __attribute__((always_inline)) void wc_words_tile(
        int tn, const uint32_t *slot, const uint32_t *epoch, uint32_t c1, uint32_t side,
        int nch, uint32_t k0, uint32_t k1, int rounds, wc_words *restrict out) {
    uint32_t w0[WC_MAX_LANES], w1[WC_MAX_LANES], w2[WC_MAX_LANES], w3[WC_MAX_LANES];
    int n = tn * nch;
    for (int t = 0, i = 0; t < tn; t++)
        for (int c = 0; c < nch; c++, i++) {
            w0[i] = slot[t];
            w1[i] = c1;
            w2[i] = (side << 31) | (uint32_t)c;
            w3[i] = epoch[t];
        }
    wc_philox(n, w0, w1, w2, w3, k0, k1, rounds);
    for (int i = 0; i < n; i++) {
        out->w[4 * i] = w0[i];
        out->w[4 * i + 1] = w1[i];
        out->w[4 * i + 2] = w2[i];
        out->w[4 * i + 3] = w3[i];
    }
}

/* Counter words 0 and 3 of the token stored in `slot` (witcert.ref.pool.LayerKV.ctx):
 * word 0 is the token's position in its sequence, positions[slot], with the position-keyed
 * dither (positions non-NULL, int64 [num_slots]; docs/MATH.md §6), else the slot itself;
 * word 3 is epochs[slot] (the slot's epoch, or the sequence's nonce with positions).
 * Returns WC_OK, or WC_ERR_EPOCH (an epoch or slot) / WC_ERR_POS (a position) when a word
 * falls outside [0, 2^32); `slot` itself must lie in [0, num_slots). */
static inline int wc_counter_words(const int64_t *positions, const int64_t *epochs, int64_t slot,
                                   uint32_t *w0, uint32_t *w3) {
    const int64_t ep = epochs[slot], c0 = positions ? positions[slot] : slot;
    if (ep < 0 || ep > (int64_t)UINT32_MAX) return WC_ERR_EPOCH;
    if (c0 < 0 || c0 > (int64_t)UINT32_MAX) return positions ? WC_ERR_POS : WC_ERR_EPOCH;
    *w0 = (uint32_t)c0;
    *w3 = (uint32_t)ep;
    return WC_OK;
}

/* r of channel d (element e = token base + d of the stream); b is a literal per call site. */
static inline __attribute__((always_inline)) int32_t wc_r(const int bits, const wc_words *wb,
                                                          size_t e) {
    return bits == 8 ? (int32_t)wb->b[e] : bits == 16 ? (int32_t)wb->h[e]
                                                      : (int32_t)(wb->w[e] >> 8);
}

/* xi f32 [D] of one token: float(2r + 1 - 2^b) * 2^-(b+1) (an odd integer below 2^24 in
 * magnitude times a power of two: exact, witcert.ref.philox.words_to_dither). */
static inline __attribute__((always_inline)) void wc_xi_row(const int bits, const wc_words *wb,
                                                            size_t base, int D, float *restrict xi) {
    const float step = bits == 8 ? 0x1p-9f : bits == 16 ? 0x1p-17f : 0x1p-25f;
    const int32_t off = 1 - (1 << bits);
    for (int d = 0; d < D; d++) xi[d] = (float)(2 * wc_r(bits, wb, base + d) + off) * step;
}

/* Dequantized row f32 [D] of one token, bitwise the reference (float(n) - xi) * float(s)
 * (witcert.ref.quant.dequantize_dither8). b <= 16: n - xi = num / 2^(b+1) with
 * num = n 2^(b+1) - (2r + 1 - 2^b) an integer below 2^24 in magnitude, so fl(n - xi) is
 * exact and fl(fl(n - xi) s) = fl(num * (s 2^-(b+1))) (one rounding of the same real; the
 * power-of-two scaling of a finite fp16 scale is exact in fp32). b = 24: the two-step form. */
static inline __attribute__((always_inline)) void wc_dequant_row(
        const int bits, const int8_t *restrict codes, const wc_words *wb, size_t base,
        const float *restrict sc, int D, int G, float *restrict dst) {
    const int32_t off = 1 - (1 << bits);
    for (int g = 0, d = 0; d < D; g++) {
        if (bits <= 16) {
            const float sb = sc[g] * (bits == 8 ? 0x1p-9f : 0x1p-17f);
            for (int c = 0; c < G; c++, d++) {
                int32_t num = (int32_t)codes[d] * (1 << (bits + 1))
                              - (2 * wc_r(bits, wb, base + d) + off);
                dst[d] = (float)num * sb;
            }
        } else {
            const float s = sc[g];
            for (int c = 0; c < G; c++, d++) {
                float xi = (float)(2 * wc_r(bits, wb, base + d) + off) * 0x1p-25f;
                dst[d] = ((float)codes[d] - xi) * s;
            }
        }
    }
}

/* Runtime-b entry points: one branch per row, then a loop specialized for that b. */
static inline __attribute__((always_inline)) void wc_dequant(
        int bits, const int8_t *codes, const wc_words *wb, size_t base, const float *sc, int D,
        int G, float *dst) {
    if (bits == 8) wc_dequant_row(8, codes, wb, base, sc, D, G, dst);
    else if (bits == 16) wc_dequant_row(16, codes, wb, base, sc, D, G, dst);
    else wc_dequant_row(24, codes, wb, base, sc, D, G, dst);
}

static inline __attribute__((always_inline)) void wc_xi(int bits, const wc_words *wb, size_t base,
                                                        int D, float *xi) {
    if (bits == 8) wc_xi_row(8, wb, base, D, xi);
    else if (bits == 16) wc_xi_row(16, wb, base, D, xi);
    else wc_xi_row(24, wb, base, D, xi);
}

/* ---- Radii and certificate terms of the float64 paths (docs/PROOFS.md 5.3) ----------
 * Shared by the decode (decode.c) and the extend (extend.c). */

/* float64 sums of <= NG (<= 32) products, a sqrt and a few multiplies: relative error
 * < 2^-45; radii are inflated by this factor so rounding never shrinks them */
#define WC_RADIUS_INFLATE (1.0 + 0x1p-40)
/* |k^| <= 127.5 s on a stored channel (|n| <= 127, |xi| < 1/2): the dot bound S_t */
#define WC_STORED_CODE_BOUND 127.5
/* fp32 rounding of the quantizer adds <= 2^-15 to the dither bias coefficient
 * (witcert.ref.cert.FP_BIAS_SLACK) */
#define WC_DITHER_BIAS_SLACK 0x1p-15
#define WC_RMODE_DET 0
#define WC_RMODE_PROB 1
#define WC_RMODE_MIN 2

/* The arguments decode and extend share: batch, GQA, head and group geometry, page size,
 * dither bits, radius mode, layer id, scale, Philox rounds and the rounding-model constants.
 * 1 if they are valid (the callers' own checks come on top). */
static inline int wc_attn_args_ok(int B, int Hq, int Hkv, int D, int G, int page_size, int bits,
                                  int radius, int layer, double sm_scale, int rounds,
                                  double arith_rel_s, double arith_abs, double softmax_slack,
                                  double tail_gap, double sum_rel) {
    return B >= 0 && Hkv >= 1 && Hkv <= 0x10000 && Hq % Hkv == 0 && Hq / Hkv <= WC_MAX_R &&
           D >= 8 && D % 8 == 0 && D <= WC_MAX_D && G >= 1 && D % G == 0 && D / G <= WC_MAX_NG &&
           page_size >= 1 && (bits == 8 || bits == 16 || bits == 24) && radius >= 0 &&
           radius <= 2 && layer >= 0 && layer <= 0xFFFF && sm_scale > 0.0 &&
           sm_scale < INFINITY && (rounds == 7 || rounds == 10) && arith_rel_s >= 0.0 &&
           arith_abs >= 0.0 && softmax_slack >= 0.0 && tail_gap > 0.0 && sum_rel >= 0.0;
}

/* Smallest float >= x (x >= 0 or +inf). */
static inline float wc_f32_up(double x) {
    float f = (float)x;
    return (double)f < x ? nextafterf(f, INFINITY) : f;
}

/* exp(s) expm1(u) with s = z - m <= 0 and p = exp(s): p * expm1(u) when neither factor
 * under/overflows, else exp(s + u) (1 - exp(-u)) (witcert.ref.cert.excess_terms);
 * u = +inf gives +inf. */
static inline double wc_excess(double p, double s, double u) {
    if (u == INFINITY) return INFINITY;
    if (u < 700.0 && p > 1e-290) return p * expm1(u);
    return exp(s + u) * -expm1(-u);
}

/* The constants of a stored token's whole radius (docs/MATH.md §2a / §2b plus the slack
 * of docs/PROOFS.md 5.3): mode WC_RMODE_*; sm the softmax scale; bias = (2^-(b+1) +
 * 2^-15) sm; slack_s = rel_s sm 127.5 (times sum_g ||q_g||_1 s_g bounds rel_s sm S_t);
 * slack0 = abs + softmax (added to every radius). */
typedef struct {
    int mode;
    double sm, bias, slack_s, slack0;
} wc_radius_consts;

static inline wc_radius_consts wc_radius_setup(int mode, int bits, double sm, double rel_s,
                                               double abs_err, double softmax) {
    wc_radius_consts c = {mode, sm, (ldexp(1.0, -(bits + 1)) + WC_DITHER_BIAS_SLACK) * sm,
                          rel_s * sm * WC_STORED_CODE_BOUND, abs_err + softmax};
    return c;
}

/* Four doubles; GCC lowers the arithmetic to AVX2 or SSE2 (elementwise IEEE operations
 * either way, so every clone gives the same bits). Unaligned, may alias double arrays. */
typedef double wc_v4d __attribute__((vector_size(32), aligned(8), may_alias));
typedef long long wc_v4i __attribute__((vector_size(32), aligned(8), may_alias));
#define WC_V4_LD(p) (*(const wc_v4d *)(p))
#define WC_V4_ST(p, x) (*(wc_v4d *)(p) = (x))
#define WC_V4_SPLAT(x) ((wc_v4d){(x), (x), (x), (x)})

/* Whole radii u [nrows, tn] of one tile of stored tokens, written at u + r * ustride + i:
 * u_det = sm sum_g ||q_g||_2 w_g, u_prob = sm lf_r sqrt(sum_g ||q_g||_2^2 s_g^2 / 12)
 * + bias sum_g ||q_g||_1 s_g, the mode's choice inflated, plus slack_s sum_g ||q_g||_1 s_g
 * (inflated) plus slack0; flag[i] gives +inf. qn2, qn1: per-row group norms [nrows, NG];
 * lf: per-row sqrt(2 ln(2 N / delta_loc)) (unused for det); kwT, ksT: witnesses / scales
 * [NG][WC_TILE] (0 on flagged tokens). Each token's sums run over g in order. The 1/12 is
 * folded into the row's factor (sm lf_r / sqrt(12), a few roundings, far inside
 * WC_RADIUS_INFLATE), so a token costs one sqrt and no division.
 *
 * The one body of every width: W tokens per vector of type VD (VI: the integer vector of
 * the same width; LD / ST / SPLAT: its load, store and splat). Per token the operations and
 * their order do not depend on W, so every width gives the same radii bit for bit; expanded
 * in a function with wc_radius_rows's parameters (c, nrows, NG, tn, qn2, qn1, lf, kwT, ksT,
 * flag, u, ustride): wc_radius_rows below (4), extend_math.h's wcx_radius_rows8 (8). */
#define WC_RADIUS_ROWS_BODY(W, VD, VI, LD, ST, SPLAT)                                        \
    do {                                                                                     \
        double ks[WC_MAX_NG * WC_TILE], kw[WC_MAX_NG * WC_TILE], finf[WC_TILE];              \
        for (int i = 0; i < NG * WC_TILE; i++) {                                             \
            ks[i] = (double)ksT[i];                                                          \
            kw[i] = (double)kwT[i];                                                          \
        }                                                                                    \
        for (int i = 0; i < WC_TILE; i++) finf[i] = i < tn && flag[i] ? INFINITY : 0.0;     \
        const int det = c->mode != WC_RMODE_PROB, prob = c->mode != WC_RMODE_DET;            \
        const int whole = tn == WC_TILE;                                                     \
        const VD inflate = SPLAT(WC_RADIUS_INFLATE), inf = SPLAT(INFINITY);                  \
        for (int r = 0; r < nrows; r++) {                                                    \
            const double *n2 = qn2 + (size_t)r * NG, *n1 = qn1 + (size_t)r * NG;             \
            const VD c2 = SPLAT(c->sm * lf[r] * (1.0 / sqrt(12.0)));                         \
            double s2[WC_TILE], sq[WC_TILE], res[WC_TILE];                                   \
            /* a whole tile is stored in place (a short one through res: u's row may end) */ \
            double *dst = whole ? u + (size_t)r * ustride : res;                             \
            VD s1v[WC_TILE / (W)], sdv[WC_TILE / (W)];                                       \
            for (int k = 0; k < WC_TILE / (W); k++) {                                        \
                VD s1 = {0}, sd = {0}, q2 = {0};                                             \
                for (int g = 0; g < NG; g++) {                                               \
                    const VD a = SPLAT(n1[g]), b = SPLAT(n2[g]);                             \
                    const VD sg = LD(ks + g * WC_TILE + (W) * k), t2 = b * sg;               \
                    s1 += a * sg;                                                            \
                    sd += b * LD(kw + g * WC_TILE + (W) * k);                                \
                    q2 += t2 * t2;                                                           \
                }                                                                            \
                s1v[k] = s1;                                                                 \
                sdv[k] = sd;                                                                 \
                ST(s2 + (W) * k, q2);                                                        \
            }                                                                                \
            for (int i = 0; i < WC_TILE; i++) sq[i] = prob ? sqrt(s2[i]) : 0.0; /* vsqrtpd */ \
            for (int k = 0; k < WC_TILE / (W); k++) {                                        \
                VD ud = inf, up = inf;                                                       \
                if (det) ud = SPLAT(c->sm) * sdv[k];                                         \
                if (prob) up = c2 * LD(sq + (W) * k) + SPLAT(c->bias) * s1v[k];              \
                const VI lt = ud < up;                                                       \
                const VD uq = (VD)(((VI)ud & lt) | ((VI)up & ~lt)) * inflate;                \
                ST(dst + (W) * k, uq + SPLAT(c->slack_s) * s1v[k] * inflate                  \
                                  + SPLAT(c->slack0) + LD(finf + (W) * k));                  \
            }                                                                                \
            if (!whole) memcpy(u + (size_t)r * ustride, res, sizeof(double) * (size_t)tn);   \
        }                                                                                    \
    } while (0)

/* WC_RADIUS_ROWS_BODY at four tokens per vector (wc_v4d). */
static inline __attribute__((always_inline)) void wc_radius_rows(
        const wc_radius_consts *c, int nrows, int NG, int tn, const double *qn2,
        const double *qn1, const double *lf, const float *kwT, const float *ksT,
        const uint8_t *flag, double *u, int64_t ustride) {
    WC_RADIUS_ROWS_BODY(4, wc_v4d, wc_v4i, WC_V4_LD, WC_V4_ST, WC_V4_SPLAT);
}

/* Per-group norms of a query row q [D] (float64, non-finite entries already zeroed):
 * n2[g] = ||q_g||_2, n1[g] = ||q_g||_1. */
static inline void wc_group_norms(const double *q, int D, int G, double *n2, double *n1) {
    for (int g = 0; g < D / G; g++) {
        double s2 = 0.0, s1 = 0.0;
        for (int c = 0; c < G; c++) {
            double x = q[g * G + c];
            s2 += x * x;
            s1 += fabs(x);
        }
        n2[g] = sqrt(s2);
        n1[g] = s1;
    }
}

#endif
