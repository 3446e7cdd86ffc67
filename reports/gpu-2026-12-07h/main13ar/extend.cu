// Extend over the compressed prefix: CUDA C++ tensor-core kernel (mma.sync) of the prefix phase
// of witcert.kernels.extend (spec: witcert.ref.extend.extend_attention_cert; docs/PROOFS.md 5.4,
// 5.5). The exact new tokens (the causal phase) stay in the Triton kernel, which starts from the
// state this kernel leaves (running max, sum, certificate sum, largest radius, output).
//
// Two kernels, one launch. The staging pass (wc_extend_stage: one CTA per (TN-token prefix tile,
// KV head)) dequantizes every prefix tile once per KV head into a workspace of the call: the keys
// in code units as fp16 values with their rests' norms (below), the values over the tile's power
// of two r_T in fp16, the tokens' group scales, flags and the radius's token entries (ws_bytes
// below). The
// prefix kernel (wc_extend_prefix) is built like a prefill kernel: one CTA of NW warps per (block
// of new tokens, KV head); its rows are (new token, query head) with the head fastest (QGP heads
// per token, padded heads dead), 16 rows per warp: the M side of the tensor-core dots.
// Each staged tile lands in shared memory by
// one bulk copy (cp.async.bulk, compute capability 9.0), the next tile in flight while the current
// one computes (two buffers, their arrival and release counted on mbarriers, so the warps of a CTA
// meet at no barrier in the tile loop), so no CTA regenerates a dither word or dequantizes a value:
// every new-token block reads the same staged bytes.
//
// q.k on fp16 tensor cores by keys in code units (PROOFS 5.4, "the CUDA extend's fp16 keys"): the
// reference's dequantized key is k^ = s_g v, v = N 2^-(b+1) (N the exact odd numerator of the code
// and its dither, |v| <= 128.5); the staging pass writes v rounded to fp16 (hi), the norm of its rest
// per scale group (L_g = ||v_g - hi_g||_2, times s_g, rounded up: a token entry of the radius's sums)
// and the token's scales s_g; the query rows are scaled by one power of two 2^e per row and rounded
// to fp16 (q_h; fp16 and bf16 queries exactly, barring fp16's subnormal range). A = the 16 rows'
// q_h (ldmatrix from shared memory), B = 32 channels x 8 tokens of hi (one ldmatrix; core
// matrices: no bank conflicts), C = fp32, one accumulator per chain of 32 channels (32 products;
// a chain lies in one scale group). The logit is (sum_j s_j C_j) 2^e sm: four multiply-adds and
// one product a (row, token). What the key's rounding to fp16 can move a logit is at most sm
// ||q_g||_2 s_g L_g per group (Cauchy-Schwarz), and what the accumulation (the signed model of
// PROOFS 5.4), the combination and the query's rounding to fp16 can move it is W_g s_g, W_g the
// row's slack weight (q_row_h): both ride in the radius's tensor-core sums.
// p.v (fp16): the tile's values dequantized exactly in fp32, divided by the power of two r_T that
// bounds the tile's values and rounded to fp16 (by the staging pass); A = the weights in fp16
// (from the logits' registers) times r_T / r, r the largest r_T so far (an exact power of two
// scaling in fp32, then one rounding to fp16), B = the values by ldmatrix.trans, C = fp32 in
// units of r. The output's float tier is fp16 SDPA's (the Triton extend's); it does not enter the
// certificate.
// Certificate per (row, token): the decode kernel's radius (deterministic / probabilistic /
// min, plus the arithmetic slack and e_soft, the softmax's logit-equivalent error counted by
// the caller over every tile this row's weights go through), its sums on tf32 tensor cores and
// no test per token (PROOFS 5.4, "the extend's radius without per-token tests"), a += p
// expm1_up_poly(u) (common.cuh: no MUFU op), a tile redone by the exp route (expm1_up_exp) where
// one of its radii is above 1.
#include "common.cuh"

#ifndef WC_TN
#define WC_TN 32
#endif
#ifndef WC_NW
#define WC_NW 4
#endif
constexpr int NW = WC_NW;             // warps per CTA: 4 or 8
constexpr int ROWS = NW * 16;         // rows (new token, query head) per CTA
constexpr int TPB = ROWS / QGP;       // new tokens per CTA
constexpr int TN = WC_TN;             // prefix tokens per tile
constexpr int NT = TN / 8;            // q.k n-tiles of 8 tokens
constexpr int KC = TN / 16;           // p.v k-chunks of 16 tokens
constexpr int CPT = HD / CPC;         // Philox calls per (token, side)
constexpr int KPL = 2;                // byte planes of the staged keys: hi of channels 0-63, then of 64-127
constexpr int NCH = HD / 32;          // q.k accumulator chains of 32 channels (each in one scale group)
constexpr int NH = TN / 16;           // halves of 16 tokens per tile (the key planes' layout, below)
constexpr int SNT = 128;              // threads of the staging pass
constexpr int VPT = TN * CPT / SNT;   // its V-side Philox calls per thread
static_assert(TN % 16 == 0 && (TN * CPT) % SNT == 0 && TN <= SNT && (NW == 4 || NW == 8), "tile");

struct ExtArgs {
    const void *q;                    // [T, Hq, D] (q_dtype: 0 fp32, 1 fp16, 2 bf16), channel stride 1
    const int8_t *kc, *vc;            // codes [slots, Hkv, D]
    const __half *ks, *vs, *kw, *vw;  // scales / witnesses [slots, Hkv, NG]
    const int64_t *epochs;            // [slots]
    const int64_t *positions;         // [slots]: the counter's first word (position-keyed dither), or null
    const int64_t *prefix_slots;      // [Np]
    const float *delta;               // [T] (each new token's budget, rounded down) or null -> delta_scalar
    float *om, *ol, *oa, *ou;         // [T, Hq]: running max, sum, certificate sum, largest radius
    float *oacc;                      // [T, Hq, D]: sum of weights x values (absolute units)
    float *logits, *radius;           // [T, Hq, rad_n] (the prefix's columns) or null
    int64_t sq_t, sq_h, rad_n;
    float sm, delta_scalar, bias_coef, arith_gamma, arith_abs, e_soft;
    uint32_t key0, key1;
    int32_t q_dtype, T, Np, Hq, Hkv, layer, cert, radius_mode;  // radius: 0 det 1 prob 2 min
    unsigned char *work;  // the staged tiles: wc_extend_workspace_bytes(Np, Hkv) bytes, 16-byte aligned
    // A prefix in chunks (fields after `work`: an earlier extend.cu reads the ones before): this call
    // stages and attends the chunk's Np tokens (prefix_slots: the chunk's), tokens tile0 TN ... of the
    // np_all of the whole prefix; carry_mode bit 1: start from the state in `carry` (the previous
    // chunk's), bit 2: leave the state there (not the last chunk) instead of the outputs. The state
    // is every thread's registers as they are between tiles, so the chunks compute bitwise what one
    // call over the whole prefix computes (wc_extend_carry_floats per CTA thread).
    float *carry;
    int32_t tile0, np_all, carry_mode;
    // The prefix split across CTAs (fields after `carry_mode`): grid z = n_splits (>= 1); split z
    // attends tiles z st .. z st + st - 1 of the whole prefix (np_all tokens), st = ceil(its
    // tiles / n_splits), those of them this call (chunk) stages (maybe none), and leaves its own
    // state: the outputs om .. oacc hold n_splits blocks ([n_splits, T, Hq], [n_splits, T, Hq, D])
    // that the Triton kernel merges (PROOFS 5.4, "prefix splits"). So each split attends the same
    // tiles in the same order however the prefix is chunked: chunks stay bitwise one pass.
    int32_t n_splits;
};

