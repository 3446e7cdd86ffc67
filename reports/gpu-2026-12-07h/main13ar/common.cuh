// Helpers shared by witcert's CUDA kernels (decode.cu, extend.cu): Philox, the tensor-core
// instructions, the exp / expm1 bounds, the query's int8 digits (docs/PROOFS.md 5.4) and the
// digit terms of the exact integer q.k. Configuration by the defines WC_G, WC_BITS, WC_ROUNDS,
// WC_QGP (see witcert/kernels/cuda/__init__.py).
#pragma once
#include <cstdint>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#ifndef WC_QGP
#error "WC_QGP (query heads per KV head, padded to a power of two <= 8) must be defined"
#endif
constexpr int HD = 128;                 // head dim
constexpr int G = WC_G;                 // channels per scale group: 32, 64, 128
constexpr int NG = HD / G;              // groups per head
constexpr int KPG = G / 32;             // int8 k-steps per group
constexpr int BITS = WC_BITS;           // 8 or 16
constexpr int ROUNDS = WC_ROUNDS;       // Philox rounds: 10 or 7
constexpr int QGP = WC_QGP;             // query heads of the group, padded
constexpr int CPC = BITS == 8 ? 16 : 8;  // channels per Philox call
constexpr float ROWF = (float)(1 << (BITS + 1));
constexpr float CB = BITS == 8 ? 1.0f : 257.0f;
static_assert(QGP <= 8 && (G == 32 || G == 64 || G == 128), "unsupported shape");
static_assert(BITS == 8 || BITS == 16, "dither bits");
#define INF __int_as_float(0x7f800000)
#define FMAX 3.4028234e38f
#define FULL 0xffffffffu

