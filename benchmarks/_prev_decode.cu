// Paged decode over witcert's dithered INT8 pool with the certificate: CUDA C++ tensor-core
// split kernel (mma.sync), the same arithmetic as the Triton kernel (docs/PROOFS.md 5.4).
//
// One CTA of NW warps per (sequence b, KV head, split); each warp takes 16-token tiles in
// turn and keeps its own softmax state; the warps merge in shared memory at the end, and the
// Triton merge kernel combines the splits (partials in its layout).
//
// q.k (int8 tensor cores, exact): A = 16 tokens x 32 channels of one k-step (codes, or one
// byte plane rho_p of the dither), B = the query heads' int8 digits (n = 8 columns = heads),
// C = int32. A k-step never crosses a scale group, so each group's dots are separate and the
// group scale applies after them. Inside a k-step the channels are permuted (the same
// permutation for q and k, so the dot is unchanged): lane (g, t) holds channels
// 32 ks + 8 t + [0, 8) of tokens g and g + 8, i.e. exactly one Philox call's 8 channels at
// b = 16 (half a call at b = 8: the lane pair splits the call and swaps two words). The
// words become the int8 operand registers with one byte permute and one xor each.
// The combination per (token, head, group, digit) is 2^(b+1) I - 2 (J0 + 256 J1) - C_b sq in
// fp32 (the int32 accumulators start at the bits of 1.5 * 2^23, so one fp32 subtraction
// converts them exactly: |I|, |J| < 2^22), then the digits, the scale, the row factor and
// the groups: no more roundings per term than combine_roundings counts.
//
// p.v (fp16 tensor cores): A = (query head, group) rows x 16 tokens of p s_g / r_g in fp16
// (r_g the largest V scale of the group seen so far, so the operand lies in [0, 1]); B = the
// V codes, and each dither byte plane times -2^-b 256^p (both exact in fp16: an int8 x is the
// half with bits 0x6400 | (x + 128) minus 1152); C = fp32 [rows, channels]. Lane (g, t)
// holds channels [16 g, 16 g + 16) of tokens 2t, 2t+1, 2t+8, 2t+9 (the n side permuted):
// one Philox call per token at b = 8, two at b = 16, no call shared between lanes.
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
constexpr int KS = HD / 32;             // int8 k-steps per head
constexpr int BITS = WC_BITS;           // 8 or 16
constexpr int ROUNDS = WC_ROUNDS;       // Philox rounds: 10 or 7
constexpr int QGP = WC_QGP;             // query heads of the group, padded
constexpr int ROWS = QGP * NG;          // p.v rows (head, group)
constexpr int NW = 4;                   // warps per CTA
constexpr int TILE = 16;                // tokens per warp tile
constexpr int NT = HD / 8;              // p.v n-tiles
constexpr float ROWF = (float)(1 << (BITS + 1));
constexpr float CB = BITS == 8 ? 1.0f : 257.0f;
#ifdef WC_MAXREG   // a register cap per thread, as resident CTAs per SM for __launch_bounds__
constexpr int MINB = 65536 / (NW * 32 * WC_MAXREG);
#else
constexpr int MINB = 1;
#endif
static_assert(ROWS <= 16 && QGP <= 8 && (G == 32 || G == 64 || G == 128), "unsupported shape");
static_assert(BITS == 8 || BITS == 16, "dither bits");
#define INF __int_as_float(0x7f800000)
#define FMAX 3.4028234e38f
#define FULL 0xffffffffu

struct Args {
    const void *q;                 // [B, Hq, D] fp32 / fp16 / bf16 (q_dtype), strides below
    const int8_t *kc, *vc;         // codes [slots, Hkv, D]
    const __half *ks, *vs, *kw, *vw;  // scales / witnesses [slots, Hkv, NG]
    const int64_t *epochs;         // [slots]
    const int32_t *bt;             // [B, pages]
    const int32_t *seq_lens;       // [B]
    const float *delta;            // [B] (prob radius) or null -> delta_scalar
    float *pm, *pl, *pa, *pvw, *pvmax, *pu, *pacc;  // partials [B, Hq, S(, D)]
    float *radius, *logits;        // [B, Hq, rad_n] or null
    int64_t sq_b, sq_h, bt_s0, rad_n;
    float sm, delta_scalar, bias_coef, arith_gamma, arith_abs;
    uint32_t key0, key1;
    int32_t q_dtype, Hq, Hkv, G, P, layer, rounds, cert, radius_mode;  // 0 det 1 prob 2 min
    int32_t num_splits_grid, fixed_splits, min_tokens_per_split, max_splits;
    const int64_t *positions;      // [slots]: the counter's first word (position-keyed dither), or null
};

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