// The workspace: per (KV head, prefix tile) WS bytes, as the prefix kernel's shared memory holds
// them: the keys in fp16 (KPL TN HD bytes in core matrices, key_offset), the values over r_T
// (TN HD fp16 in core matrices, value_offset), then the records (floats): the tokens' chain scales
// [NCH][TN] (chain j's scale s_g, g its group; 0 for a flagged key, a non-finite scale or past Np;
// in scale_offset's order), the logits' addends [TN] (0 live, -inf past Np), r_T, the tile's largest
// |s_j| (S_T), padding to 16 bytes, and the tokens' columns of the radius's tensor-core sums (B
// operands: common.cuh tc_token_entries_lo, tc_flag_entries for a flagged token, 0 past the groups):
// [3][4][BST] floats,
// sum q's entry k = t + 4 h of token tk at (4 q + t) BST + 2 tk + h, so a lane's two B values are one
// 8-byte load and the 16 lanes of a load phase hit distinct banks.
constexpr int WSK = KPL * TN * HD;
// The keys' bytes in core matrices of 8 rows x 16 bytes (128 contiguous bytes: each of ldmatrix's
// 8 x 8 matrices, read without bank conflicts and without padding, so a tile is copied as one
// contiguous block). Byte plane h holds hi of channels 64 h .. 64 h + 63 (2 bytes each); chunk c =
// bytes 16 c .. 16 c + 15 of every plane row, then row groups of
// 8 rows, the rows of a half of 16 tokens being plane 0's 16 tokens, plane 1's, ... (the layout a
// K-major operand of Hopper's wgmma reads without swizzling).
constexpr int KRG = 2 * KPL;                       // row groups (8 rows) per half
constexpr int KLBO = NH * KRG * 128;               // bytes between chunks (the K direction)
__host__ __device__ constexpr int key_offset(int p, int tk, int ch) {  // byte plane p, token tk, byte ch of its row
    return (ch / 16) * KLBO + ((tk / 16) * KRG + 2 * p + (tk % 16) / 8) * 128 + (tk % 8) * 16 + ch % 16;
}
// The staging pass's store and the tile loop's ldmatrix row, each in one place (wc_extend_key_layout_errors
// checks on the host that they meet): the 16-byte row holding channels ch .. ch + 7 (ch % 8 == 0) of
// token tk; and lane's row address for chain j (channels 32 j ..), n-tile nt, as the tile loop forms it
// (a chain's chunks, the n-tile's tokens and the lane's row add up: key_offset is linear in each
// within a plane): matrix lane / 8 is channels 32 j + 8 (lane / 8) .. of tokens 8 nt + lane % 8.
__host__ __device__ constexpr int key_store_offset(int tk, int ch) { return key_offset(ch / 64, tk, 2 * (ch % 64)); }
__host__ __device__ constexpr int key_lane_offset(int lane) { return key_offset(0, lane & 7, 16 * (lane >> 3)); }
__host__ __device__ constexpr int key_chain_offset(int j, int nt) {
    return key_offset(j / 2, 0, 64 * (j % 2)) + key_offset(0, 8 * nt, 0);
}
constexpr int WSV = TN * HD * 2;
// The values (fp16) in core matrices too: 8 channels (16 bytes) of 8 tokens, 128 contiguous bytes,
// chunk of 8 channels major: the 8 x 8 matrices ldmatrix.trans reads, without bank conflicts
__host__ __device__ constexpr int value_offset(int tk, int ch) { return (ch / 8) * (TN * 8) + tk * 8 + ch % 8; }
constexpr int R_S = 0;                  // the chain scales' index in the records
// A token's place in a chain's row of scales: the four a lane reads of n-tiles 2 m and 2 m + 1 (tokens
// 8 nt + 2 t and + 1) adjacent, one 16-byte load (tile loop: scale_lane_offset; checked against the
// staging pass's store on the host, wc_extend_key_layout_errors)
__host__ __device__ constexpr int scale_offset(int tk) {
    return (tk / 16) * 16 + (tk % 8 / 2) * 4 + (tk / 8 % 2) * 2 + tk % 2;
}
__host__ __device__ constexpr int scale_lane_offset(int nt2, int t) { return 16 * nt2 + 4 * t; }  // n-tiles 2 nt2, + 1
constexpr int R_A = NCH * TN;           // the logits' addends'
constexpr int R_T = R_A + TN;           // r_T's
constexpr int R_SM = R_T + 1;           // the tile's largest chain scale |s| (the overflow test's)
constexpr int R_B = (R_T + 4) & ~3;     // the B operands'
constexpr int BST = 2 * TN + 8;         // floats per (sum, t) row of the B operands
constexpr int WSR = (R_B + 12 * BST) * 4;
constexpr int WS = WSK + WSV + WSR;
static_assert(WS % 16 == 0 && WSR % 16 == 0 && 2 * NG <= 8, "16-byte copies; k8 sums");

// the shared memory of the prefix kernel: two staged tiles (each the workspace's tile byte for byte:
// one bulk copy), and the query rows in fp16 (read by ldmatrix at every use rather than held in 32
// registers per thread)
constexpr int KBYTES = WSK;
constexpr int VBYTES = WSV;
constexpr int SBYTES = KBYTES + VBYTES + WSR;  // one staged tile
static_assert(SBYTES == WS, "a staged tile is the workspace's tile");
constexpr int QROW = 2 * HD + 16;    // bytes per staged query row: A fragments by ldmatrix free of bank conflicts
constexpr int QBYTES = ROWS * QROW;
constexpr int BUF = 2 * SBYTES + QBYTES;

// mbarriers (shared-memory addresses) and the bulk copy (one thread, the bytes counted on an mbarrier)
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {  // until phase `parity` completes
    uint32_t ok = 0;
    while (!ok)
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                     : "=r"(ok) : "r"(bar), "r"(parity) : "memory");
}
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void *src, uint32_t bytes, uint32_t bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}

// a shared-memory float4 read where it is used (volatile: not hoisted out of the tile loop, where
// the rows' constants would hold 56 registers for the whole kernel)
__device__ __forceinline__ float4 lds_f4(const float4 *p) {
    float4 r;
    asm volatile("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];" : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w)
                 : "r"((uint32_t)__cvta_generic_to_shared(p)));
    return r;
}

// ---- q.k by fp16 keys in code units (PROOFS 5.4, "the CUDA extend's fp16 keys") ---------------
// The fp16 key of v = N 2^-(b+1) (N = n 2^(b+1) - 2 r + 2^b - 1, |N| < 2^25): hi = v rounded to fp16
// (through fp32, exact where |N| <= 2^24; |hi| <= 128.5), and its rest v - hi as an exact integer
// over 2^(b+1) (hi is a multiple of 2^-(b+1)), at most 2^(b-3) in magnitude (f16keys.key_hi).
__device__ __forceinline__ __half key_hi(int num, int &rest) {
    constexpr float UNIT = 1.0f / (float)(1 << (BITS + 1));
    const __half hi = __float2half_rn((float)num * UNIT);
    rest = num - (int)(__half2float(hi) * (float)(1 << (BITS + 1)));
    return hi;
}

// The row's exponent e of its fp16 rows q_h = fp16(q 2^-e): the largest finite |q| in [2^14, 2^15)
// after the scaling, moved where needed so that the row factor 2^e sm is a finite normal fp32
// number (exact; only an extreme sm moves it: a lower e saturates entries at 65504, whose rest joins
// the residual, a higher one leaves more of q to it).
__device__ __forceinline__ int row_exponent_h(float amax, float sm) {
    const int sm_e = ((__float_as_int(sm) >> 23) & 0xFF) - 127;
    const int e_lo = max(-125, -126 - sm_e), e_hi = min(125, 126 - sm_e);
    return min(max(((__float_as_int(amax) >> 23) & 0xFF) - 127 - 14, e_lo), e_hi);
}