__device__ __forceinline__ uint4 philox(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                        uint32_t k0, uint32_t k1) {
#pragma unroll
    for (int r = 0; r < ROUNDS; r++) {
        const uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return make_uint4(c0, c1, c2, c3);
}

__device__ __forceinline__ uint32_t word(const uint4 &w, int i) {
    return i == 0 ? w.x : (i == 1 ? w.y : (i == 2 ? w.z : w.w));
}

// The dither integer r of channel j (0 .. CPC - 1) of one Philox call's words: b = 16 half j, b = 8
// byte j of the little-endian words (witcert.ref.philox.words_to_dither); the channel's dither is
// xi = (2 r + 1 - 2^b) 2^-(b+1). The extend's staging pass reads it here; the writer reads the same
// field as xi (dither_xi, below).
__device__ __forceinline__ int dither_field(const uint4 &w, int j) {
    return BITS == 16 ? (int)((word(w, j >> 1) >> (16 * (j & 1))) & 0xFFFFu)
                      : (int)((word(w, j >> 2) >> (8 * (j & 3))) & 0xFFu);
}

// The dither xi = (2 r + 1 - 2^b) 2^-(b+1) of channel j of one Philox call's words (r: dither_field's
// field, the same bytes), exactly, without an int -> float conversion: one byte permute writes r under the exponent of 2^15 (b 8:
// ulp 2^-8) or 2^7 (b 16: ulp 2^-16), i.e. the float 2^15 + r 2^-8 (2^7 + r 2^-16), then two exact
// subtractions (Sterbenz, then a sum with at most b + 1 significant bits): the value
// (float)(2 r + 1 - 2^b) * 2^-(b+1) (witcert.ref.philox.words_to_dither), the same bits.
__device__ __forceinline__ float dither_xi(const uint4 &w, int j) {
    if constexpr (BITS == 8) {
        const float f = __uint_as_float(__byte_perm(word(w, j >> 2), 0x47000000u, (uint32_t)(j & 3) | 0x7540u));
        return __fsub_rn(__fsub_rn(f, 32768.0f), 0.498046875f);  // r / 256 - 255 / 512
    } else {
        const uint32_t h = 2 * (uint32_t)(j & 1);  // the field's two bytes
        const float f = __uint_as_float(__byte_perm(word(w, j >> 1), 0x43000000u, h | ((h + 1) << 4) | 0x7500u));
        return __fsub_rn(__fsub_rn(f, 128.0f), 0.49999237060546875f);  // r / 65536 - 65535 / 131072
    }
}

__device__ __forceinline__ void mma_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                       uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_f16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ex2.approx.ftz (PTX: 2^-22 relative on the normal range), as the Triton kernel's exp2
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// rcp.approx.ftz (one MUFU op, within 1 ulp of 1 / x on the normal range; subnormals flush)
__device__ __forceinline__ float rcp_approx(float x) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ float exp_acc(float x) {
    return ex2(__fmaf_rn(x, 1.44269502162933349609375f, x * 1.92596298909109e-08f));
}

// >= expm1(u) for u >= 0 (+inf for +inf) by the exp route alone, one rounded fma after it:
// (exp_acc(u) - 1) (1 + 2^-12) + 2^-20 (PROOFS 5.5, "expm1_up_exp"), the certificate's term in both
// CUDA kernels. From 1/16 up the exp route is that of the Triton kernels' expm1_up
// (witcert.kernels.decode); below, exp_acc(u) - 1 is exact (Sterbenz) and within 1.07 (2^-21 +
// 2^-28) of expm1(u), which 2^-20 covers. Five instructions where expm1_up issues both its routes
// (about twelve, predicated); within 2^-11 relative plus 2^-19 absolute of expm1(u) (a
// certificate's terms are weights summing to 1: it rises by about 2^-19 at most).
__device__ __forceinline__ float expm1_up_exp(float u) {
    return __fmaf_rn(exp_acc(u) - 1.0f, 1.000244140625f, 9.5367431640625e-07f);
}

// >= expm1(u) for 0 <= u <= 1 with no MUFU op (PROOFS 5.5, "expm1_up_poly"): the degree-3 Taylor
// polynomial u (1 + u (1/2 + C3 u)) whose last coefficient C3 >= e - 5/2 covers the whole tail
// sum_{k >= 3} u^(k-3) / k! on [0, 1], C3 rounded up to fp32 and every operation rounded upward
// (all terms >= 0: each step is at least its exact value). Within 0.62% relative of expm1(u) on
// (0, 1] (0.05% at u = 0.1, 0.3% at 0.3), exact at 0; no bound above 1 (the caller picks
// expm1_up_exp there). Three operations a term (the degree-5 polynomial took five).
__device__ __forceinline__ float expm1_up_poly(float u) {
    const float h = __fmaf_ru(0.2182818353176116943359375f, u, 0.5f);
    return __fmul_ru(__fmaf_ru(h, u, 1.0f), u);
}

// sqrt.approx.ftz (one MUFU op, within 3 ulp on normal arguments, NVIDIA's bound): sqrt_up without
// its floor, for a caller that carries the floor elsewhere (tc_radius_m)
__device__ __forceinline__ float sqrt_approx(float x) {
    float y;
    asm("sqrt.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// 2^-61, sqrt_up's floor: more than the square root of anything a flush to zero could lose (below
// 2^-124). The extend's prefix kernel carries it in its rows' tail instead of adding it to every root.
constexpr float SQRT_FLOOR = 4.336808689942018e-19f;

// >= sqrt(x) for x >= 0 after the radius's 2^-16 inflation: sqrt_approx plus SQRT_FLOOR
// (witcert.kernels.dequant.sqrt_up, PROOFS 5.1)
__device__ __forceinline__ float sqrt_up(float x) { return sqrt_approx(x) + SQRT_FLOOR; }

// The constants of a (row, token) radius (PROOFS 5.4): the additive tail (the arithmetic floor
// plus the softmax allowance E), which radii apply.
struct RadiusC {
    float tail;
    bool det, prob;
};

// D += A B on tensor cores, tf32 inputs, fp32 accumulators (m16n8k8: A 16 x 8 row-major fragment
// a0 (row g, k t), a1 (g + 8, t), a2 (g, t + 4), a3 (g + 8, t + 4); B 8 x 8 b0 (k t, column g), b1
// (t + 4, g); D (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1); g = lane / 4, t = lane % 4)
__device__ __forceinline__ void mma_tf32(float (&c)[4], const float4 &a, float b0, float b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(__float_as_uint(a.x)), "r"(__float_as_uint(a.y)), "r"(__float_as_uint(a.z)), "r"(__float_as_uint(a.w)),
          "r"(__float_as_uint(b0)), "r"(__float_as_uint(b1)));
}

// The least tf32 value (fp32 with the low 13 significand bits 0) >= x, for x >= 0 (+inf past the
// largest; +inf and NaN unchanged)
__device__ __forceinline__ float tf32_up(float x) {
    const uint32_t b = __float_as_uint(x);
    return (b & 0x1FFFu) && b < 0x7F800000u ? __uint_as_float((b + 0x1FFFu) & ~0x1FFFu) : x;
}

// The tensor-core sums' inflation (PROOFS 5.4): covers the accumulation model's 2^-17 plus the
// fp32 operations after it
constexpr float TC_INFL = 1.00006103515625f;  // 1 + 2^-14

// One (row, token) radius from its three tensor-core sums (PROOFS 5.4, "the radius on tensor
// cores"): x = sum_g (sm ||q_g||_2 w_g + W_g s_g) (the deterministic radius plus the slack), y =
// sum_g (bias sm ||q_g||_1 + W_g) s_g and s2 = sum_g (lf sm ||q_g||_2)^2 s_g^2 / 12 (the
// probabilistic one: sqrt(s2) + y), every input rounded up; the minimum of those that apply,
// times 1 + 2^-14, plus the tail. No branches.
// In two steps where registers are short: tc_prob(s2, y) first, then tc_finish(x, prob).
__device__ __forceinline__ float tc_prob(float s2, float y, const RadiusC &c) {
    return c.prob ? sqrt_up(s2) + y : INF;
}
__device__ __forceinline__ float tc_finish(float x, float prob, const RadiusC &c) {
    return fminf(c.det ? x : INF, prob) * TC_INFL + c.tail;
}
__device__ __forceinline__ float tc_radius(float x, float y, float s2, const RadiusC &c) {
    return tc_finish(x, tc_prob(s2, y, c), c);
}

// tc_radius with the radius mode M known at compile time (0 det, 1 prob, 2 min) and sqrt_up's floor
// carried by the tail (the extend's prefix kernel: its rows' tail), so the root is sqrt.approx
// alone: the same bound with one operation fewer, the final product and sum one fma (one rounding
// where tc_finish may take two). A NaN sum (an inf * 0 product: a row entry beyond fp32 against a
// token's 0, or a flagged token's +inf against a row's 0, whose x is +inf) gives a NaN radius where it
// is all the mode takes (min: fminf keeps the other operand); the caller reads a NaN radius as +inf
// (the extend's tile loop: a NaN-keeping max and a vote, PROOFS 5.4), so no cap is spent per value.
template <int M>
__device__ __forceinline__ float tc_radius_m(float x, float y, float s2, float tail) {
    float r = x;
    if constexpr (M != 0) {
        const float sq = sqrt_approx(s2);
        r = M == 1 ? sq + y : fminf(x, sq + y);
    }
    return __fmaf_rn(r, TC_INFL, tail);
}

// max(a, b) that keeps a NaN (max.NaN.f32, sm_80+: NaN where either is; fmaxf returns the other)
__device__ __forceinline__ float fmax_nan(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

// Ask for the 128-byte line at p ahead of its load (prefetch.global.L1: into L1 and L2; a hint
// only, it changes no value). Measured like an L2 prefetch on the H200 (BENCHMARKS.md 4j)
__device__ __forceinline__ void prefetch_line(const void *p) {
    asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
}

// named barrier `id` (1-15; 0 is __syncthreads) of `n` threads (a multiple of 32): bar_sync waits
// for the barrier to complete, bar_arrive only counts this warp in (a producer's signal); both
// order this thread's earlier shared-memory accesses before the other participants' later ones
__device__ __forceinline__ void bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}

__device__ __forceinline__ float round_up_f32(double x) {  // witcert.kernels.dequant.round_up_f32
    return (float)x * 1.0000002384185791015625f + 5.6e-45f;
}

// A row's entry of the tensor-core sums from its value e >= 0 in float64, as two tf32 pieces
// whose sum is at least e (PROOFS 5.4, "the radius on tensor cores"): v = e rounded up to fp32;
// from 2^-26 up, hi = v with its low 13 significand bits cleared and lo = v - hi (exact in fp32)
// rounded up to tf32, so hi + lo exceeds v by at most 2^-20 v and lo is 0 or at least 2^-49;
// below 2^-26, hi = v rounded up to tf32 and at least 2^-50 when positive, lo = 0. So every
// product with a token's entry (0 or >= 2^-69) is 0 or a normal fp32 number.
__device__ __forceinline__ float tc_row_entry_up(double e);
__device__ __forceinline__ float2 tc_row_entry(double e) {
    const float v = round_up_f32(e);
    if (!(v >= 7.450580596923828e-09f)) return make_float2(tc_row_entry_up(e), 0.0f);  // below 2^-26 (or NaN)
    const float hi = __uint_as_float(__float_as_uint(v) & ~0x1FFFu);
    return make_float2(hi, v == INF ? 0.0f : tf32_up(v - hi));
}

// e rounded up to fp32, then to tf32, at least 2^-50 when positive: one piece (the extend's prefix
// kernel's row entries, tc_row_entries_up; tc_row_entry's below 2^-26)
__device__ __forceinline__ float tc_row_entry_up(double e) {
    const float y = tf32_up(round_up_f32(e));
    return y > 0.0f ? fmaxf(y, 8.8817841970012523e-16f) : y;  // 2^-50
}

// The radius's three tensor-core sums x, y, s2 (tc_radius), each over 8 entries k: entry k = grp and
// k = grp + 4 belong to scale group grp < NG (entries of groups past NG are 0), so the lane of
// a fragment with k = t, t + 4 (mma_tf32) needs group t only. e[q][h] is sum q's entry grp + 4h.
// A token's entries (w, s: its key witness and scale of the group, non-finite read as 0): exact
// tf32 values (fp16 values, and s^2 as its top 11 bits and the rest; an fp16 squared has at most
// 22 significant bits):  x: w, s;  y: s, 0;  s2: top(s^2), s^2 - top(s^2).
__device__ __forceinline__ void tc_token_entries(float w, float s, float (&e)[3][2]) {
    const float sq = s * s;
    const float hi = __uint_as_float(__float_as_uint(sq) & ~0x1FFFu);
    e[0][0] = w;  e[0][1] = s;
    e[1][0] = s;  e[1][1] = 0.0f;
    e[2][0] = hi; e[2][1] = sq - hi;
}
// A token's entries in the extend's prefix kernel (fp16 keys: docs/PROOFS.md 5.4, "the CUDA extend's
// fp16 keys"): tc_token_entries' with the key's rest sl >= s_g L_g (L_g = ||v_g - hi_g||_2, a tf32 value
// rounded up) against the row's sm ||q_g||_2 in both sums that bound a logit's error: x: w + sl
// (rounded up to tf32: w itself where sl is 0, w being an fp16 value), s;  y: s, sl;  s2: top(s^2),
// s^2 - top(s^2).
__device__ __forceinline__ void tc_token_entries_lo(float w, float s, float sl, float (&e)[3][2]) {
    tc_token_entries(w, s, e);
    e[0][0] = tf32_up(__fadd_ru(w, sl));
    e[1][1] = sl;
}
// A flagged token's entries in the extend's prefix kernel (its radius +inf whatever the row): x: 0,
// +inf (against W_g, positive: tc_row_entries_up), so x = +inf; y: 0, +inf (against sm ||q_g||_2: y is
// +inf, or NaN where that is 0, and tc_radius_m reads NaN as +inf); s2: 0.
__device__ __forceinline__ void tc_flag_entries(float (&e)[3][2]) {
    e[0][0] = 0.0f; e[0][1] = INF;
    e[1][0] = 0.0f; e[1][1] = INF;
    e[2][0] = e[2][1] = 0.0f;
}

// A row's (query head's) entry values from q_row's crt of the group (||q_g||_2, ||q_g||_1, both
// rounded up, W_g the slack weight) and the row's lf, in float64: sm ||q_g||_2, W_g (x's), bias sm
// ||q_g||_1 + W_g (y's), (lf sm ||q_g||_2)^2 / 12 (s2's, twice).
__device__ __forceinline__ void tc_row_values(float4 crt, float sm, float bias, float lf, double (&v)[4]) {
    const double sd = (double)sm;
    v[0] = sd * (double)crt.x;
    v[1] = (double)crt.z;
    v[2] = (double)bias * sd * (double)crt.y + (double)crt.z;
    v[3] = (double)lf * (double)lf * sd * sd * (double)crt.x * (double)crt.x / 12.0;
}

// A row's entries (tc_row_values), each split into two tf32 pieces (tc_row_entry: hi[q][h] +
// lo[q][h] at least the value), the sums taken as hi . B + lo . B (the decode):
// x: sm ||q_g||_2, W_g;  y: bias sm ||q_g||_1 + W_g, 0;  s2: (lf sm ||q_g||_2)^2 / 12 twice.
__device__ __forceinline__ void tc_row_entries(float4 crt, float sm, float bias, float lf, float (&hi)[3][2],
                                               float (&lo)[3][2]) {
    double v[4];
    tc_row_values(crt, sm, bias, lf, v);
    const float2 x0 = tc_row_entry(v[0]), x1 = tc_row_entry(v[1]), y0 = tc_row_entry(v[2]), z0 = tc_row_entry(v[3]);
    hi[0][0] = x0.x; lo[0][0] = x0.y;
    hi[0][1] = x1.x; lo[0][1] = x1.y;
    hi[1][0] = y0.x; lo[1][0] = y0.y;
    hi[1][1] = 0.0f; lo[1][1] = 0.0f;
    hi[2][0] = hi[2][1] = z0.x;
    lo[2][0] = lo[2][1] = z0.y;
}

// A row's entries for the extend's prefix kernel, one tf32 value each (one mma per sum): the values
// of tc_row_values rounded up to fp32, then to tf32 (tc_row_entry_up, above: at most 2^-10 above), the
// positive ones at least 2^-50 (so every product with a token's entry, 0 or >= 2^-69, is 0 or
// normal, and a flagged token's +inf against W_g gives +inf: tc_flag_entries); y's second entry is
// x's first, sm ||q_g||_2, against the token's rest (tc_token_entries_lo).
// e[q][h]: sum q's entry k = t + 4 h of the lane's group t (all 0 past NG).
__device__ __forceinline__ void tc_row_entries_up(int t, float4 crt, float sm, float bias, float lf, float (&e)[3][2]) {
    e[0][0] = e[0][1] = e[1][0] = e[1][1] = e[2][0] = e[2][1] = 0.0f;
    if (t < NG) {
        double v[4];
        tc_row_values(crt, sm, bias, lf, v);
        e[0][0] = e[1][1] = tc_row_entry_up(v[0]);
        e[0][1] = tc_row_entry_up(v[1]);
        e[1][0] = tc_row_entry_up(v[2]);
        e[2][0] = e[2][1] = tc_row_entry_up(v[3]);
    }
}

__device__ __forceinline__ float pow2f(int e) { return __int_as_float((e + 127) << 23); }
__device__ __forceinline__ double pow2d(int e) { return __longlong_as_double((long long)(e + 1023) << 52); }

// a 16-bit q element's value: fp16 (dtype 1) or bf16 (dtype 2)
__device__ __forceinline__ float q16_value(int dtype, unsigned short bits) {
    return dtype == 1 ? __half2float(__ushort_as_half(bits)) : __uint_as_float((uint32_t)bits << 16);
}

// one q element of row offset o: fp32 / fp16 / bf16 (dtype 0 / 1 / 2)
__device__ __forceinline__ float load_q_elem(const void *q, int dtype, int64_t o) {
    if (dtype == 0) return reinterpret_cast<const float *>(q)[o];
    return q16_value(dtype, reinterpret_cast<const unsigned short *>(q)[o]);
}

// N elements of q at offsets o, o + step, ... (load_q_elem's values; all 0 where !ok): the dtype's
// branch taken once, so that every load is in flight before the first value is used
template <int N>
__device__ __forceinline__ void load_q_elems(const void *q, int dtype, int64_t o, int step, bool ok, float (&x)[N]) {
    if (!ok) {
#pragma unroll
        for (int i = 0; i < N; i++) x[i] = 0.0f;
    } else if (dtype == 0) {
#pragma unroll
        for (int i = 0; i < N; i++) x[i] = reinterpret_cast<const float *>(q)[o + (int64_t)step * i];
    } else {
        unsigned short bits[N];
#pragma unroll
        for (int i = 0; i < N; i++) bits[i] = reinterpret_cast<const unsigned short *>(q)[o + (int64_t)step * i];
#pragma unroll
        for (int i = 0; i < N; i++) x[i] = q16_value(dtype, bits[i]);
    }
}

// the NG fp16 fields of one (slot, KV head) row as floats
__device__ __forceinline__ void load_groups(const __half *p, uint32_t row, float (&x)[NG]) {
    const unsigned short *s = reinterpret_cast<const unsigned short *>(p) + (int64_t)row * NG;
    if constexpr (NG == 4) {
        const uint2 u = __ldg(reinterpret_cast<const uint2 *>(s));
        x[0] = __half2float(__ushort_as_half((unsigned short)(u.x & 0xFFFF)));
        x[1] = __half2float(__ushort_as_half((unsigned short)(u.x >> 16)));
        x[2] = __half2float(__ushort_as_half((unsigned short)(u.y & 0xFFFF)));
        x[3] = __half2float(__ushort_as_half((unsigned short)(u.y >> 16)));
    } else if constexpr (NG == 2) {
        const uint32_t u = __ldg(reinterpret_cast<const unsigned int *>(s));
        x[0] = __half2float(__ushort_as_half((unsigned short)(u & 0xFFFF)));
        x[1] = __half2float(__ushort_as_half((unsigned short)(u >> 16)));
    } else {
        x[0] = __half2float(__ushort_as_half(__ldg(s)));
    }
}

// a pair of int8 bytes (byte `bsel` of x and of y) -> fp16 x2 with bits 0x6400 | (byte ^ flip)
__device__ __forceinline__ __half2 byte_pair(uint32_t x, uint32_t y, int bsel, uint32_t flip) {
    const uint32_t p = __byte_perm(x, y, (uint32_t)bsel | ((uint32_t)(4 + bsel) << 8));
    // one lop3 (a & b) ^ c: both constants as immediates would take two
    uint32_t h;
    asm("lop3.b32 %0, %1, %2, %3, 0x6a;" : "=r"(h) : "r"(p), "r"(0x00FF00FFu), "r"(0x64006400u | flip));
    return *reinterpret_cast<const __half2 *>(&h);
}

__device__ __forceinline__ uint32_t h2bits(__half2 h) { return *reinterpret_cast<uint32_t *>(&h); }
__device__ __forceinline__ __half2 bits2h(uint32_t u) { return *reinterpret_cast<__half2 *>(&u); }

// One digit's 2^(b+1) I - 2 (J0 + 256 J1) - C_b sq from its int32 accumulators (started at the
// bits of 1.5 * 2^23: one exact fp32 subtraction each), every dot formed: the decode's route (the
// CUDA extend forms its logits on fp16 tensor cores instead, extend.cu and witcert/kernels/f16keys.py).
__device__ __forceinline__ float digit_term(int ci, int cj0, int cj1, float csq) {
    const float fi = __int_as_float(ci) - 12582912.0f;
    float r = -csq;
    if constexpr (BITS == 16)
        r = __fmaf_rn(__fmaf_rn(__int_as_float(cj1) - 12582912.0f, 256.0f, __int_as_float(cj0) - 12582912.0f), -2.0f, r);
    else
        r = __fmaf_rn(__int_as_float(cj0) - 12582912.0f, -2.0f, r);
    return __fmaf_rn(fi, ROWF, r);
}

// One scale group's share of a logit from its three digit terms: the digits (fma(fma(t_3, 2^-7,
// t_2), 2^-7, t_1)), then the group scale and the row factor 2^(e-b-8) sm: the roundings
// combine_roundings counts (PROOFS 5.4); the caller adds the groups one after another.
__device__ __forceinline__ float group_logit(float t1, float t2, float t3, float scale, float f) {
    const float tt = __fmaf_rn(__fmaf_rn(t3, 0.0078125f, t2), 0.0078125f, t1);
    return __fmul_rn(__fmul_rn(tt, scale), f);
}

// Four sums over the warp's lanes (a butterfly: every lane ends with the same four sums, each
// summed in the same order whatever else the warp reduces): a query row's group constants
// (q_row; extend.cu's q_row_h)
__device__ __forceinline__ void warp_sum4(double &a, double &b, double &c, double &d) {
    for (int o = 16; o; o >>= 1) {
        a += __shfl_xor_sync(FULL, a, o);
        b += __shfl_xor_sync(FULL, b, o);
        c += __shfl_xor_sync(FULL, c, o);
        d += __shfl_xor_sync(FULL, d, o);
    }
}

// What one (query row, scale group) contributes to the logits and radii (PROOFS 5.4):
// comb = (C_b sq_1, C_b sq_2, C_b sq_3, the row factor 2^(e-b-8) sm), crt = (||q_g||_2,
// ||q_g||_1 (both rounded up), the slack weight sm (gamma 128 A_g + 127.5 R_g), 0), bad = a
// non-finite entry (read as 0).
struct QRow {
    float4 comb, crt;
    int bad;
};

// One (query row, scale group) split into int8 digits by one warp: lane l holds channels
// 32 m + l (m < KPG) of the group in qv (raw: a non-finite entry reads 0 and sets bad); digit
// j of channel 32 m + l is written to dig[j][32 m + l]. The result is the same on every lane.
__device__ __forceinline__ QRow q_row(float (&qv)[KPG], int8_t *const (&dig)[3], float sm, float arith_gamma,
                                      int lane) {
    int bad = 0;
    float amax = 0.0f;
#pragma unroll
    for (int m = 0; m < KPG; m++) {
        if (!isfinite(qv[m])) { bad = 1; qv[m] = 0.0f; }
        amax = fmaxf(amax, fabsf(qv[m]));
    }
    for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(FULL, amax, o));
    bad = __any_sync(FULL, bad);
    const int e = min(max(((__float_as_int(amax) >> 23) & 0xFF) - 125, -125), 125);
    const int e1 = e >> 1, e2 = e - e1;
    const double sc = pow2d(e);
    double res = 0.0, dab = 0.0, s2 = 0.0, s1 = 0.0;
    int sq[3] = {0, 0, 0};
#pragma unroll
    for (int m = 0; m < KPG; m++) {
        float y = (qv[m] * pow2f(-e1)) * pow2f(-e2) * 128.0f;
        float d[3];
#pragma unroll
        for (int j = 0; j < 3; j++) {
            d[j] = fminf(fmaxf(rintf(y), -127.0f), 127.0f);
            y = (y - d[j]) * 128.0f;
            dig[j][32 * m + lane] = (int8_t)(int)d[j];
            sq[j] += (int)d[j];
        }
        const double rec = ((double)d[0] + ((double)d[1] + (double)d[2] * 0.0078125) * 0.0078125) * 0.0078125 * sc;
        res += fabs((double)qv[m] - rec);
        dab += (fabs((double)d[0]) + (fabs((double)d[1]) + fabs((double)d[2]) * 0.0078125) * 0.0078125) * 0.0078125;
        s2 += (double)qv[m] * (double)qv[m];
        s1 += fabs((double)qv[m]);
    }
    warp_sum4(res, dab, s2, s1);
    for (int o = 16; o; o >>= 1)
#pragma unroll
        for (int j = 0; j < 3; j++) sq[j] += __shfl_xor_sync(FULL, sq[j], o);
    const float resf = round_up_f32(res), dabf = round_up_f32(dab * sc);
    const float f = ((__int_as_float((127 - (BITS + 8)) << 23) * sm) * pow2f(e >> 1)) * pow2f(e - (e >> 1));
    const float w_ar = (arith_gamma * 128.0f * dabf + 127.5f * resf) * sm * 1.0000019073486328125f;
    QRow out;
    out.comb = make_float4(CB * (float)sq[0], CB * (float)sq[1], CB * (float)sq[2], f);
    out.crt = make_float4(round_up_f32(sqrt(s2)), round_up_f32(s1), w_ar, 0.0f);
    out.bad = bad;
    return out;
}