__device__ __forceinline__ float exp_acc(float x) {
    return ex2(__fmaf_rn(x, 1.44269502162933349609375f, x * 1.92596298909109e-08f));
}

// >= expm1(u) for u >= 0 (+inf for +inf): witcert.kernels.decode.expm1_up
__device__ __forceinline__ float expm1_up(float u) {
    const float t = u * (1.0f + u * (0.5f + u * (0.16666667163372f + u * (0.041666667908430f + u * 0.0083333337679505f))));
    return u < 0.0625f ? t * 1.00000095367431640625f : (exp_acc(u) - 1.0f) * 1.000244140625f;
}

__device__ __forceinline__ float round_up_f32(double x) {  // witcert.kernels.dequant.round_up_f32
    return (float)x * 1.0000002384185791015625f + 5.6e-45f;
}

__device__ __forceinline__ float pow2f(int e) { return __int_as_float((e + 127) << 23); }
__device__ __forceinline__ double pow2d(int e) { return __longlong_as_double((long long)(e + 1023) << 52); }

__device__ __forceinline__ float load_q(const Args &a, int b, int h, int c) {
    const int64_t o = (int64_t)b * a.sq_b + (int64_t)h * a.sq_h + c;
    if (a.q_dtype == 0) return reinterpret_cast<const float *>(a.q)[o];
    const unsigned short bits = reinterpret_cast<const unsigned short *>(a.q)[o];
    if (a.q_dtype == 1) return __half2float(__ushort_as_half(bits));
    return __uint_as_float((uint32_t)bits << 16);
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
    const uint32_t h = (p & 0x00FF00FFu) ^ (0x64006400u | flip);
    return *reinterpret_cast<const __half2 *>(&h);
}

__device__ __forceinline__ uint32_t h2bits(__half2 h) { return *reinterpret_cast<uint32_t *>(&h); }

