// Paged decode over witcert's dithered INT8 pool with the certificate, CUDA C++ (split pass).
//
// One CTA of 128 threads per (sequence b, KV head, split), all QG query heads of the GQA
// group. A token's D channels are read by TPT = D / CPT threads, CPT consecutive channels
// each (16-byte code loads; one Philox4x32 call per 16 channels at 8-bit dither). Each
// thread dequantizes its channels exactly as the reference does, k^ = fl(num * (s 2^-(b+1))),
// num = n 2^(b+1) - (2r + 1 - 2^b), and forms fp32 FMA partial dots with its channels of the
// QG query rows; TPT-thread shuffles complete the logits. Tokens are taken TT at a time per
// thread group: logits of the TT tokens, one online-softmax rescale, then the values.
// The certificate terms of head h are kept by the threads with channel index h (mod TPT).
// Partials (m, l, acc, a, vw, vmax, umax per (b, h, split)) are written in the layout of the
// Triton kernel, whose merge kernel combines them (witcert/kernels/decode.py).
//
// Rounding model (docs/PROOFS.md 5.4, LogitModel "cuda"): each logit is an fp32 sum of D
// exact-input products in any order, plus the scale product: |l - sm q.k^| <=
// gamma_K sm 127.5 sum_g ||q_g||_1 s_g with K = WC_ROUNDINGS (from Python). exp2f (2 ulp,
// built without fast math) with the argument split in two (fma) for the weights.
#include <cstdint>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#ifndef WC_QG
#error "WC_QG (query heads per KV head, padded) must be defined"
#endif
constexpr int QG = WC_QG;
constexpr int HD = WC_D;
constexpr int BITS = WC_BITS;
constexpr int CPT = WC_CPT;                 // channels per thread: 16, or 8 for QG > 4
constexpr int TPT = HD / CPT;               // threads per token
constexpr int LANES = 32 / TPT;             // tokens of a warp in flight
constexpr int NWARPS = 4;
constexpr int NL = NWARPS * LANES;          // token lanes of the CTA
constexpr int TT = WC_TT;                   // tokens per lane per tile
#define INF __int_as_float(0x7f800000)

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