// One (query row, scale group) in fp16 by one warp: lane l holds channels 32 m + l (m < KPG) of the
// group in qv (raw: a non-finite entry reads 0 and sets bad); q_h of channel 32 m + l is written to
// qh[32 m + l]. crt = (||q_g||_2, ||q_g||_1 (both rounded up), the slack weight W_g, 0): W_g = sm
// (c_acc 2^e ||q_h,g||_1 + 128.5 R_g + 2^(e-126) 130 G / 32) rounded up, R_g = ||q_g - 2^e q_h,g||_1
// (the query's rounding), c_acc the route's coefficient (the launcher's arith_gamma: the
// accumulation and the combination, per unit of |q_h| 2^e; PROOFS 5.4), the last term the chains'
// flushes below fp32's normal range. The result is the same on every lane.
__device__ __forceinline__ QRow q_row_h(float (&qv)[KPG], __half *qh, float sm, float c_acc, int lane, int e) {
    int bad = 0;
#pragma unroll
    for (int m = 0; m < KPG; m++)
        if (!isfinite(qv[m])) { bad = 1; qv[m] = 0.0f; }
    bad = __any_sync(FULL, bad);
    const int e1 = e >> 1, e2 = e - e1;
    const double sc = pow2d(e);
    double res = 0.0, dab = 0.0, s2 = 0.0, s1 = 0.0;
#pragma unroll
    for (int m = 0; m < KPG; m++) {
        const float y = (qv[m] * pow2f(-e1)) * pow2f(-e2);
        const __half h = __float2half_rn(fminf(fmaxf(y, -65504.0f), 65504.0f));
        qh[32 * m + lane] = h;
        const double rec = (double)__half2float(h) * sc;
        res += fabs((double)qv[m] - rec);
        dab += fabs(rec);
        s2 += (double)qv[m] * (double)qv[m];
        s1 += fabs((double)qv[m]);
    }
    warp_sum4(res, dab, s2, s1);
    const double w = ((double)c_acc * dab + 128.5 * res + pow2d(e - 126) * (130.0 * KPG)) * (double)sm;
    QRow out;
    out.comb = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    out.crt = make_float4(round_up_f32(sqrt(s2)), round_up_f32(s1), round_up_f32(w * 1.00000095367431640625), 0.0f);
    out.bad = bad;
    return out;
}

// ---- The staging pass: one CTA of SNT threads per (prefix tile, KV head) ---------------------
// Writes the tile's WS bytes (above). The keys: each channel's v = N 2^-(b+1) (N = n 2^(b+1) - 2 r +
// 2^b - 1 the reference's exact numerator; k^ = s_g v) in fp16, hi (key_hi), in their planes
// (key_offset), and per (token, group) the norm of the rests L_g = ||v_g - hi_g||_2 (the rests' squares
// summed exactly in float64 over the group's lanes, one IEEE root); the tokens' chain scales s_g (0
// for a flagged key or a non-finite scale, so that its logits are exactly 0) and the radius's token
// entries (tc_token_entries_lo with s_g L_g rounded up, or tc_flag_entries). The values: (n 2^(b+1)
// - 2 r + 2^b - 1) s 2^-(b+1), exact in fp32 (the reference's bits), 0 when flagged, over r_T (the
// power of two above the tile's largest |value|, at most 2^126) rounded to fp16. A token past Np
// reads the tile's first slot and is dead.
// The CPC int8 codes of one Philox call's channels (16 or 8 bytes, aligned) as CPC / 4 words, one load
__device__ __forceinline__ void load_codes(const int8_t *p, uint32_t (&cw)[CPC / 4]) {
    if constexpr (CPC == 16) {
        const uint4 x = __ldg(reinterpret_cast<const uint4 *>(p));
        cw[0] = x.x; cw[1] = x.y; cw[2] = x.z; cw[3] = x.w;
    } else {
        const uint2 x = __ldg(reinterpret_cast<const uint2 *>(p));
        cw[0] = x.x; cw[1] = x.y;
    }
}

__global__ void __launch_bounds__(SNT) wc_extend_stage(ExtArgs a) {
    const int tile = blockIdx.x, kvh = blockIdx.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int start = tile * TN;
    unsigned char *const w = a.work + ((int64_t)kvh * gridDim.x + tile) * WS;
    int8_t *const wk = reinterpret_cast<int8_t *>(w);
    __half *const wv = reinterpret_cast<__half *>(w + WSK);
    float *const wr = reinterpret_cast<float *>(w + WSK + WSV);
    __shared__ uint32_t s_w0[TN], s_ep[TN];
    __shared__ int64_t s_row[TN];
    __shared__ float s_vs[TN][NG];
    __shared__ int s_vb[TN], s_flag[TN];
    __shared__ float s_kw[TN][NG], s_ks[TN][NG];
    __shared__ double s_lo[TN][NG];
    __shared__ float s_red[SNT / 32], s_smx[TN];
    const uint32_t lh = ((uint32_t)a.layer << 16) | (uint32_t)kvh;

    if (tid < TN) {  // the token's slot, counter words, scales, witnesses and flags
        const int tk = start + tid;
        const bool live = tk < a.Np;
        const int64_t slot = a.prefix_slots[live ? tk : start];
        const int64_t row = slot * a.Hkv + kvh;
        s_row[tid] = row;
        s_w0[tid] = (uint32_t)(a.positions ? a.positions[slot] : slot);
        s_ep[tid] = (uint32_t)a.epochs[slot];
        float ksc[NG], kwt[NG], vsc[NG], vwt[NG];
        load_groups(a.ks, (uint32_t)row, ksc);
        load_groups(a.kw, (uint32_t)row, kwt);
        load_groups(a.vs, (uint32_t)row, vsc);
        load_groups(a.vw, (uint32_t)row, vwt);
        bool kb = false, vb = false;  // a flagged key (an infinite scale, a non-finite witness: the reference's
                                      // kbad) or value (an infinite scale or witness)
#pragma unroll
        for (int grp = 0; grp < NG; grp++) kb |= isinf(ksc[grp]) | !isfinite(kwt[grp]);
#pragma unroll
        for (int grp = 0; grp < NG; grp++) vb |= isinf(vsc[grp]) | isinf(vwt[grp]);
        const bool flag = kb || vb;
        float smx = 0.0f;  // the token's largest |s_j|
#pragma unroll
        for (int j = 0; j < NCH; j++) {  // chain j's scale: its group's, 0 for a flagged key or a non-finite scale
            const float sg = ksc[(32 * j) / G], sj = (kb || !isfinite(sg) || !live) ? 0.0f : sg;
            wr[R_S + TN * j + scale_offset(tid)] = sj;
            smx = fmaxf(smx, fabsf(sj));
        }
        s_smx[tid] = smx;
#pragma unroll
        for (int grp = 0; grp < NG; grp++) {  // a NaN scale reads 0 (the reference's scale of a non-finite group)
            s_vs[tid][grp] = vsc[grp];
            s_kw[tid][grp] = kwt[grp];
            s_ks[tid][grp] = isfinite(ksc[grp]) ? ksc[grp] : 0.0f;
        }
        s_flag[tid] = flag;
        wr[R_A + tid] = live ? 0.0f : -INF;  // a token past Np: its entries are slot `start`'s (a live token's)
        s_vb[tid] = vb;
    }
    __syncthreads();
    if (warp == 0) {  // the tile's largest chain scale (exact: a max), for the prefix kernel's overflow test
        float m = 0.0f;
        for (int i = lane; i < TN; i += 32) m = fmaxf(m, s_smx[i]);
        for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(FULL, m, o));
        if (lane == 0) wr[R_SM] = m;
    }
    constexpr int LPG = G / CPC;  // lanes a group's steps take (adjacent: CPT divides 32)
    static_assert(G % CPC == 0 && 32 % CPT == 0, "a group's steps in adjacent lanes");
    // the keys: CPC channels of one group per step (every thread in every pass: the group's shuffles)
    for (int i = tid; i < TN * CPT; i += SNT) {
        const int tk = i / CPT, c = i % CPT;
        const uint4 u = philox(s_w0[tk], lh, (uint32_t)c, s_ep[tk], a.key0, a.key1);
        uint32_t cw[CPC / 4];
        load_codes(a.kc + s_row[tk] * HD + CPC * c, cw);
        uint32_t hw[CPC / 2];  // channels 2 w, 2 w + 1 of the step
        int ss = 0;            // the rests' squares (each at most 2^(2b-6): below 2^31 over 16 channels)
#pragma unroll
        for (int w = 0; w < CPC / 2; w++) {
            uint32_t hp = 0u;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int j = 2 * w + h;
                const int n = (int)(int8_t)((cw[j / 4] >> (8 * (j % 4))) & 0xFF);
                int rest;
                const __half hi = key_hi(n * (1 << (BITS + 1)) - 2 * dither_field(u, j) + ((1 << BITS) - 1), rest);
                hp |= (uint32_t)__half_as_ushort(hi) << (16 * h);
                ss += rest * rest;
            }
            hw[w] = hp;
        }
        const int ch = CPC * c;  // its 16-byte rows: key_store_offset