extern "C" __global__ void __launch_bounds__(NW * 32, MINB) wc_decode_split(Args a) {
    const int pid = blockIdx.x, split = blockIdx.y;
    const int b = pid / a.Hkv, kvh = pid % a.Hkv;
    const int qg = a.Hq / a.Hkv;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int n_tok = a.seq_lens[b];
    int n_splits = a.fixed_splits > 0 ? a.fixed_splits : 1;
    if (a.fixed_splits == 0)
        while (n_splits * a.min_tokens_per_split < n_tok && n_splits < a.max_splits) n_splits *= 2;
    const int per_split = (n_tok + n_splits - 1) / n_splits;
    const int t_lo = split * per_split;
    const int t_hi = min(t_lo + per_split, n_tok);

    __shared__ __align__(16) int8_t s_dig[3][8][HD];    // the query's int8 digits (heads >= QGP: 0)
    __shared__ float4 s_comb[QGP][NG];    // C_b sq_1, C_b sq_2, C_b sq_3, row factor
    __shared__ float4 s_crt[QGP][NG];     // ||q_g||_2, ||q_g||_1 (rounded up), slack weight
    __shared__ int s_rbad[ROWS];
    __shared__ float s_p[NW][8][TILE];    // a warp's tile weights [head][token]
    __shared__ float s_alpha[NW][8];
    __shared__ float s_vs[NW][TILE][NG];  // a warp's tile V scales (0: flagged or past the end)
    __shared__ float s_red[NW][QGP][5];
    __shared__ float s_vmax[NW];
    __shared__ float s_acc[NW][QGP][HD];

    // ---- the query rows (head, group): digits, exponent, residual, norms (PROOFS 5.4) ----
    for (int i = QGP * HD + tid; i < 8 * HD; i += NW * 32) {
        s_dig[0][0][i] = 0;
        s_dig[1][0][i] = 0;
        s_dig[2][0][i] = 0;
    }
    for (int r = warp; r < ROWS; r += NW) {
        const int h = r / NG, grp = r % NG;
        float qv[KPG];
        int bad = 0;
        float amax = 0.0f;
#pragma unroll
        for (int m = 0; m < KPG; m++) {
            float x = h < qg ? load_q(a, b, kvh * qg + h, grp * G + 32 * m + lane) : 0.0f;
            if (!isfinite(x)) { bad = 1; x = 0.0f; }
            qv[m] = x;
            amax = fmaxf(amax, fabsf(x));
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
                s_dig[j][h][grp * G + 32 * m + lane] = (int8_t)(int)d[j];
                sq[j] += (int)d[j];
            }
            const double rec = ((double)d[0] + ((double)d[1] + (double)d[2] * 0.0078125) * 0.0078125) * 0.0078125 * sc;
            res += fabs((double)qv[m] - rec);
            dab += (fabs((double)d[0]) + (fabs((double)d[1]) + fabs((double)d[2]) * 0.0078125) * 0.0078125) * 0.0078125;
            s2 += (double)qv[m] * (double)qv[m];
            s1 += fabs((double)qv[m]);
        }
        for (int o = 16; o; o >>= 1) {
            res += __shfl_xor_sync(FULL, res, o);
            dab += __shfl_xor_sync(FULL, dab, o);
            s2 += __shfl_xor_sync(FULL, s2, o);
            s1 += __shfl_xor_sync(FULL, s1, o);
#pragma unroll
            for (int j = 0; j < 3; j++) sq[j] += __shfl_xor_sync(FULL, sq[j], o);
        }
        if (lane == 0) {
            const float resf = round_up_f32(res), dabf = round_up_f32(dab * sc);
            const float f = ((__int_as_float((127 - (BITS + 8)) << 23) * a.sm) * pow2f(e >> 1)) * pow2f(e - (e >> 1));
            const float w_ar = (a.arith_gamma * 128.0f * dabf + 127.5f * resf) * a.sm * 1.0000019073486328125f;
            s_comb[h][grp] = make_float4(CB * (float)sq[0], CB * (float)sq[1], CB * (float)sq[2], f);
            s_crt[h][grp] = make_float4(round_up_f32(sqrt(s2)), round_up_f32(s1), w_ar, 0.0f);
            s_rbad[r] = bad;
        }
    }
    __syncthreads();

    // ---- per-lane constants ---------------------------------------------------------------
    // B fragments of the digits (head g, channels 32 ks + 8 t + [0, 8)) are read from shared
    // memory at each use: 24 registers fewer
    bool qbad[2];
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int h = 2 * t + j;
        int bad = 0;
        if (h < QGP)
            for (int grp = 0; grp < NG; grp++) bad |= s_rbad[h * NG + grp];
        qbad[j] = bad != 0 || h >= qg;
    }
    const int vgrp = g % NG;           // the scale group of this lane's p.v rows
    const int hA = g / NG, hB = (g + 8) / NG;
    const bool rowA = hA < qg, rowB = hB < qg;
    const uint32_t lh = ((uint32_t)a.layer << 16) | (uint32_t)kvh;
    const int n_tiles = (t_hi - t_lo + TILE - 1) / TILE;
    float lf = 0.0f, e_soft = 0.0f;
    if (a.cert) {
        if (a.radius_mode != 0) {
            const double dl = a.delta ? (double)a.delta[b] : (double)a.delta_scalar;
            lf = round_up_f32(sqrt(2.0 * log(2.0 * (double)n_tok / dl)) * 1.0000000000001);
        }
        // argument roundings of every weight, one exp per weight and per rescale: this warp's
        // tiles, the warp merge and the split merge (with room to spare)
        e_soft = 1.0616e-05f + (float)((n_tiles + NW - 1) / NW + NW + 4) * 4.76837158203125e-07f;
    }

    float m_[2] = {-INF, -INF}, l_[2] = {0.0f, 0.0f}, ca[2] = {0.0f, 0.0f}, cvw[2] = {0.0f, 0.0f};
    float cu[2] = {0.0f, 0.0f}, cvmax = 0.0f;
    float acc[NT][4];