__device__ __forceinline__ void philox(uint32_t &c0, uint32_t &c1, uint32_t &c2, uint32_t &c3,
                                       uint32_t k0, uint32_t k1, int rounds) {
#pragma unroll 10
    for (int r = 0; r < 10; r++) {
        if (r >= rounds) break;
        uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

// r of channel j (0..CPT-1) of this thread, from the words of the call(s) covering it.
// b = 8: channel j of a call is byte j % 4 of word j / 4; b = 16: half j % 2 of word j / 2.
__device__ __forceinline__ void dither_r(uint32_t slot, uint32_t epoch, int c0, int side,
                                         uint32_t lh, uint32_t k0, uint32_t k1, int rounds,
                                         int32_t (&r)[CPT]) {
    if (BITS == 8) {
        uint32_t w0 = slot, w1 = lh, w2 = ((uint32_t)side << 31) | (uint32_t)(c0 / 16), w3 = epoch;
        philox(w0, w1, w2, w3, k0, k1, rounds);
        uint32_t w[4] = {w0, w1, w2, w3};
        const int off = c0 % 16;  // 0, or 8 when CPT == 8 takes the second half of the call
#pragma unroll
        for (int j = 0; j < CPT; j++) r[j] = (w[(off + j) >> 2] >> (8 * ((off + j) & 3))) & 0xFF;
    } else {
#pragma unroll
        for (int cc = 0; cc < CPT / 8; cc++) {
            uint32_t w0 = slot, w1 = lh, w2 = ((uint32_t)side << 31) | (uint32_t)(c0 / 8 + cc), w3 = epoch;
            philox(w0, w1, w2, w3, k0, k1, rounds);
            uint32_t w[4] = {w0, w1, w2, w3};
#pragma unroll
            for (int j = 0; j < 8; j++) r[cc * 8 + j] = (w[j >> 1] >> (16 * (j & 1))) & 0xFFFF;
        }
    }
}

// k^ of this thread's CPT channels: fl(num * (s 2^-(b+1))), bitwise the reference dequant.
__device__ __forceinline__ void dequant(const int8_t *codes, const int32_t (&r)[CPT], float s,
                                        float (&x)[CPT]) {
    int8_t n[CPT];
    if (CPT == 16) {
        *reinterpret_cast<int4 *>(n) = __ldg(reinterpret_cast<const int4 *>(codes));
    } else {
        *reinterpret_cast<int2 *>(n) = __ldg(reinterpret_cast<const int2 *>(codes));
    }
    const float sb = s * (BITS == 8 ? 0x1p-9f : 0x1p-17f);
#pragma unroll
    for (int j = 0; j < CPT; j++) {
        int32_t num = (int32_t)n[j] * (1 << (BITS + 1)) - (2 * r[j] + 1 - (1 << BITS));
        x[j] = __fmul_rn((float)num, sb);
    }
}

__device__ __forceinline__ float exp_acc(float x) {
    return exp2f(__fmaf_rn(x, 1.44269502162933349609375f, x * 1.92596298909109e-08f));
}

// >= expm1(u) for u >= 0 (+inf for +inf): expm1f is within 1 ulp.
__device__ __forceinline__ float expm1_up(float u) {
    return u == INF ? INF : expm1f(u) * 1.0000002384185791f + 1.5e-45f;
}

__device__ __forceinline__ float load_q(const Args &a, int b, int h, int c) {
    const int64_t o = (int64_t)b * a.sq_b + (int64_t)h * a.sq_h + c;
    if (a.q_dtype == 0) return reinterpret_cast<const float *>(a.q)[o];
    const unsigned short bits = reinterpret_cast<const unsigned short *>(a.q)[o];
    if (a.q_dtype == 1) return __half2float(__ushort_as_half(bits));
    return __uint_as_float((uint32_t)bits << 16);
}

__device__ __forceinline__ float round_up_f32(double x) {
    float f = (float)x;
    return (double)f < x ? nextafterf(f, INF) : f;
}

template <int N>
__device__ __forceinline__ float group_sum(float v) {  // over the N consecutive lanes
#pragma unroll
    for (int o = 1; o < N; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

extern "C" __global__ void __launch_bounds__(128) wc_decode_split(Args a) {
    const int pid = blockIdx.x, split = blockIdx.y;
    const int b = pid / a.Hkv, kvh = pid % a.Hkv;
    const int qg = a.Hq / a.Hkv;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int ci = lane % TPT;          // channel slot of this thread
    const int tl = lane / TPT;          // token lane within the warp
    const int gl = warp * LANES + tl;   // token lane within the CTA
    const int c0 = ci * CPT;
    const int NG = HD / a.G;
    const int g = c0 / a.G;             // this thread's scale group
    const int n_tok = a.seq_lens[b];
    int n_splits = a.fixed_splits > 0 ? a.fixed_splits : 1;
    if (a.fixed_splits == 0)
        while (n_splits * a.min_tokens_per_split < n_tok && n_splits < a.max_splits) n_splits *= 2;
    const int per_split = (n_tok + n_splits - 1) / n_splits;
    const int t_lo = split * per_split;
    const int t_hi = min(t_lo + per_split, n_tok);

    __shared__ float s_qn2[QG][16], s_qn1[QG][16];
    __shared__ int s_qbad[QG];
    __shared__ float s_red[NWARPS][QG][8];
    __shared__ float s_acc[NWARPS][QG][HD];

    // ---- the query rows (this thread's channels), norms, flags ---------------------------
    float q[QG][CPT];
#pragma unroll
    for (int h = 0; h < QG; h++) {
        int bad = 0;
        double s2 = 0.0, s1 = 0.0;
#pragma unroll
        for (int j = 0; j < CPT; j++) {
            float x = h < qg ? load_q(a, b, kvh * qg + h, c0 + j) : 0.0f;
            if (!isfinite(x)) { bad = 1; x = 0.0f; }
            q[h][j] = x;
            s2 += (double)x * (double)x;
            s1 += fabs((double)x);
        }
        // complete the group sums over the G / CPT threads of the group (aligned lanes)
        for (int o = 1; o < a.G / CPT; o <<= 1) {
            s2 += __shfl_xor_sync(0xffffffffu, s2, o);
            s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        }
        bad = __any_sync(0xffffffffu, bad);
        if (tid < TPT && (ci % (a.G / CPT)) == 0) {
            s_qn2[h][g] = round_up_f32(sqrt(s2));
            s_qn1[h][g] = round_up_f32(s1);
        }
        if (tid == 0) s_qbad[h] = bad;
    }
    __syncthreads();
    // head of the certificate terms handled by this thread (h = ci, ci + TPT, ...)
    float lf = 0.0f, e_soft = 0.0f;
    const int my_tiles = (t_hi - t_lo + NL * TT - 1) / (NL * TT);
    if (a.cert) {
        if (a.radius_mode != 0) {
            double dl = a.delta ? (double)a.delta[b] : (double)a.delta_scalar;
            lf = round_up_f32(sqrt(2.0 * log(2.0 * (double)n_tok / dl)) * 1.0000000000001);
        }
        // argument roundings of every weight, one exp per weight and per rescale: the tiles
        // of this lane, the lane / warp merges (log2(NL) + 1) and the split merge
        e_soft = 1.0616e-05f + (float)(my_tiles + 10) * 4.76837158203125e-07f;
    }
    const uint32_t lh = ((uint32_t)a.layer << 16) | (uint32_t)kvh;

    float m[QG], l[QG], acc[QG][CPT];
    float ca[QG], cu[QG], cvw[QG];  // certificate accumulators (this thread's heads)
    float cvmax = 0.0f;
#pragma unroll
    for (int h = 0; h < QG; h++) {
        m[h] = -INF; l[h] = 0.0f; ca[h] = 0.0f; cu[h] = 0.0f; cvw[h] = 0.0f;
#pragma unroll
        for (int j = 0; j < CPT; j++) acc[h][j] = 0.0f;
    }

    for (int t0 = t_lo; t0 < t_hi; t0 += NL * TT) {
        float z[TT][QG];
        int64_t rows[TT];
        uint32_t slots[TT], eps[TT];
        bool live[TT], kbad[TT], vbad[TT];
        uint32_t ovf[TT];  // bit h: head h's logit overflowed fp32 (flagged: u = +inf)
        float vwn[TT], vrad[TT];
        // ---- logits --------------------------------------------------------------------
#pragma unroll
        for (int i = 0; i < TT; i++) {
            const int t = t0 + i * NL + gl;
            live[i] = t < t_hi;
            const int tt = live[i] ? t : t_lo;
            const int64_t slot = (int64_t)a.bt[(int64_t)b * a.bt_s0 + tt / a.P] * a.P + tt % a.P;
            slots[i] = (uint32_t)(a.positions ? a.positions[slot] : slot);  // counter word 0
            eps[i] = (uint32_t)a.epochs[slot];
            rows[i] = slot * a.Hkv + kvh;
            const float s = __half2float(a.ks[rows[i] * NG + g]);
            int32_t r[CPT];
            float x[CPT];
            dither_r(slots[i], eps[i], c0, 0, lh, a.key0, a.key1, a.rounds, r);
            dequant(a.kc + rows[i] * HD + c0, r, s, x);
            // a flagged token (any infinite scale) reads 0: checked over all groups below
#pragma unroll
            for (int h = 0; h < QG; h++) {
                float acc_z = 0.0f;
#pragma unroll
                for (int j = 0; j < CPT; j++) acc_z = __fmaf_rn(q[h][j], x[j], acc_z);
                z[i][h] = acc_z;
            }
        }
#pragma unroll
        for (int i = 0; i < TT; i++) {
            int sbad = 0;
            for (int gg = 0; gg < NG; gg++) sbad |= __hisinf(a.ks[rows[i] * NG + gg]) != 0;
            kbad[i] = sbad;
            int vb = 0;
            float w2 = 0.0f, s2 = 0.0f;
            for (int gg = 0; gg < NG; gg++) {
                const float ww = __half2float(a.vw[rows[i] * NG + gg]);
                const float vs = __half2float(a.vs[rows[i] * NG + gg]);
                vb |= isinf(vs) | isinf(ww);
                w2 = __fmaf_rn(ww, ww, w2);
                s2 = __fmaf_rn(vs, vs, s2);
            }
            vbad[i] = vb;
            vwn[i] = vb ? INF : sqrtf(w2) * 1.0000010f;
            vrad[i] = vb ? INF : 127.5f * sqrtf(s2 * (float)a.G) * 1.0000010f + vwn[i];
            ovf[i] = 0u;
#pragma unroll
            for (int h = 0; h < QG; h++) {
                float v = group_sum<TPT>(z[i][h]) * a.sm;
                if (!(fabsf(v) <= 3.4028234e38f)) {  // overflow / NaN: a finite value, flagged
                    ovf[i] |= 1u << h;
                    v = 0.0f;
                }
                z[i][h] = !live[i] ? -INF : (kbad[i] ? 0.0f : v);
            }
        }
        // ---- online softmax (every thread keeps every head's m, l) ----------------------
        float p[TT][QG], alpha[QG];
#pragma unroll
        for (int h = 0; h < QG; h++) {
            float mn = m[h];
#pragma unroll
            for (int i = 0; i < TT; i++) mn = fmaxf(mn, z[i][h]);
            alpha[h] = mn == -INF ? 0.0f : exp_acc(m[h] - mn);
            float ls = 0.0f;
#pragma unroll
            for (int i = 0; i < TT; i++) {
                p[i][h] = live[i] ? exp_acc(z[i][h] - mn) : 0.0f;
                ls += p[i][h];
            }
            l[h] = l[h] * alpha[h] + ls;
            m[h] = mn;
        }
        // ---- certificate terms of this thread's heads ----------------------------------
        if (a.cert) {
#pragma unroll
            for (int h = 0; h < QG; h++) {
                if (h % TPT != ci) continue;  // this head's terms live in the threads ci = h mod TPT
                float add = 0.0f, vwa = 0.0f;
                for (int i = 0; i < TT; i++) {
                    if (!live[i]) continue;
                    float ud = 0.0f, s2 = 0.0f, s1 = 0.0f;
                    for (int gg = 0; gg < NG; gg++) {
                        const float sg = __half2float(a.ks[rows[i] * NG + gg]);
                        const float wg = __half2float(a.kw[rows[i] * NG + gg]);
                        ud = __fmaf_rn(s_qn2[h][gg], isinf(wg) ? 0.0f : wg, ud);
                        const float sf = isinf(sg) ? 0.0f : sg;
                        const float t2 = s_qn2[h][gg] * sf;
                        s2 = __fmaf_rn(t2, t2, s2);
                        s1 = __fmaf_rn(s_qn1[h][gg], sf, s1);
                    }
                    float uq = a.radius_mode == 1 ? INF : ud * a.sm;
                    if (a.radius_mode != 0)
                        uq = fminf(uq, a.sm * sqrtf(s2 / 12.0f) * lf + a.bias_coef * a.sm * s1);
                    float u = uq * 1.0000153f + (a.arith_gamma * 127.5f * a.sm * s1) * 1.0000153f
                              + (a.arith_abs + e_soft);
                    if (kbad[i] || vbad[i] || s_qbad[h] || h >= qg || ((ovf[i] >> h) & 1u) || !(u == u))
                        u = INF;
                    if (p[i][h] > 0.0f) add += p[i][h] * expm1_up(u);
                    cu[h] = fmaxf(cu[h], u);
                    vwa += vbad[i] ? INF : p[i][h] * vwn[i];
                    if (a.radius && h < qg)
                        a.radius[((int64_t)b * a.Hq + kvh * qg + h) * a.rad_n + t0 + i * NL + gl] = u;
                }
                ca[h] = (ca[h] == INF ? INF : ca[h] * alpha[h]) + add;
                cvw[h] = (cvw[h] == INF ? INF : cvw[h] * alpha[h]) + vwa;
            }
            for (int i = 0; i < TT; i++)
                if (live[i]) cvmax = fmaxf(cvmax, vrad[i]);
        }
        if (a.logits && ci == 0)
            for (int i = 0; i < TT; i++)
                if (live[i])
                    for (int h = 0; h < qg; h++)
                        a.logits[((int64_t)b * a.Hq + kvh * qg + h) * a.rad_n + t0 + i * NL + gl] = z[i][h];
        // ---- values --------------------------------------------------------------------
#pragma unroll
        for (int h = 0; h < QG; h++)
#pragma unroll
            for (int j = 0; j < CPT; j++) acc[h][j] *= alpha[h];
#pragma unroll
        for (int i = 0; i < TT; i++) {
            if (!live[i] || vbad[i]) continue;
            const float s = __half2float(a.vs[rows[i] * NG + g]);
            int32_t r[CPT];
            float x[CPT];
            dither_r(slots[i], eps[i], c0, 1, lh, a.key0, a.key1, a.rounds, r);
            dequant(a.vc + rows[i] * HD + c0, r, s, x);
#pragma unroll
            for (int h = 0; h < QG; h++)
#pragma unroll
                for (int j = 0; j < CPT; j++) acc[h][j] = __fmaf_rn(p[i][h], x[j], acc[h][j]);
        }
    }

    // ---- merge the token lanes: within the warp (shuffles), then across warps (smem) ------
#pragma unroll
    for (int h = 0; h < QG; h++) {
        for (int o = TPT; o < 32; o <<= 1) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[h], o);
            const float mn = fmaxf(m[h], mo);
            const float wa = m[h] == -INF ? 0.0f : exp_acc(m[h] - mn);
            const float wb = mo == -INF ? 0.0f : exp_acc(mo - mn);
            l[h] = l[h] * wa + __shfl_xor_sync(0xffffffffu, l[h], o) * wb;
#pragma unroll
            for (int j = 0; j < CPT; j++)
                acc[h][j] = acc[h][j] * wa + __shfl_xor_sync(0xffffffffu, acc[h][j], o) * wb;
            const float ao = __shfl_xor_sync(0xffffffffu, ca[h], o);
            const float vo = __shfl_xor_sync(0xffffffffu, cvw[h], o);
            ca[h] = (ca[h] == INF || ao == INF) ? INF : ca[h] * wa + ao * wb;
            cvw[h] = (cvw[h] == INF || vo == INF) ? INF : cvw[h] * wa + vo * wb;
            cu[h] = fmaxf(cu[h], __shfl_xor_sync(0xffffffffu, cu[h], o));
            m[h] = mn;
        }
    }
    for (int o = 1; o < 32; o <<= 1) cvmax = fmaxf(cvmax, __shfl_xor_sync(0xffffffffu, cvmax, o));
    // lanes tl == 0 hold the warp's state: m, l (all heads), acc (their channels), cert (h = ci)
    if (tl == 0) {
#pragma unroll
        for (int h = 0; h < QG; h++) {
#pragma unroll
            for (int j = 0; j < CPT; j++) s_acc[warp][h][c0 + j] = acc[h][j];
            if (ci == 0) { s_red[warp][h][0] = m[h]; s_red[warp][h][1] = l[h]; }
            if (h % TPT == ci) {
                s_red[warp][h][2] = ca[h]; s_red[warp][h][3] = cvw[h]; s_red[warp][h][4] = cu[h];
            }
        }
        if (ci == 0) s_red[warp][0][5] = cvmax;
    }
    __syncthreads();
    // thread t < QG * HD / ... : each thread finishes some (head, channel) outputs
    for (int idx = tid; idx < qg * HD; idx += blockDim.x) {
        const int h = idx / HD, c = idx % HD;
        float mm = -INF;
        for (int w = 0; w < NWARPS; w++) mm = fmaxf(mm, s_red[w][h][0]);
        float o = 0.0f;
        for (int w = 0; w < NWARPS; w++) {
            const float mw = s_red[w][h][0];
            if (mw != -INF) o += s_acc[w][h][c] * exp_acc(mw - mm);
        }
        const int64_t part = ((int64_t)b * a.Hq + kvh * qg + h) * a.num_splits_grid + split;
        a.pacc[part * HD + c] = o;
    }
    if (tid < qg) {
        const int h = tid;
        float mm = -INF;
        for (int w = 0; w < NWARPS; w++) mm = fmaxf(mm, s_red[w][h][0]);
        float ll = 0.0f, aa = 0.0f, vv = 0.0f, uu = 0.0f, vm = 0.0f;
        for (int w = 0; w < NWARPS; w++) {
            const float mw = s_red[w][h][0];
            const float wt = mw == -INF ? 0.0f : exp_acc(mw - mm);
            ll += s_red[w][h][1] * wt;
            const float aw = s_red[w][h][2], vw2 = s_red[w][h][3];
            aa = (aa == INF || aw == INF) ? INF : aa + (wt > 0.0f ? aw * wt : 0.0f);
            vv = (vv == INF || vw2 == INF) ? INF : vv + (wt > 0.0f ? vw2 * wt : 0.0f);
            uu = fmaxf(uu, s_red[w][h][4]);
            vm = fmaxf(vm, s_red[w][0][5]);
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
    wc_decode_split<<<dim3(grid_x, grid_y), 128, 0, stream>>>(*a);
    return (int)cudaGetLastError();
}