#pragma unroll
        for (int q4 = 0; q4 < CPC / 8; q4++)
            *reinterpret_cast<uint4 *>(wk + key_store_offset(tk, ch + 8 * q4)) =
                make_uint4(hw[4 * q4], hw[4 * q4 + 1], hw[4 * q4 + 2], hw[4 * q4 + 3]);
        double gs = (double)ss;  // the group's sum over its LPG lanes (exact: below 2^53)
#pragma unroll
        for (int o = 1; o < LPG; o <<= 1) gs += __shfl_xor_sync(FULL, gs, o);
        if (c % LPG == 0) s_lo[tk][c / LPG] = sqrt(gs) * (1.0 / (double)(1 << (BITS + 1)));  // L_g (IEEE root)
    }
    __syncthreads();
    if (tid < TN) {  // the radius's token entries k = grp, grp + 4 (0 past the groups)
        const bool flag = s_flag[tid] != 0;
#pragma unroll
        for (int grp = 0; grp < 4; grp++) {
            float e[3][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}};
            if (grp < NG) {
                if (flag) {  // x and y +inf whatever the row (tc_flag_entries): the radius +inf
                    tc_flag_entries(e);
                } else {  // s_g L_g rounded up to a tf32 value (0 stays 0: w is then x's entry as it is)
                    const float sg = s_ks[tid][grp];
                    const double sl = (double)sg * s_lo[tid][grp];
                    tc_token_entries_lo(s_kw[tid][grp], sg, sl > 0.0 ? tf32_up(round_up_f32(sl)) : 0.0f, e);
                }
            }
#pragma unroll
            for (int q = 0; q < 3; q++)
#pragma unroll
                for (int h = 0; h < 2; h++) wr[R_B + (4 * q + grp) * BST + 2 * tid + h] = e[q][h];
        }
    }
    float vx[VPT][CPC];
    float vmax = 0.0f;
#pragma unroll
    for (int q = 0; q < VPT; q++) {  // the values, exact in fp32
        const int i = tid + q * SNT;
        const int tk = i / CPT, c = i % CPT;
        const uint4 u = philox(s_w0[tk], lh, (1u << 31) | (uint32_t)c, s_ep[tk], a.key0, a.key1);
        uint32_t cw[CPC / 4];
        load_codes(a.vc + s_row[tk] * HD + CPC * c, cw);
        const float sc = s_vs[tk][(CPC * c) / G] * (1.0f / ROWF);
        const bool vb = s_vb[tk] != 0;
#pragma unroll
        for (int j = 0; j < CPC; j++) {
            const int n = (int)(int8_t)((cw[j / 4] >> (8 * (j % 4))) & 0xFF);
            const int r = dither_field(u, j);
            const int num = n * (1 << (BITS + 1)) - 2 * r + ((1 << BITS) - 1);
            const float x = vb ? 0.0f : (float)num * sc;
            vx[q][j] = x;
            vmax = fmaxf(vmax, fabsf(x));
        }
    }
    for (int o = 16; o; o >>= 1) vmax = fmaxf(vmax, __shfl_xor_sync(FULL, vmax, o));
    if (lane == 0) s_red[warp] = vmax;
    __syncthreads();
#pragma unroll
    for (int w2 = 0; w2 < SNT / 32; w2++) vmax = fmaxf(vmax, s_red[w2]);
    const float r_t = pow2f(min(((__float_as_int(vmax) >> 23) & 0xFF) - 126, 126)), inv = 1.0f / r_t;  // exact
#pragma unroll
    for (int q = 0; q < VPT; q++) {
        const int i = tid + q * SNT;
        const int tk = i / CPT, c = i % CPT;
#pragma unroll
        for (int j = 0; j < CPC; j += 2)
            *reinterpret_cast<__half2 *>(wv + value_offset(tk, CPC * c + j)) = __floats2half2_rn(vx[q][j] * inv, vx[q][j + 1] * inv);
    }
    if (tid == 0) wr[R_T] = r_t;
}

#ifdef WC_MAXREG  // a register cap per thread, as resident CTAs per SM for __launch_bounds__
constexpr int MINB = 65536 / (NW * 32 * WC_MAXREG);
#else
constexpr int MINB = 1;
#endif