#pragma unroll
    for (int i = 0; i < NT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    float pvc[2] = {0.0f, 0.0f};  // sum of the fp16 p.v operand of rows g, g + 8
    float rv = 0.0f;              // largest V scale of group vgrp seen so far

    for (int t0 = t_lo + warp * TILE; t0 < t_hi; t0 += NW * TILE) {
        // ---- the tile's tokens: lane l resolves token t0 + (l & 15), the others shuffle ----
        const int my = t0 + (lane & 15);
        const int tk = my < t_hi ? my : t_lo;
        const int64_t slot = (int64_t)a.bt[(int64_t)b * a.bt_s0 + tk / a.P] * a.P + tk % a.P;
        const uint32_t mw0 = (uint32_t)(a.positions ? a.positions[slot] : slot);
        const uint32_t mep = (uint32_t)a.epochs[slot];
        const uint32_t mrow = (uint32_t)(slot * a.Hkv + kvh);
        uint32_t krow[2], kw0[2], kep[2];
        bool klive[2];
#pragma unroll
        for (int x = 0; x < 2; x++) {
            krow[x] = __shfl_sync(FULL, mrow, g + 8 * x);
            kw0[x] = __shfl_sync(FULL, mw0, g + 8 * x);
            kep[x] = __shfl_sync(FULL, mep, g + 8 * x);
            klive[x] = t0 + g + 8 * x < t_hi;
        }
        uint32_t vrow[4], vw0[4], vep[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int src = 2 * t + (k & 1) + 8 * (k >> 1);
            vrow[k] = __shfl_sync(FULL, mrow, src);
            vw0[k] = __shfl_sync(FULL, mw0, src);
            vep[k] = __shfl_sync(FULL, mep, src);
        }
        float ksc[2][NG], vsc[2][NG], vwt[2][NG];
        bool kbad[2], vbad[2];
#pragma unroll
        for (int x = 0; x < 2; x++) {
            load_groups(a.ks, krow[x], ksc[x]);
            load_groups(a.vs, krow[x], vsc[x]);
            load_groups(a.vw, krow[x], vwt[x]);
            bool kb = false, vb = false;
#pragma unroll
            for (int grp = 0; grp < NG; grp++) {
                kb |= isinf(ksc[x][grp]);
                vb |= isinf(vsc[x][grp]) | isinf(vwt[x][grp]);
            }
            kbad[x] = kb;
            vbad[x] = vb;
        }

        // ---- logits: per group, the digits' int8 dots with codes and dither planes --------
        float z[4];  // (token g, head 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
#pragma unroll
        for (int grp = 0; grp < NG; grp++) {
            uint32_t ca_[KPG][4], pa0[KPG][4], pa1[KPG][4];
#pragma unroll
            for (int kk = 0; kk < KPG; kk++) {
                const int ks = grp * KPG + kk;
                const uint2 c0 = __ldg(reinterpret_cast<const uint2 *>(a.kc + (int64_t)krow[0] * HD + 32 * ks + 8 * t));
                const uint2 c1 = __ldg(reinterpret_cast<const uint2 *>(a.kc + (int64_t)krow[1] * HD + 32 * ks + 8 * t));
                ca_[kk][0] = c0.x; ca_[kk][1] = c1.x; ca_[kk][2] = c0.y; ca_[kk][3] = c1.y;
                if constexpr (BITS == 16) {
#pragma unroll
                    for (int x = 0; x < 2; x++) {
                        const uint4 w = philox(kw0[x], lh, (uint32_t)(4 * ks + t), kep[x], a.key0, a.key1);
                        pa0[kk][x] = __byte_perm(w.x, w.y, 0x6420) ^ 0x80808080u;
                        pa0[kk][2 + x] = __byte_perm(w.z, w.w, 0x6420) ^ 0x80808080u;
                        pa1[kk][x] = __byte_perm(w.x, w.y, 0x7531) ^ 0x80808080u;
                        pa1[kk][2 + x] = __byte_perm(w.z, w.w, 0x7531) ^ 0x80808080u;
                    }
                } else {
                    // the lane pair (t, t ^ 1) shares the call of chunk 2 ks + t / 2: lane t
                    // computes it for token g (t even) or g + 8 (t odd) and swaps half of it
                    const int odd = t & 1;
                    const uint4 w = philox(odd ? kw0[1] : kw0[0], lh, (uint32_t)(2 * ks + (t >> 1)),
                                           odd ? kep[1] : kep[0], a.key0, a.key1);
                    const uint32_t r0 = __shfl_xor_sync(FULL, odd ? w.x : w.z, 1);
                    const uint32_t r1 = __shfl_xor_sync(FULL, odd ? w.y : w.w, 1);
                    pa0[kk][0] = (odd ? r0 : w.x) ^ 0x80808080u;
                    pa0[kk][2] = (odd ? r1 : w.y) ^ 0x80808080u;
                    pa0[kk][1] = (odd ? w.z : r0) ^ 0x80808080u;
                    pa0[kk][3] = (odd ? w.w : r1) ^ 0x80808080u;
                }
            }
            float td[3][4];
#pragma unroll
            for (int j = 0; j < 3; j++) {
                int ci[4], cj0[4], cj1[4];
#pragma unroll
                for (int v = 0; v < 4; v++) ci[v] = cj0[v] = cj1[v] = 0x4B400000;  // 1.5 * 2^23
#pragma unroll
                for (int kk = 0; kk < KPG; kk++) {
                    const int ks = grp * KPG + kk;
                    const uint2 qb = *reinterpret_cast<const uint2 *>(&s_dig[j][g][32 * ks + 8 * t]);
                    mma_s8(ci, ca_[kk][0], ca_[kk][1], ca_[kk][2], ca_[kk][3], qb.x, qb.y);
                    mma_s8(cj0, pa0[kk][0], pa0[kk][1], pa0[kk][2], pa0[kk][3], qb.x, qb.y);
                    if constexpr (BITS == 16)
                        mma_s8(cj1, pa1[kk][0], pa1[kk][1], pa1[kk][2], pa1[kk][3], qb.x, qb.y);
                }
#pragma unroll
                for (int v = 0; v < 4; v++) {
                    const int h = 2 * t + (v & 1);
                    const float4 cm = s_comb[h < QGP ? h : 0][grp];
                    const float csq = j == 0 ? cm.x : (j == 1 ? cm.y : cm.z);
                    const float fi = __int_as_float(ci[v]) - 12582912.0f;
                    float jj = __int_as_float(cj0[v]) - 12582912.0f;
                    if constexpr (BITS == 16) jj = __fmaf_rn(__int_as_float(cj1[v]) - 12582912.0f, 256.0f, jj);
                    td[j][v] = __fmaf_rn(fi, ROWF, __fmaf_rn(jj, -2.0f, -csq));
                }
            }
#pragma unroll
            for (int v = 0; v < 4; v++) {
                const int h = 2 * t + (v & 1);
                const float f = s_comb[h < QGP ? h : 0][grp].w;
                const float tt = __fmaf_rn(__fmaf_rn(td[2][v], 0.0078125f, td[1][v]), 0.0078125f, td[0][v]);
                const float zr = __fmul_rn(__fmul_rn(tt, ksc[v >> 1][grp]), f);
                z[v] = grp == 0 ? zr : __fadd_rn(z[v], zr);
            }
        }
        uint32_t ovf = 0u;  // bit v: value v overflowed (a finite value is used, u = +inf)
#pragma unroll
        for (int v = 0; v < 4; v++) {
            float zz = z[v];
            if (!(fabsf(zz) <= FMAX)) {
                ovf |= 1u << v;
                zz = zz != zz ? 0.0f : copysignf(FMAX, zz);
            }
            const int x = v >> 1;
            z[v] = !klive[x] ? -INF : (kbad[x] ? 0.0f : zz);
        }
        if (a.logits) {
#pragma unroll
            for (int v = 0; v < 4; v++) {
                const int h = 2 * t + (v & 1), x = v >> 1;
                if (h < qg && klive[x])
                    a.logits[((int64_t)b * a.Hq + kvh * qg + h) * a.rad_n + t0 + g + 8 * x] = z[v];
            }
        }

        // ---- online softmax over the tile (heads 2t, 2t+1; every lane g keeps m) ---------
        float p[4], alpha[2];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            float mx = fmaxf(z[j], z[2 + j]);
            mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 4));
            mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 8));
            mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 16));
            const float mn = fmaxf(m_[j], mx);  // finite: token t0 is live
            alpha[j] = exp_acc(m_[j] - mn);
            p[j] = exp_acc(z[j] - mn);
            p[2 + j] = exp_acc(z[2 + j] - mn);
            l_[j] = l_[j] * alpha[j] + (p[j] + p[2 + j]);
            m_[j] = mn;
        }

        // ---- certificate terms of (token g / g+8, head 2t / 2t+1) ------------------------
        if (a.cert) {
            float vwn[2], vrad[2];
#pragma unroll
            for (int x = 0; x < 2; x++) {
                float w2 = 0.0f, s2 = 0.0f;
#pragma unroll
                for (int grp = 0; grp < NG; grp++) {
                    w2 = __fmaf_rn(vwt[x][grp], vwt[x][grp], w2);
                    const float vs = isinf(vsc[x][grp]) ? 0.0f : vsc[x][grp];
                    s2 = __fmaf_rn(vs, vs, s2);
                }
                vwn[x] = vbad[x] ? INF : sqrtf(w2) * 1.00000095367431640625f;
                vrad[x] = 127.5f * sqrtf(s2 * (float)G) * 1.00000095367431640625f + vwn[x];
                if (klive[x]) cvmax = vbad[x] ? INF : fmaxf(cvmax, vrad[x]);
            }
            float kwt[2][NG];
            load_groups(a.kw, krow[0], kwt[0]);
            load_groups(a.kw, krow[1], kwt[1]);
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int h = 2 * t + j;
                float add = 0.0f, vwa = 0.0f;
#pragma unroll
                for (int x = 0; x < 2; x++) {
                    float ud = 0.0f, s2 = 0.0f, s1 = 0.0f, uar = 0.0f;
#pragma unroll
                    for (int grp = 0; grp < NG; grp++) {
                        const float4 cr = s_crt[h < QGP ? h : 0][grp];
                        const float kw = isinf(kwt[x][grp]) ? 0.0f : kwt[x][grp];
                        const float sf = isinf(ksc[x][grp]) ? 0.0f : ksc[x][grp];
                        ud = __fmaf_rn(cr.x, kw, ud);
                        const float t2 = cr.x * sf;
                        s2 = __fmaf_rn(t2, t2, s2);
                        s1 = __fmaf_rn(cr.y, sf, s1);
                        uar = __fmaf_rn(cr.z, sf, uar);
                    }
                    float u = a.radius_mode == 1 ? INF : ud * a.sm;
                    if (a.radius_mode != 0)
                        u = fminf(u, a.sm * sqrtf(s2 / 12.0f) * lf + a.bias_coef * a.sm * s1);
                    u = u * 1.0000152587890625f + uar * 1.0000152587890625f + (a.arith_abs + e_soft);
                    const int v = 2 * x + j;
                    if (kbad[x] || vbad[x] || qbad[j] || ((ovf >> v) & 1u) || !(u == u)) u = INF;
                    if (!klive[x]) continue;
                    if (p[v] > 0.0f) add += p[v] * expm1_up(u);
                    cu[j] = fmaxf(cu[j], u);
                    vwa += vwn[x] == INF ? INF : p[v] * vwn[x];
                    if (a.radius && h < qg)
                        a.radius[((int64_t)b * a.Hq + kvh * qg + h) * a.rad_n + t0 + g + 8 * x] = u;
                }
                ca[j] = (ca[j] == INF ? INF : ca[j] * alpha[j]) + add;
                cvw[j] = (cvw[j] == INF ? INF : cvw[j] * alpha[j]) + vwa;
            }
        }

        // ---- values: the tile's weights to the (head, group) row layout -------------------
#pragma unroll
        for (int v = 0; v < 4; v++) s_p[warp][2 * t + (v & 1)][g + 8 * (v >> 1)] = p[v];
        if (g == 0) {
            s_alpha[warp][2 * t] = alpha[0];
            s_alpha[warp][2 * t + 1] = alpha[1];
        }
        if (t == 0) {
#pragma unroll
            for (int x = 0; x < 2; x++)
#pragma unroll
                for (int grp = 0; grp < NG; grp++)
                    s_vs[warp][g + 8 * x][grp] = (klive[x] && !vbad[x]) ? vsc[x][grp] : 0.0f;
        }
        __syncwarp();
        float vsv[4];
        float tm = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            vsv[k] = s_vs[warp][2 * t + (k & 1) + 8 * (k >> 1)][vgrp];
            tm = fmaxf(tm, vsv[k]);
        }
        tm = fmaxf(tm, __shfl_xor_sync(FULL, tm, 1));
        tm = fmaxf(tm, __shfl_xor_sync(FULL, tm, 2));
        float rn = fmaxf(rv, tm);
        rn = rn > 0.0f ? rn : 1.0f;
        const float rr = rv / rn, inv = 1.0f / rn;
        rv = rn;
        const float fA = s_alpha[warp][hA < 8 ? hA : 0] * rr, fB = s_alpha[warp][hB < 8 ? hB : 0] * rr;
        uint32_t pa[4];
        float sA = 0.0f, sB = 0.0f;