// OUTS: the per-(row, token) logits / radii outputs may be asked for (tests, audits); the launch picks
// the instance without them when neither is, so the tile loop carries no branch for them. RM: the
// radius mode (ExtArgs.radius_mode: 0 det, 1 prob, 2 min), so the loop forms only the sums it uses.
template <bool OUTS, int RM>
__global__ void __launch_bounds__(NW * 32, MINB) wc_extend_prefix(ExtArgs a) {
    const int kvh = blockIdx.y, t_base = blockIdx.x * TPB;
    const int qg = a.Hq / a.Hkv;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;

    extern __shared__ __align__(16) unsigned char s_buf[];  // BUF bytes: [2][SBYTES] staged tiles, the rows in fp16
    unsigned char *const s_qh = s_buf + 2 * SBYTES;  // [ROWS][QROW]: row r's q_h at r QROW (fp16, HD of them)
    __shared__ float4 s_crt[ROWS][NG];
    __shared__ float s_rowf[ROWS];  // the rows' factor 2^e sm
    __shared__ int s_rbad[ROWS][NG];
    __shared__ float4 s_afr[NW * 32][3];  // this lane's A fragments of the radius's sums x, y, s2

    // ---- tile `tile` of the workspace into buffer tile % 2: one bulk copy (the staged tile is the
    // shared-memory tile, byte for byte), issued by thread 0, its landing counted on full[tile % 2];
    // each warp releases a buffer on empty[] when it is done with its tile ----------------------
    const int ntiles_all = (a.Np + TN - 1) / TN;  // this call's tiles (all splits): from a.tile0
    const int st = ((a.np_all + TN - 1) / TN + a.n_splits - 1) / a.n_splits;  // tiles per split
    const int t_lo = max((int)blockIdx.z * st, a.tile0), t_hi = min((int)blockIdx.z * st + st, a.tile0 + ntiles_all);
    const int t_first = t_lo - a.tile0, ntiles = max(0, t_hi - t_lo);  // this split's tiles of this call
    const unsigned char *const wbase = a.work + ((int64_t)kvh * ntiles_all + t_first) * WS;  // t_first >= 0: t_lo >= tile0
    const uint32_t sbase = (uint32_t)__cvta_generic_to_shared(s_buf);
    __shared__ __align__(8) uint64_t s_bar[4];  // full[0], full[1], empty[0], empty[1]
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(s_bar);
    if (tid == 0) {
        mbar_init(bar0, 1);
        mbar_init(bar0 + 8, 1);
        mbar_init(bar0 + 16, NW);
        mbar_init(bar0 + 24, NW);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    auto stage_in = [&](int tile) {  // thread 0
        if (tile < ntiles) {
            const int b = tile & 1;
            if (tile >= 2) mbar_wait(bar0 + 16 + 8 * b, ((tile >> 1) - 1) & 1);  // tile - 2's readers are done
            mbar_expect_tx(bar0 + 8 * b, (uint32_t)WS);
            bulk_copy(sbase + (uint32_t)(b * SBYTES), wbase + (int64_t)tile * WS, (uint32_t)WS, bar0 + 8 * b);
        }
    };
    if (tid == 0) stage_in(0);  // in flight while the query rows are split

    // ---- the query rows, a warp's rows one after another: each row's elements in registers (the
    // next row's loads in flight while this one is scaled), one exponent per row, then each group's
    // fp16 entries and constants (q_row_h) ----------------------------------------------------------
    constexpr int QPL = HD / 32;  // a lane's elements of a row: channels 32 m + lane
    auto load_row = [&](int r, float (&x)[QPL]) {  // 0 past the rows, the new tokens or the group's heads
        const int tok = t_base + r / QGP, hh = r % QGP;
        load_q_elems(a.q, a.q_dtype, (int64_t)tok * a.sq_t + (int64_t)(kvh * qg + hh) * a.sq_h + lane, 32,
                     r < ROWS && tok < a.T && hh < qg, x);
    };
    float qn[QPL];
    load_row(warp, qn);
    for (int r = warp; r < ROWS; r += NW) {
        float qr[QPL];
#pragma unroll
        for (int m = 0; m < QPL; m++) qr[m] = qn[m];
        load_row(r + NW, qn);
        float amax = 0.0f;
#pragma unroll
        for (int m = 0; m < QPL; m++) amax = fmaxf(amax, isfinite(qr[m]) ? fabsf(qr[m]) : 0.0f);
        for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(FULL, amax, o));
        const int erow = row_exponent_h(amax, a.sm);
#pragma unroll
        for (int grp = 0; grp < NG; grp++) {  // unrolled: the groups' reductions interleave
            float qv[KPG];
#pragma unroll
            for (int m = 0; m < KPG; m++) qv[m] = qr[grp * KPG + m];
            __half *const qh = reinterpret_cast<__half *>(s_qh + r * QROW) + grp * G;
            const QRow o = q_row_h(qv, qh, a.sm, a.arith_gamma, lane, erow);
            if (lane == 0) {
                s_crt[r][grp] = o.crt;
                s_rbad[r][grp] = o.bad;
            }
        }
        if (lane == 0) s_rowf[r] = (a.sm * pow2f(erow >> 1)) * pow2f(erow - (erow >> 1));  // exact: 2^e sm normal
    }
    __syncthreads();

    // ---- per-lane rows rA = 16 warp + g, rB = rA + 8: flags, lf ------------------------------
    const int rA = 16 * warp + g, rB = rA + 8;
    // this lane's ldmatrix row of the warp's A fragments (matrices: rows rA / rB x channels 0-7 /
    // 8-15 of a k-step of 16 channels), k-step ks at + 32 ks
    const uint32_t qh_lane = (uint32_t)__cvta_generic_to_shared(
        s_qh + (16 * warp + (lane & 7) + 8 * ((lane >> 3) & 1)) * QROW + 16 * (lane >> 4));
    // this lane's ldmatrix row of the keys' B fragments (matrices of 8 tokens x 8 channels): x4 the
    // channels 0-7, 8-15, 16-23, 24-31 of a chain (chunks 0-3 of its plane's rows)
    const uint32_t kl = (uint32_t)key_lane_offset(lane);
    int rtok[2], rhead[2];
    bool rlive[2], qbad[2];
    float lf[2] = {0.0f, 0.0f}, rowf[2], rtail[2];
#pragma unroll
    for (int x = 0; x < 2; x++) {
        const int r = x ? rB : rA;
        rowf[x] = s_rowf[r];
        const int tok = t_base + r / QGP, hh = r % QGP;
        rtok[x] = tok;
        rhead[x] = kvh * qg + (hh < qg ? hh : 0);
        rlive[x] = tok < a.T && hh < qg;
        int bad = 0;
#pragma unroll
        for (int grp = 0; grp < NG; grp++) bad |= s_rbad[r][grp];
        qbad[x] = bad != 0;
        // the radii's tail: the floor and the softmax's allowance, plus what the combination's roundings
        // below fp32's normal range can move a logit (5 of 2^-150 before the factor: 2^-147 rowf), plus
        // sqrt_up's floor (the root is sqrt.approx alone: tc_radius_m); +inf for a non-finite query entry
        // (every radius of the row +inf)
        const float sub = __fmul_ru(rowf[x], 5.605193857299268e-45f);
        rtail[x] = qbad[x] ? INF : __fadd_ru(__fadd_ru(a.arith_abs + a.e_soft, sub), SQRT_FLOOR);
        if (a.cert && RM != 0) {
            const double dl = a.delta ? (double)a.delta[rlive[x] ? tok : 0] : (double)a.delta_scalar;
            const double n = a.np_all > 1 ? (double)a.np_all : 1.0;  // the whole prefix's tokens
            lf[x] = round_up_f32(sqrt(2.0 * log(2.0 * n / dl)) * 1.0000000000001);
        }
    }
    {  // the rows' entries of the radius's sums (A: common.cuh tc_row_entries_up, group t, k = t and t + 4)
        float av[3][4];  // sum q, fragment slot 2 h + x: row x ? rB : rA, k = t + 4 h
#pragma unroll
        for (int x = 0; x < 2; x++) {
            float e[3][2];
            tc_row_entries_up(t, s_crt[x ? rB : rA][t < NG ? t : 0], a.sm, a.bias_coef, lf[x], e);
#pragma unroll
            for (int q = 0; q < 3; q++) {
                av[q][x] = e[q][0];
                av[q][2 + x] = e[q][1];
            }
        }
#pragma unroll
        for (int q = 0; q < 3; q++) s_afr[tid][q] = make_float4(av[q][0], av[q][1], av[q][2], av[q][3]);
    }
    __syncthreads();

    float m_[2] = {-INF, -INF}, l_[2] = {0.0f, 0.0f}, ca[2] = {0.0f, 0.0f}, cu[2] = {0.0f, 0.0f};
    float acc[HD / 8][4];  // channel n-tile n: (row rA: channels 8n + 2t, +1), (row rB: same)
#pragma unroll
    for (int n = 0; n < HD / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    float r_v = 0.0f;  // the largest r_T so far (0: none yet), the accumulators' unit; the same in every thread
    // the carried state of this thread (chunks): field f of thread i of the grid at carry[f * nthr + i]
    const int64_t nthr = (int64_t)gridDim.x * gridDim.y * gridDim.z * NW * 32;
    float *const cst = a.carry + (((int64_t)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * NW * 32 + tid;
    if (a.carry_mode & 1) {
#pragma unroll
        for (int x = 0; x < 2; x++) {
            m_[x] = cst[(0 + x) * nthr];
            l_[x] = cst[(2 + x) * nthr];
            ca[x] = cst[(4 + x) * nthr];
            cu[x] = cst[(6 + x) * nthr];
        }
        r_v = cst[8 * nthr];
#pragma unroll
        for (int n = 0; n < HD / 8; n++)
#pragma unroll
            for (int v = 0; v < 4; v++) acc[n][v] = cst[(9 + 4 * n + v) * nthr];
    }

    for (int it = 0; it < ntiles; it++) {
        const int start = (a.tile0 + t_first + it) * TN;  // in the whole prefix
        if (tid == 0) stage_in(it + 1);  // into the other buffer, once tile it - 1's readers are done
        __syncwarp();
        mbar_wait(bar0 + 8 * (it & 1), (uint32_t)((it >> 1) & 1));  // tile it has landed
        const unsigned char *const sb = s_buf + (it & 1) * SBYTES;
        const uint32_t s_kb = sbase + (uint32_t)((it & 1) * SBYTES);                       // the planes' core matrices (key_offset)
        const __half *const s_v = reinterpret_cast<const __half *>(sb + KBYTES);          // value_offset
        const float *const s_rec = reinterpret_cast<const float *>(sb + KBYTES + VBYTES);  // the records: chain scales [NCH][TN], ...
        const float r_new = fmaxf(r_v, s_rec[R_T]);
        // r_new is a power of two in [2^-126, 2^126], so 1 / r_new is one exact exponent flip and the
        // products round exactly as the quotients would (the same values as r_v / r_new, r_T / r_new)
        const float inv = __int_as_float((254 << 23) - __float_as_int(r_new));
        const float rr = r_v * inv, pr = s_rec[R_T] * inv;  // powers of two (rr 0 before any tile)
        r_v = r_new;

        // ---- logits of the warp's 16 rows x TN tokens (fp16 keys in code units) ---------------------
        // Chain by chain (32 channels of one scale group), every n-tile of the tile in each: the rows'
        // A fragments of a chain are read once a tile (two ldmatrix), the keys' B fragments of a chain
        // and n-tile by one ldmatrix, and the n-tiles' accumulators are independent
        float z[NT][4];  // n-tile nt, value v: row (v < 2 ? rA : rB), token 8 nt + 2 t + (v & 1)
        float4 sc;       // the lane's four chain scales of n-tiles nt & ~1 and nt | 1
#pragma unroll
        for (int j = 0; j < NCH; j++) {
            uint32_t qa[2][4];  // the rows' q_h over channels 32 j + 16 h ..
#pragma unroll
            for (int h = 0; h < 2; h++)
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                             : "=r"(qa[h][0]), "=r"(qa[h][1]), "=r"(qa[h][2]), "=r"(qa[h][3])
                             : "r"(qh_lane + (uint32_t)(32 * (2 * j + h))));
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                uint32_t kb[4];  // hi of tokens 8 nt + g over channels 32 j .. 32 j + 31
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                             : "=r"(kb[0]), "=r"(kb[1]), "=r"(kb[2]), "=r"(kb[3])
                             : "r"(s_kb + (uint32_t)key_chain_offset(j, nt) + kl));
                float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                mma_f16(c, qa[0], kb[0], kb[1]);
                mma_f16(c, qa[1], kb[2], kb[3]);
                // the two tokens' scales of chain j; the logit (sum_j s_j c_j) 2^e sm below, the chains in order
                if (nt % 2 == 0) sc = *reinterpret_cast<const float4 *>(s_rec + R_S + TN * j + scale_lane_offset(nt / 2, t));
#pragma unroll
                for (int v = 0; v < 4; v++) {
                    const float s = nt % 2 ? ((v & 1) ? sc.w : sc.z) : ((v & 1) ? sc.y : sc.x);
                    z[nt][v] = j == 0 ? c[v] * s : __fmaf_rn(c[v], s, z[nt][v]);
                }
            }
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int v = 0; v < 4; v++) z[nt][v] = __fmul_rn(z[nt][v], rowf[v >> 1]);
        // a logit is finite or +-inf (the chains and scales finite, the row factor a finite normal number): an
        // overflow makes the row's largest radius +inf (so its certificate +inf: the merge's tail term; the
        // radius output of that token, where asked for, +inf) and, where a lane of the warp met one, every
        // logit of the tile is clamped to +-FMAX (a vote: the clamps are off the common path); then, on the
        // call's last tile only (every other tile is whole), a token past Np gets -inf. No logit of the tile
        // can overflow where rowf S_T <= 2^94 (S_T the tile's largest |s_j|; |C_j| < 2^29, so |logit| <
        // 2^126: PROOFS 5.4), so only a warp with a row past that looks at every value
        bool rovf[2] = {false, false};  // row x: a value overflowed
        uint32_t ovf = 0u;  // bit 4 nt + v: the value overflowed (only for the radius output)
        if (__any_sync(FULL, !(fmaxf(rowf[0], rowf[1]) * s_rec[R_SM] <= 0x1p94f))) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int v = 0; v < 4; v++) {
                    rovf[v >> 1] |= !(fabsf(z[nt][v]) <= FMAX);
                    if (OUTS) ovf |= (uint32_t)!(fabsf(z[nt][v]) <= FMAX) << (4 * nt + v);
                }
            if (__any_sync(FULL, rovf[0] || rovf[1])) {
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int v = 0; v < 4; v++) z[nt][v] = fminf(fmaxf(z[nt][v], -FMAX), FMAX);
            }
        }
        if ((t_first + it + 1) * TN > a.Np) {  // the call's last tile: its addends (0 live, -inf past Np)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const float a0 = s_rec[R_A + 8 * nt + 2 * t], a1 = s_rec[R_A + 8 * nt + 2 * t + 1];
#pragma unroll
                for (int v = 0; v < 4; v++) z[nt][v] += (v & 1) ? a1 : a0;
            }
        }
        if (OUTS && a.logits) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int v = 0; v < 4; v++) {
                    const int x = v >> 1, tk = 8 * nt + 2 * t + (v & 1);
                    if (rlive[x] && s_rec[R_A + tk] == 0.0f)
                        a.logits[((int64_t)rtok[x] * a.Hq + rhead[x]) * a.rad_n + start + tk] = z[nt][v];
                }
        }

        // ---- online softmax (rows rA: v 0, 1; rB: v 2, 3; the quad's lanes share a row) ----
        float alpha[2], mn[2];