#pragma unroll
        for (int kk = 0; kk < 2; kk++) {
            const int tok0 = 2 * t + 8 * kk;
            const float a0 = rowA ? s_p[warp][hA][tok0] * (vsv[2 * kk] * inv) : 0.0f;
            const float a1 = rowA ? s_p[warp][hA][tok0 + 1] * (vsv[2 * kk + 1] * inv) : 0.0f;
            const float b0 = rowB ? s_p[warp][hB < 8 ? hB : 0][tok0] * (vsv[2 * kk] * inv) : 0.0f;
            const float b1 = rowB ? s_p[warp][hB < 8 ? hB : 0][tok0 + 1] * (vsv[2 * kk + 1] * inv) : 0.0f;
            const __half2 ha = __floats2half2_rn(a0, a1), hb = __floats2half2_rn(b0, b1);
            pa[2 * kk] = h2bits(ha);
            pa[2 * kk + 1] = h2bits(hb);
            sA += __low2float(ha) + __high2float(ha);
            sB += __low2float(hb) + __high2float(hb);
        }
        __syncwarp();  // s_p, s_alpha, s_vs are rewritten by the next tile
        pvc[0] = pvc[0] * fA + sA;
        pvc[1] = pvc[1] * fB + sB;
        if (__any_sync(FULL, fA != 1.0f || fB != 1.0f)) {
#pragma unroll
            for (int i = 0; i < NT; i++) {
                acc[i][0] *= fA; acc[i][1] *= fA; acc[i][2] *= fB; acc[i][3] *= fB;
            }
        }
        // ---- values: the codes and the dither planes of channels [16 g, 16 g + 16) -------
        uint4 vcod[4];