#pragma unroll
        for (int x = 0; x < 2; x++) {
            float mx = -INF;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) mx = fmaxf(mx, fmaxf(z[nt][2 * x], z[nt][2 * x + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 2));
            mn[x] = fmaxf(m_[x], mx);  // finite: token `start` is live
            alpha[x] = exp_acc(m_[x] - mn[x]);
        }
        float add[2] = {0.0f, 0.0f}, ps[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int v = 0; v < 4; v++) {
                z[nt][v] = exp_acc(z[nt][v] - mn[v >> 1]);  // the weight p
                ps[v >> 1] += z[nt][v];
            }
#pragma unroll
        for (int x = 0; x < 2; x++) {
            l_[x] = l_[x] * alpha[x] + ps[x];
            m_[x] = mn[x];
        }

        // ---- certificate terms of (row, token) ---------------------------------------------
        if (a.cert) {
            float4 ax, ay, as2;  // the rows' entries
            if (RM != 1) ax = lds_f4(&s_afr[tid][0]);
            if (RM != 0) ay = lds_f4(&s_afr[tid][1]), as2 = lds_f4(&s_afr[tid][2]);
            // the (row, token) radii of n-tile nt (tc_radius_m; a flagged token's x and y are +inf through
            // its entries, tc_flag_entries): the radius's sums of the warp's 16 rows x 8 tokens on tensor cores
            auto radii = [&](int nt, float (&u)[4]) {
                float cx[4] = {0.0f, 0.0f, 0.0f, 0.0f}, cy[4] = {0.0f, 0.0f, 0.0f, 0.0f}, cs[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                const float *const bb = s_rec + R_B + t * BST + 2 * (8 * nt + g);
                if (RM != 1) {
                    const float2 bx = *reinterpret_cast<const float2 *>(bb);
                    mma_tf32(cx, ax, bx.x, bx.y);
                }
                if (RM != 0) {
                    const float2 by = *reinterpret_cast<const float2 *>(bb + 4 * BST);
                    const float2 bs = *reinterpret_cast<const float2 *>(bb + 8 * BST);
                    mma_tf32(cy, ay, by.x, by.y);
                    mma_tf32(cs, as2, bs.x, bs.y);
                }
#pragma unroll
                for (int v = 0; v < 4; v++)  // + the row's tail (+inf for a bad query row)
                    u[v] = tc_radius_m<RM>(cx[v], cy[v], cs[v], rtail[v >> 1]);
            };
            // p expm1(u) (p 0 past Np) by the polynomial, no MUFU op; where a radius of the tile is above 1 or
            // NaN (the polynomial is no bound there: one vote after the tile), the tile's terms again by the exp
            // route, capped at FMAX so that p = 0 gives 0 (a term capped is that of a radius +inf or NaN, whose
            // row's certificate is +inf through its largest radius)
            float tu[2] = {0.0f, 0.0f};  // the tile's largest radius of row x, NaN where one is (a token past
                                         // Np has slot `start`'s radius: no larger than the row's)
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                float u[4];
                radii(nt, u);
#pragma unroll
                for (int v = 0; v < 4; v++) {
                    const int x = v >> 1;
                    tu[x] = fmax_nan(tu[x], u[v]);
                    add[x] = __fmaf_rn(z[nt][v], expm1_up_poly(u[v]), add[x]);
                    if (OUTS && a.radius) {
                        const int tk = 8 * nt + 2 * t + (v & 1);
                        if (rlive[x] && s_rec[R_A + tk] == 0.0f)
                            a.radius[((int64_t)rtok[x] * a.Hq + rhead[x]) * a.rad_n + start + tk] =
                                (((ovf >> (4 * nt + v)) & 1u) || !(u[v] <= INF)) ? INF : u[v];
                    }
                }
            }
            if (__any_sync(FULL, !(tu[0] <= 1.0f && tu[1] <= 1.0f))) {  // a radius above 1 or NaN
                add[0] = add[1] = 0.0f;
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    float u[4];
                    radii(nt, u);
#pragma unroll
                    for (int v = 0; v < 4; v++)
                        add[v >> 1] = __fmaf_rn(z[nt][v], fminf(expm1_up_exp(u[v]), FMAX), add[v >> 1]);
                }
            }