#pragma unroll
        for (int k = 0; k < 4; k++)
            vcod[k] = __ldg(reinterpret_cast<const uint4 *>(a.vc + (int64_t)vrow[k] * HD + 16 * g));
        const __half2 c1152 = __float2half2_rn(1152.0f);
#pragma unroll
        for (int hh = 0; hh < BITS / 8; hh++) {
            uint4 w[4];
#pragma unroll
            for (int k = 0; k < 4; k++)
                w[k] = philox(vw0[k], lh, (1u << 31) | (uint32_t)(BITS == 8 ? g : 2 * g + hh), vep[k], a.key0, a.key1);
#pragma unroll
            for (int ii = 0; ii < (BITS == 8 ? 16 : 8); ii++) {
                const int i = (BITS == 8 ? 0 : 8 * hh) + ii;
                const uint32_t c0 = h2bits(__hsub2(byte_pair(word(vcod[0], i >> 2), word(vcod[1], i >> 2), i & 3, 0x00800080u), c1152));
                const uint32_t c1 = h2bits(__hsub2(byte_pair(word(vcod[2], i >> 2), word(vcod[3], i >> 2), i & 3, 0x00800080u), c1152));
                mma_f16(acc[i], pa, c0, c1);
                if constexpr (BITS == 8) {
                    // -rho 2^-8: (1152 + rho) (-2^-8) + 4.5, exact
                    const __half2 sc = __float2half2_rn(-0.00390625f), off = __float2half2_rn(4.5f);
                    const uint32_t r0 = h2bits(__hfma2(byte_pair(word(w[0], ii >> 2), word(w[1], ii >> 2), ii & 3, 0u), sc, off));
                    const uint32_t r1 = h2bits(__hfma2(byte_pair(word(w[2], ii >> 2), word(w[3], ii >> 2), ii & 3, 0u), sc, off));
                    mma_f16(acc[i], pa, r0, r1);
                } else {
                    // channel ii of the call: half ii % 2 of word ii / 2; planes 0 (-2^-16), 1 (-2^-8)
#pragma unroll
                    for (int pl = 0; pl < 2; pl++) {
                        const __half2 sc = __float2half2_rn(pl ? -0.00390625f : -0.0000152587890625f);
                        const __half2 off = __float2half2_rn(pl ? 4.5f : 0.017578125f);
                        const int bs = 2 * (ii & 1) + pl;
                        const uint32_t r0 = h2bits(__hfma2(byte_pair(word(w[0], ii >> 1), word(w[1], ii >> 1), bs, 0u), sc, off));
                        const uint32_t r1 = h2bits(__hfma2(byte_pair(word(w[2], ii >> 1), word(w[3], ii >> 1), bs, 0u), sc, off));
                        mma_f16(acc[i], pa, r0, r1);
                    }
                }
            }
        }
    }

    // ---- this warp's partials: reduce the lanes, write to shared memory ---------------------
#pragma unroll
    for (int j = 0; j < 2; j++) {
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) {
            l_[j] += __shfl_xor_sync(FULL, l_[j], o);
            ca[j] += __shfl_xor_sync(FULL, ca[j], o);
            cvw[j] += __shfl_xor_sync(FULL, cvw[j], o);
            cu[j] = fmaxf(cu[j], __shfl_xor_sync(FULL, cu[j], o));
        }
    }
    for (int o = 1; o < 32; o <<= 1) cvmax = fmaxf(cvmax, __shfl_xor_sync(FULL, cvmax, o));
#pragma unroll
    for (int k = 0; k < 2; k++) {
        pvc[k] += __shfl_xor_sync(FULL, pvc[k], 1);
        pvc[k] += __shfl_xor_sync(FULL, pvc[k], 2);
    }
    if (g == 0) {
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int h = 2 * t + j;
            if (h < QGP) {
                s_red[warp][h][0] = m_[j]; s_red[warp][h][1] = l_[j]; s_red[warp][h][2] = ca[j];
                s_red[warp][h][3] = cvw[j]; s_red[warp][h][4] = cu[j];
            }
        }
    }
    if (lane == 0) s_vmax[warp] = cvmax;
    const float cshift = CB / ROWF;
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int ch0 = 16 * (2 * t + e);
        if (ch0 / G != vgrp) continue;
#pragma unroll
        for (int i = 0; i < NT; i++) {
            if (rowA) s_acc[warp][hA][ch0 + i] = (acc[i][e] - cshift * pvc[0]) * rv;
            if (rowB) s_acc[warp][hB < QGP ? hB : 0][ch0 + i] = (acc[i][2 + e] - cshift * pvc[1]) * rv;
        }
    }
    __syncthreads();

    // ---- merge the warps ---------------------------------------------------------------------
    for (int idx = tid; idx < qg * HD; idx += NW * 32) {
        const int h = idx / HD, c = idx % HD;
        float mm = -INF;
        for (int w = 0; w < NW; w++) mm = fmaxf(mm, s_red[w][h][0]);
        float o = 0.0f;
        for (int w = 0; w < NW; w++) {
            const float mw = s_red[w][h][0];
            if (mw != -INF) o += s_acc[w][h][c] * exp_acc(mw - mm);
        }
        const int64_t part = ((int64_t)b * a.Hq + kvh * qg + h) * a.num_splits_grid + split;
        a.pacc[part * HD + c] = o;
    }
    if (tid < qg) {
        const int h = tid;
        float mm = -INF;
        for (int w = 0; w < NW; w++) mm = fmaxf(mm, s_red[w][h][0]);
        float ll = 0.0f, aa = 0.0f, vv = 0.0f, uu = 0.0f, vm = 0.0f;
        for (int w = 0; w < NW; w++) {
            const float mw = s_red[w][h][0];
            const float wt = mw == -INF ? 0.0f : exp_acc(mw - mm);
            ll += s_red[w][h][1] * wt;
            const float aw = s_red[w][h][2], vw2 = s_red[w][h][3];
            aa = (aa == INF || aw == INF) ? INF : aa + (wt > 0.0f ? aw * wt : 0.0f);
            vv = (vv == INF || vw2 == INF) ? INF : vv + (wt > 0.0f ? vw2 * wt : 0.0f);
            uu = fmaxf(uu, s_red[w][h][4]);
            vm = fmaxf(vm, s_vmax[w]);
        }
        const int64_t part = ((int64_t)b * a.Hq + kvh * qg + h) * a.num_splits_grid + split;
        a.pm[part] = mm;
        a.pl[part] = ll;
        if (a.cert) {
            a.pa[part] = aa;
            a.pvw[part] = vv;
            a.pvmax[part] = vm;
            a.pu[part] = uu;
        }
    }
}

extern "C" int wc_decode_launch(const Args *a, int grid_x, int grid_y, cudaStream_t stream) {
    wc_decode_split<<<dim3(grid_x, grid_y), NW * 32, 0, stream>>>(*a);
    return (int)cudaGetLastError();
}