#pragma unroll
            for (int x = 0; x < 2; x++) {
                ca[x] = (ca[x] == INF ? INF : ca[x] * alpha[x]) + add[x];
                cu[x] = (rovf[x] || !(tu[x] <= INF)) ? INF : fmaxf(cu[x], tu[x]);  // NaN: +inf
            }
        }

        // ---- p.v: weights (A, fp16) x the staged values (B, ldmatrix.trans) ----------------
        const float fa = alpha[0] * rr, fb = alpha[1] * rr;
        if (__any_sync(FULL, fa != 1.0f || fb != 1.0f)) {  // else every factor is 1: the products change nothing
#pragma unroll
            for (int n = 0; n < HD / 8; n++) {
                acc[n][0] *= fa; acc[n][1] *= fa; acc[n][2] *= fb; acc[n][3] *= fb;
            }
        }
        if (pr != 1.0f) {  // p r_T / r: exact (a power of two; the same in every thread, mostly 1)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int v = 0; v < 4; v++) z[nt][v] *= pr;
        }
#pragma unroll
        for (int kc = 0; kc < KC; kc++) {
            uint32_t pa[4];  // p r_T / r in fp16
            pa[0] = h2bits(__floats2half2_rn(z[2 * kc][0], z[2 * kc][1]));
            pa[1] = h2bits(__floats2half2_rn(z[2 * kc][2], z[2 * kc][3]));
            pa[2] = h2bits(__floats2half2_rn(z[2 * kc + 1][0], z[2 * kc + 1][1]));
            pa[3] = h2bits(__floats2half2_rn(z[2 * kc + 1][2], z[2 * kc + 1][3]));
            const int mat = lane >> 3;
            const int tk = 16 * kc + (lane & 7) + 8 * (mat & 1);
#pragma unroll
            for (int n2 = 0; n2 < HD / 16; n2++) {
                const __half *src = s_v + value_offset(tk, 16 * n2 + 8 * (mat >> 1));
                const uint32_t addr = (uint32_t)__cvta_generic_to_shared(src);
                uint32_t b0, b1, b2, b3;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                             : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3) : "r"(addr));
                mma_f16(acc[2 * n2], pa, b0, b1);
                mma_f16(acc[2 * n2 + 1], pa, b2, b3);
            }
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(bar0 + 16 + 8 * (it & 1));  // this warp is done with buffer it % 2
    }

    if (a.carry_mode & 2) {  // not the last chunk: the state for the next
#pragma unroll
        for (int x = 0; x < 2; x++) {
            cst[(0 + x) * nthr] = m_[x];
            cst[(2 + x) * nthr] = l_[x];
            cst[(4 + x) * nthr] = ca[x];
            cst[(6 + x) * nthr] = cu[x];
        }
        cst[8 * nthr] = r_v;
#pragma unroll
        for (int n = 0; n < HD / 8; n++)
#pragma unroll
            for (int v = 0; v < 4; v++) cst[(9 + 4 * n + v) * nthr] = acc[n][v];
        return;
    }

    // ---- the state after the prefix: reduce the quad, write the live rows ---------------------
#pragma unroll
    for (int x = 0; x < 2; x++) {
#pragma unroll
        for (int o = 1; o < 4; o <<= 1) {
            l_[x] += __shfl_xor_sync(FULL, l_[x], o);
            const float co = __shfl_xor_sync(FULL, ca[x], o);
            ca[x] = (ca[x] == INF || co == INF) ? INF : ca[x] + co;
            cu[x] = fmaxf(cu[x], __shfl_xor_sync(FULL, cu[x], o));
        }
        if (!rlive[x]) continue;
        const int64_t orow = ((int64_t)blockIdx.z * a.T + rtok[x]) * a.Hq + rhead[x];  // split z's block
        if (t == 0) {
            a.om[orow] = m_[x];
            a.ol[orow] = l_[x];
            a.oa[orow] = a.cert ? ca[x] : 0.0f;
            a.ou[orow] = a.cert ? cu[x] : 0.0f;
        }
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            a.oacc[orow * HD + 8 * n + 2 * t] = acc[n][2 * x] * r_v;
            a.oacc[orow * HD + 8 * n + 2 * t + 1] = acc[n][2 * x + 1] * r_v;
        }
    }
}

// Bytes of the workspace a call with Np prefix tokens and Hkv KV heads needs (ExtArgs.work).
extern "C" int64_t wc_extend_workspace_bytes(int Np, int Hkv) {
    return (int64_t)Hkv * ((Np + TN - 1) / TN) * WS;
}

// Floats of carried state per thread of the prefix kernel's grid (ExtArgs.carry: this times
// grid_x grid_y n_splits NW 32): max, sum, certificate sum and largest radius of its two rows, r_v, acc.
extern "C" int wc_extend_carry_floats() { return 9 + 4 * (HD / 8); }

// Prefix tokens per tile of this build (WC_TN): the prefix runs in chunks of whole tiles.
extern "C" int wc_extend_tile_tokens() { return TN; }

// The most prefix splits a launch takes (ExtArgs.n_splits: grid z); an earlier extend.cu without
// this export takes none (one state per row).
extern "C" int wc_extend_max_splits() { return 65535; }

// The staged keys' layout, checked on the host (tests/test_cuda_build.py, no GPU): the number of lanes'
// ldmatrix rows (every chain, n-tile and lane) that are not the row the staging pass stores for the
// token and channels the B fragments need, plus the 16-byte rows of a tile's keys stored twice,
// never or outside the keys' WSK bytes. 0 when the layout holds.
extern "C" int wc_extend_key_layout_errors() {
    int bad = 0;
    for (int j = 0; j < NCH; j++)
        for (int nt = 0; nt < NT; nt++)
            for (int lane = 0; lane < 32; lane++)
                bad += key_chain_offset(j, nt) + key_lane_offset(lane) != key_store_offset(8 * nt + (lane & 7), 32 * j + 8 * (lane >> 3));
    static unsigned char seen[WSK / 16];
    for (int i = 0; i < WSK / 16; i++) seen[i] = 0;
    for (int tk = 0; tk < TN; tk++)
        for (int ch = 0; ch < HD; ch += 8) {
            const int o = key_store_offset(tk, ch);
            if (o < 0 || o >= WSK || o % 16 != 0) bad++;
            else seen[o / 16]++;
        }
    for (int i = 0; i < WSK / 16; i++) bad += seen[i] != 1;
    // the chain scales: scale_offset a permutation of a chain's row, and the lane's four the tokens it
    // combines (8 nt + 2 t, + 1 of n-tiles nt = 2 nt2, 2 nt2 + 1)
    static unsigned char sseen[TN];
    for (int i = 0; i < TN; i++) sseen[i] = 0;
    for (int tk = 0; tk < TN; tk++) {
        const int o = scale_offset(tk);
        if (o < 0 || o >= TN) bad++;
        else sseen[o]++;
    }
    for (int i = 0; i < TN; i++) bad += sseen[i] != 1;
    for (int nt2 = 0; nt2 < NT / 2; nt2++)
        for (int t = 0; t < 4; t++)
            for (int k = 0; k < 4; k++)
                bad += scale_lane_offset(nt2, t) + k != scale_offset(8 * (2 * nt2 + k / 2) + 2 * t + k % 2);
    return bad;
}

// Threads per CTA of the prefix kernel.
extern "C" int wc_extend_cta_threads() { return NW * 32; }

// sizeof(ExtArgs): the ctypes mirror's size must match (tests/test_cuda_build.py, no GPU needed)
extern "C" int wc_extend_args_bytes() { return (int)sizeof(ExtArgs); }

// The staging pass, then the prefix kernel (grid_x blocks of new tokens x grid_y = Hkv x
// a->n_splits), on `stream`.
extern "C" int wc_extend_launch(const ExtArgs *a, int grid_x, int grid_y, cudaStream_t stream) {
    if (a->Np <= 0 || a->n_splits < 1 || a->n_splits > 65535 || a->radius_mode < 0 || a->radius_mode > 2)
        return (int)cudaErrorInvalidValue;
    wc_extend_stage<<<dim3((a->Np + TN - 1) / TN, grid_y), SNT, 0, stream>>>(*a);
    {
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return (int)e;
    }
    const bool outs = a->logits != nullptr || a->radius != nullptr;
    static void (*const kerns[2][3])(ExtArgs) = {
        {wc_extend_prefix<false, 0>, wc_extend_prefix<false, 1>, wc_extend_prefix<false, 2>},
        {wc_extend_prefix<true, 0>, wc_extend_prefix<true, 1>, wc_extend_prefix<true, 2>}};
    // without a certificate: the minimum radius's instance (the default certificate's), its certificate
    // block skipped at run time
    void (*const kern)(ExtArgs) = kerns[outs][a->cert ? a->radius_mode : 2];
    {  // dynamic shared memory beyond 48 KB with the static (8 warps) must be allowed on the current device
        const cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, BUF);
        if (e != cudaSuccess) return (int)e;
    }
    kern<<<dim3(grid_x, grid_y, a->n_splits), NW * 32, BUF, stream>>>(*a);
    return (int)cudaGetLastError();
}

// ---- A probe of the tensor-core sums (tests: the accumulation model of PROOFS 5.4) ------------
// n problems, one warp each: C = A B + A2 B as the radius's sums compute it (A, A2 [16][8], B [8][8],
// row-major tf32 values, A2 at A + 128 n; C [16][8] fp32): two chained mmas from zero accumulators.
__global__ void wc_tc_probe_kernel(const float *A, const float *B, float *C, int n) {
    const int w = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (w >= n) return;  // whole warps
    const int g = lane >> 2, t = lane & 3;
    const float *const a = A + (int64_t)w * 128, *const b = B + (int64_t)w * 64;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma_tf32(c, make_float4(a[g * 8 + t], a[(g + 8) * 8 + t], a[g * 8 + t + 4], a[(g + 8) * 8 + t + 4]),
             b[t * 8 + g], b[(t + 4) * 8 + g]);
    const float *const a2 = a + (int64_t)n * 128;
    mma_tf32(c, make_float4(a2[g * 8 + t], a2[(g + 8) * 8 + t], a2[g * 8 + t + 4], a2[(g + 8) * 8 + t + 4]),
             b[t * 8 + g], b[(t + 4) * 8 + g]);
    float *const o = C + (int64_t)w * 128;
    o[g * 8 + 2 * t] = c[0];
    o[g * 8 + 2 * t + 1] = c[1];
    o[(g + 8) * 8 + 2 * t] = c[2];
    o[(g + 8) * 8 + 2 * t + 1] = c[3];
}

extern "C" int wc_tc_probe(const float *A, const float *B, float *C, int n, cudaStream_t stream) {
    wc_tc_probe_kernel<<<(n + 3) / 4, 128, 0, stream>>>(A, B, C, n);
    return (int)cudaGetLastError();
}

// ---- A probe of expm1_up_exp (tests: PROOFS 5.5), y[i] = expm1_up_exp(u[i]) -------------------
__global__ void wc_expm1_probe_kernel(const float *u, float *y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = expm1_up_exp(u[i]);
}

extern "C" int wc_expm1_probe(const float *u, float *y, int n, cudaStream_t stream) {
    wc_expm1_probe_kernel<<<(n + 255) / 256, 256, 0, stream>>>(u, y, n);
    return (int)cudaGetLastError();
}

// ---- A probe of expm1_up_poly (tests: PROOFS 5.5), y[i] = expm1_up_poly(u[i]) for 0 <= u[i] <= 1 --
__global__ void wc_expm1_poly_probe_kernel(const float *u, float *y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = expm1_up_poly(u[i]);
}

extern "C" int wc_expm1_poly_probe(const float *u, float *y, int n, cudaStream_t stream) {
    wc_expm1_poly_probe_kernel<<<(n + 255) / 256, 256, 0, stream>>>(u, y, n);
    return (int)cudaGetLastError();
}
