// Paged decode over witcert's dithered INT8 pool with the certificate: CUDA C++ tensor-core
// split kernel (mma.sync), the same arithmetic as the Triton kernel (docs/PROOFS.md 5.4).
//
// One CTA of NP tile streams per (sequence b, KV head, split); each stream takes 16-token tiles
// in turn and keeps its own softmax state; the streams merge in shared memory at the end, and
// the Triton merge kernel combines the splits (partials in its layout). A stream is one warp
// pair (SPLIT): its K warp computes a tile's logits, softmax weights and certificate terms, its
// V warp regenerates the tile's V dither and accumulates p.v; they hand each tile's weights over
// in shared memory (two named barriers per pair: full, empty), so a K warp computes tile i + 1
// while its V warp works on tile i, and each warp holds only its side's registers (twice the
// warps per SM). Or one warp does both sides (k_tile, then v_tile). Every value is computed by
// the same operations in the same order either way (BENCHMARKS.md 4m).
//
// q.k (int8 tensor cores, exact): A = 16 tokens x 32 channels of one k-step (codes, or one
// byte plane rho_p of the dither), B = the query heads' int8 digits (n = 8 columns: the heads,
// one mma per digit, at QGP 8; "packed" at QGP <= 4: (head, digit 0 / 1) in one mma and
// (head, digit 2) in the even columns of a second, so a lane's accumulators hold every digit
// of one head and no lane combines padded heads), C = int32. A k-step never crosses a scale group, so each group's dots are separate and the
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
// p.v (fp16 tensor cores, the transpose): A = 16 channels x 16 tokens of the V codes, and of
// each dither byte plane times -2^-b 256^p (both exact in fp16: an int8 x is the half with
// bits 0x6400 | (x + 128) minus 1152); B = 16 tokens x 8 query heads of p s_g / r_g in fp16
// (r_g the largest V scale of group g seen so far, so the operand lies in [0, 1]); C = fp32
// [channels, heads]. At b = 8 the plane goes in as the half 1024 + r and the scaling moves to B
// (256 B with the codes, -B with the plane: exact), so no per-element fused multiply-add. An
// m-tile lies inside one scale group (its B carries the group's scale); inside a group the
// channels are permuted so that lane g holds a run of 2 G / 16 consecutive channels of each of
// its tokens 2t, 2t+1, 2t+8, 2t+9: one code load and a
// share of one Philox call per (token, group); lanes that share a call (at groups of 32 or
// 64) each compute some tokens' calls and swap words, so no call is computed twice.
//
// Token records are software-pipelined one and two tiles ahead (block-table entries, then the
// counter words) and the next tile's code, scale and witness lines are prefetched: a tile's
// loads find their lines in cache instead of waiting on a chain of dependent memory reads
// (BENCHMARKS.md 4j: long-scoreboard stalls per issued instruction 0.71 -> 0.29).
#include <cstdint>
#include "common.cuh"

constexpr int ROWS = QGP * NG;          // p.v rows (head, group)
// q.k columns: at QGP <= 4 the 8 columns of one mma carry (head, digit 0 / 1) and a second
// mma's even columns (head, digit 2) ("packed": lane t owns head t, 2 (token, head) values);
// at QGP 8 the columns are the heads, one mma per digit (lane t owns heads 2t, 2t + 1)
constexpr bool PACK = QGP <= 4;
constexpr int NHL = PACK ? 1 : 2;       // query heads a lane owns in the logits / softmax
constexpr int NV = 2 * NHL;             // (token, head) values per lane: v = NHL x + j
// K / V warp pairs where they build without spills at 128 registers and measured faster
// (BENCHMARKS.md 4m): groups of 32, except QGP 8 at b = 16 (its K warp carries most of a tile's
// work and the pair is slower there: 4m, 4p); elsewhere one warp does both sides of its tiles.
// WC_FEW_CTAS is the build for grids of at most one CTA per SM (the launcher's choice, 4p): pairs at
// QGP 8 and b = 16 too, without the register cap (one CTA of 8 warps per SM where the one-warp
// kernel leaves an SM 4 warps). Either arrangement computes every value by the same operations in
// the same order, so the choice never changes a bit (a request's result stays batch-invariant).
constexpr bool PAIRS128 = G == 32 && (QGP <= 4 || BITS == 8);  // pairs at 128 registers
#ifdef WC_FEW_CTAS
constexpr bool SPLIT = G == 32;
#else
constexpr bool SPLIT = PAIRS128;
#endif
constexpr int NP = 4;                   // tile streams per CTA: warp pw, and V warp NP + pw if SPLIT
constexpr int NW = SPLIT ? 2 * NP : NP; // warps per CTA
static_assert(!SPLIT || 2 * NP <= 15, "a pair's named barriers are 1 + pw and 1 + NP + pw (ids 1-15)");
constexpr int TILE = 16;                // tokens per warp tile
constexpr int MT = HD / 16;             // p.v m-tiles (16 channels each)
constexpr int MPG = G / 16;             // p.v m-tiles per scale group
constexpr int RUN = 2 * MPG;            // channels of a group a lane holds per token on the V side
constexpr int SHARE = CPC > RUN ? CPC / RUN : 1;  // lanes sharing one V-side call (1, 2, 4)
constexpr int CPR = RUN > CPC ? RUN / CPC : 1;    // V-side calls per run (1 or 2)
constexpr int WPR = RUN * BITS / 32;    // dither words per run
#ifdef WC_MAXREG   // a register cap per thread, as resident CTAs per SM for __launch_bounds__
constexpr int MINB = 65536 / (NW * 32 * WC_MAXREG);
#else  // pairs at 128 registers: two CTAs (16 warps) per SM; else the compiler's choice (BENCHMARKS 4m)
constexpr int MINB = PAIRS128 ? 2 : 1;
#endif

// The V side's dither words, shared: SHARE lanes (members m = 0 .. SHARE - 1, lanes 4 apart) split
// one Philox call per token and channel chunk. Member m computed the calls of tokens m + SHARE q
// (wq[q], words 0..3) and needs words m WPR .. m WPR + WPR - 1 of tokens k = 0..3 (dw[k]). An xor
// butterfly moves them: at each stage (partner m ^ 1, then m ^ 2) a member keeps the half of its
// words whose index bit matches its own bit (m0, m1) and swaps the other half with its partner,
// placing every word at its token's register by a select (no selects on a computed index). Pure
// data movement: the words are the ones each lane would compute itself.
template <int NQ, int W>
__device__ __forceinline__ void share_words(const uint4 (&wq)[NQ], uint32_t (&dw)[4][W], int m) {
    const bool m0 = (m & 1) != 0, m1 = (m & 2) != 0;  // the member's bits
    static_assert(NQ == W && (NQ == 1 || NQ == 2), "members of 2 or 4 lanes");
    if constexpr (NQ == 2) {  // 2 members (W 2): partner m ^ 1; member m needs words 2m, 2m + 1
#pragma unroll
        for (int q = 0; q < 2; q++) {
            const uint32_t s0 = m0 ? wq[q].x : wq[q].z, s1 = m0 ? wq[q].y : wq[q].w;
            const uint32_t r0 = __shfl_xor_sync(FULL, s0, 4), r1 = __shfl_xor_sync(FULL, s1, 4);
            dw[2 * q][0] = m0 ? r0 : wq[q].x;      // token 2q: the partner's call if m is odd
            dw[2 * q][1] = m0 ? r1 : wq[q].y;
            dw[2 * q + 1][0] = m0 ? wq[q].z : r0;  // token 2q + 1: own call if m is odd
            dw[2 * q + 1][1] = m0 ? wq[q].w : r1;
        }
    } else {  // 4 members (W 1): member m needs word m; stage 1 partner m ^ 1, stage 2 m ^ 2
        const uint4 w = wq[0];
        // stage 1: keep words m0, 2 + m0 of the own token, receive them of token m ^ 1; L[e][y]:
        // the pair's even (e 0) / odd (e 1) token, word y 0: m0, y 1: 2 + m0
        const uint32_t s0 = m0 ? w.x : w.y, s1 = m0 ? w.z : w.w;
        const uint32_t r0 = __shfl_xor_sync(FULL, s0, 4), r1 = __shfl_xor_sync(FULL, s1, 4);
        const uint32_t L[2][2] = {{m0 ? r0 : w.x, m0 ? r1 : w.z}, {m0 ? w.y : r0, m0 ? w.w : r1}};
        // stage 2: keep word y = m1 of tokens m, m ^ 1 (the pair m1), receive it of the other pair
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const uint32_t r = __shfl_xor_sync(FULL, m1 ? L[e][0] : L[e][1], 8);
            dw[e][0] = m1 ? r : L[e][0];      // pair 0: tokens 0, 1
            dw[2 + e][0] = m1 ? L[e][1] : r;  // pair 1: tokens 2, 3
        }
    }
}

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
    __shared__ float2 s_tcb[32][6];       // lane's B fragments of the radius's sums x, y, s2 (tc_radius), hi then lo
    __shared__ int s_rbad[ROWS];
    __shared__ float s_p[NP][8][TILE];    // a stream's tile weights [head][token]
    __shared__ float s_alpha[NP][8];
    __shared__ float s_vs[NP][TILE][NG];  // a stream's tile V scales (0: flagged or past the end)
    __shared__ float s_pvc[NP][8][NG];    // a stream's sum of the p.v operand per (head, group)
    __shared__ float s_red[NP][QGP][5];
    __shared__ float s_vmax[NP];
    __shared__ float s_acc[NP][QGP][HD];

    // ---- the query rows (head, group): digits, exponent, residual, norms (PROOFS 5.4) ----
    for (int i = QGP * HD + tid; i < 8 * HD; i += NW * 32) {
        s_dig[0][0][i] = 0;
        s_dig[1][0][i] = 0;
        s_dig[2][0][i] = 0;
    }
    if constexpr (PACK) {  // heads >= 4: their B columns of the p.v stay 0
        for (int i = tid; i < NP * 8 * TILE; i += NW * 32) s_p[0][0][i] = 0.0f;
        for (int i = tid; i < NP * 8; i += NW * 32) s_alpha[0][i] = 1.0f;
    }
    for (int r = warp; r < ROWS; r += NW) {
        const int h = r / NG, grp = r % NG;
        float qv[KPG];
#pragma unroll
        for (int m = 0; m < KPG; m++)
            qv[m] = h < qg ? load_q_elem(a.q, a.q_dtype, (int64_t)b * a.sq_b + (int64_t)(kvh * qg + h) * a.sq_h
                                                              + grp * G + 32 * m + lane) : 0.0f;
        int8_t *const dig[3] = {&s_dig[0][h][grp * G], &s_dig[1][h][grp * G], &s_dig[2][h][grp * G]};
        const QRow o = q_row(qv, dig, a.sm, a.arith_gamma, lane);
        if (lane == 0) {
            s_comb[h][grp] = o.comb;
            s_crt[h][grp] = o.crt;
            s_rbad[r] = o.bad;
        }
    }
    __syncthreads();

    // ---- per-lane constants ---------------------------------------------------------------
    // B fragments of the digits (head g, channels 32 ks + 8 t + [0, 8)) are read from shared
    // memory at each use: 24 registers fewer
    bool qbad[NHL];
#pragma unroll
    for (int j = 0; j < NHL; j++) {
        const int h = NHL * t + j;
        int bad = 0;
        if (h < QGP)
            for (int grp = 0; grp < NG; grp++) bad |= s_rbad[h * NG + grp];
        qbad[j] = bad != 0 || h >= qg;
    }
    const uint32_t lh = ((uint32_t)a.layer << 16) | (uint32_t)kvh;
    const bool pow2_page = (a.P & (a.P - 1)) == 0;  // page and offset by shift and mask
    const int page_shift = __ffs(a.P) - 1;
    const int n_tiles = (t_hi - t_lo + TILE - 1) / TILE;
    float lf = 0.0f, e_soft = 0.0f;
    if (a.cert) {
        if (a.radius_mode != 0) {
            const double dl = a.delta ? (double)a.delta[b] : (double)a.delta_scalar;
            lf = round_up_f32(sqrt(2.0 * log(2.0 * (double)n_tok / dl)) * 1.0000000000001);
        }
        // argument roundings of every weight, one exp per weight and per rescale: this
        // stream's tiles, the streams' merge and the split merge (with room to spare)
        e_soft = 1.0616e-05f + (float)((n_tiles + NP - 1) / NP + NP + 4) * 4.76837158203125e-07f;
        // the heads' entries of the radius's tensor-core sums (common.cuh tc_row_entries; PROOFS 5.4):
        // B column n is head n (NHL 2) or n / 2 (NHL 1, so D's column 2t is head t); lane (g, t) holds
        // column g's entries k = t, t + 4 (group t)
        if (warp == 0) {
            const int hc = NHL == 2 ? g : g >> 1, h = hc < QGP ? hc : 0;
            float e[3][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}}, el[3][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}, {0.0f, 0.0f}};
            if (t < NG) tc_row_entries(s_crt[h][t], a.sm, a.bias_coef, lf, e, el);
#pragma unroll
            for (int q = 0; q < 3; q++) {
                s_tcb[lane][q] = make_float2(e[q][0], e[q][1]);
                s_tcb[lane][3 + q] = make_float2(el[q][0], el[q][1]);
            }
        }
    }
    __syncthreads();

    // ---- the tiles' token records, software-pipelined: lane l resolves token t0 + (l & 15) of
    // a tile (past the end: token t_lo); while tile i computes, the block-table entries of tile
    // i + 2 and the counter words (position, epoch) of tile i + 1 are in flight, and the lines
    // tile i + 1 reads (codes, scales, witnesses) are prefetched, so no tile waits on the
    // chain block table -> slot -> counter words -> codes
    const int32_t *bt_row = a.bt + (int64_t)b * a.bt_s0;
    auto tok_of = [&](int tt0) { const int my = tt0 + (lane & 15); return my < t_hi ? my : t_lo; };
    auto page_of = [&](int tk) { return bt_row[pow2_page ? tk >> page_shift : tk / a.P]; };
    auto slot_of = [&](int tk, int32_t pg) {
        return (int64_t)pg * a.P + (pow2_page ? tk & (a.P - 1) : tk % a.P);
    };
    auto word0_of = [&](int64_t sl) { return (uint32_t)(a.positions ? a.positions[sl] : sl); };
    const bool vside = SPLIT && warp >= NP;  // the V warp of pair pw
    const int pw = warp % NP;  // the tile stream
    const int bar_full = 1 + pw, bar_empty = 1 + NP + pw;  // named barriers (0: __syncthreads)
    const int first = t_lo + pw * TILE, step = NP * TILE;
    uint32_t mrow = 0u, mw0 = 0u, mep = 0u;       // tile i
    uint32_t nrow = 0u, nw0 = 0u, nep = 0u;       // tile i + 1 (loads in flight)
    int32_t npg = 0;                              // tile i + 2's block-table entry (in flight)
    if (first < t_hi) {
        const int tk0 = tok_of(first), tk1 = tok_of(first + step);
        const int64_t s0 = slot_of(tk0, page_of(tk0)), s1 = slot_of(tk1, page_of(tk1));
        mw0 = word0_of(s0); mep = (uint32_t)a.epochs[s0]; mrow = (uint32_t)(s0 * a.Hkv + kvh);
        nw0 = word0_of(s1); nep = (uint32_t)a.epochs[s1]; nrow = (uint32_t)(s1 * a.Hkv + kvh);
        npg = page_of(tok_of(first + 2 * step));
    }
    // advance the pipeline: cur_* take tile i's records, m* tile i + 1's, n* start tile i + 2's
    // loads, npg tile i + 3's block-table entry; prefetch the lines tile i + 1 reads on this
    // warp's side (K warp: lanes 0-15 the K codes, scales, witnesses, lanes 16-31 the V scales
    // and witnesses; V warp: the V codes; one warp for both sides: lanes 16-31 also the V codes)
    auto advance = [&](int t0, uint32_t &cur_row, uint32_t &cur_w0, uint32_t &cur_ep) {
        cur_row = mrow; cur_w0 = mw0; cur_ep = mep;
        const int tk2 = tok_of(t0 + 2 * step);
        const int64_t s2 = slot_of(tk2, npg);
        mrow = nrow; mw0 = nw0; mep = nep;
        nw0 = word0_of(s2); nep = (uint32_t)a.epochs[s2]; nrow = (uint32_t)(s2 * a.Hkv + kvh);
        npg = page_of(tok_of(t0 + 3 * step));
        if (!vside) {
            prefetch_line(reinterpret_cast<const char *>(lane < 16 ? a.ks : a.vs) + (int64_t)mrow * NG * 2);
            prefetch_line(reinterpret_cast<const char *>(lane < 16 ? a.kw : a.vw) + (int64_t)mrow * NG * 2);
        }
        if (!SPLIT || lane < 16)
            prefetch_line(reinterpret_cast<const char *>(!SPLIT ? (lane < 16 ? a.kc : a.vc) : (vside ? a.vc : a.kc))
                          + (int64_t)mrow * HD);
    };
    float m_[NHL], l_[NHL], ca[NHL], cvw[NHL], cu[NHL], cvmax = 0.0f;
#pragma unroll
    for (int j = 0; j < NHL; j++) {
        m_[j] = -INF;
        l_[j] = ca[j] = cvw[j] = cu[j] = 0.0f;
    }
    float acc[MT][4];  // channels ch(i, g), ch(i, g + 8) x heads 2t, 2t + 1
#pragma unroll
    for (int i = 0; i < MT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    float pvc[NG], rv[NG];  // head g's sum of the fp16 p.v operand; largest V scale seen, per group
#pragma unroll
    for (int grp = 0; grp < NG; grp++) pvc[grp] = rv[grp] = 0.0f;
    // one tile of the K side: logits, softmax, certificate terms, the hand-off of its weights
    auto k_tile = [&](int t0, uint32_t cur_row, uint32_t cur_w0, uint32_t cur_ep) {
        uint32_t krow[2], kw0[2], kep[2];
        bool klive[2];
#pragma unroll
        for (int x = 0; x < 2; x++) {
            krow[x] = __shfl_sync(FULL, cur_row, g + 8 * x);
            kw0[x] = __shfl_sync(FULL, cur_w0, g + 8 * x);
            kep[x] = __shfl_sync(FULL, cur_ep, g + 8 * x);
            klive[x] = t0 + g + 8 * x < t_hi;
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
        float z[NV];  // v = NHL x + j: (token g + 8x, head NHL t + j)
        const int8_t *krun[2] = {a.kc + (int64_t)krow[0] * HD + 8 * t, a.kc + (int64_t)krow[1] * HD + 8 * t};
#pragma unroll
        for (int grp = 0; grp < NG; grp++) {
            uint32_t ca_[KPG][4], pa0[KPG][4], pa1[KPG][4];
#pragma unroll
            for (int kk = 0; kk < KPG; kk++) {
                const int ks = grp * KPG + kk;
                const uint2 c0 = __ldg(reinterpret_cast<const uint2 *>(krun[0] + 32 * ks));
                const uint2 c1 = __ldg(reinterpret_cast<const uint2 *>(krun[1] + 32 * ks));
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
            float td[3][NV];  // digit j's term of value v
            if constexpr (PACK) {
                // mma 0: columns (head n / 2, digit n % 2); mma 1: (head n / 2, digit 2) at even
                // n, 0 at odd n (row 7 of the digits is 0 when QGP <= 4)
                int ci[2][4], cj0[2][4], cj1[2][4];
#pragma unroll
                for (int mm = 0; mm < 2; mm++)
#pragma unroll
                    for (int v = 0; v < 4; v++) ci[mm][v] = cj0[mm][v] = cj1[mm][v] = 0x4B400000;  // 1.5 * 2^23
#pragma unroll
                for (int kk = 0; kk < KPG; kk++) {
                    const int ks = grp * KPG + kk;
#pragma unroll
                    for (int mm = 0; mm < 2; mm++) {
                        const int8_t *row = mm == 0 ? s_dig[g & 1][g >> 1] : s_dig[2][(g & 1) ? 7 : (g >> 1)];
                        const uint2 qb = *reinterpret_cast<const uint2 *>(row + 32 * ks + 8 * t);
                        mma_s8(ci[mm], ca_[kk][0], ca_[kk][1], ca_[kk][2], ca_[kk][3], qb.x, qb.y);
                        mma_s8(cj0[mm], pa0[kk][0], pa0[kk][1], pa0[kk][2], pa0[kk][3], qb.x, qb.y);
                        if constexpr (BITS == 16)
                            mma_s8(cj1[mm], pa1[kk][0], pa1[kk][1], pa1[kk][2], pa1[kk][3], qb.x, qb.y);
                    }
                }
                const float4 cm = s_comb[t < QGP ? t : 0][grp];
#pragma unroll
                for (int x = 0; x < 2; x++) {  // value v = x: (token g + 8x, head t)
                    td[0][x] = digit_term(ci[0][2 * x], cj0[0][2 * x], cj1[0][2 * x], cm.x);
                    td[1][x] = digit_term(ci[0][2 * x + 1], cj0[0][2 * x + 1], cj1[0][2 * x + 1], cm.y);
                    td[2][x] = digit_term(ci[1][2 * x], cj0[1][2 * x], cj1[1][2 * x], cm.z);
                }
            } else {
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
                        td[j][v] = digit_term(ci[v], cj0[v], cj1[v], j == 0 ? cm.x : (j == 1 ? cm.y : cm.z));
                    }
                }
            }
#pragma unroll
            for (int v = 0; v < NV; v++) {
                const int h = NHL * t + v % NHL;
                const float f = s_comb[h < QGP ? h : 0][grp].w;
                const float zr = group_logit(td[0][v], td[1][v], td[2][v], ksc[v / NHL][grp], f);
                z[v] = grp == 0 ? zr : __fadd_rn(z[v], zr);
            }
        }
        uint32_t ovf = 0u;  // bit v: value v overflowed (a finite value is used, u = +inf)
#pragma unroll
        for (int v = 0; v < NV; v++) {
            float zz = z[v];
            if (!(fabsf(zz) <= FMAX)) {
                ovf |= 1u << v;
                zz = zz != zz ? 0.0f : copysignf(FMAX, zz);
            }
            const int x = v / NHL;
            z[v] = !klive[x] ? -INF : (kbad[x] ? 0.0f : zz);
        }
        if (a.logits) {
#pragma unroll
            for (int v = 0; v < NV; v++) {
                const int h = NHL * t + v % NHL, x = v / NHL;
                if (h < qg && klive[x])
                    a.logits[((int64_t)b * a.Hq + kvh * qg + h) * a.rad_n + t0 + g + 8 * x] = z[v];
            }
        }

        // ---- online softmax over the tile (the lane's heads; every lane g keeps m) -------
        float p[NV], alpha[NHL];
#pragma unroll
        for (int j = 0; j < NHL; j++) {
            float mx = fmaxf(z[j], z[NHL + j]);
            mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 4));
            mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 8));
            mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 16));
            const float mn = fmaxf(m_[j], mx);  // finite: token t0 is live
            alpha[j] = exp_acc(m_[j] - mn);
            p[j] = exp_acc(z[j] - mn);
            p[NHL + j] = exp_acc(z[NHL + j] - mn);
            l_[j] = l_[j] * alpha[j] + (p[j] + p[NHL + j]);
            m_[j] = mn;
        }

        // ---- certificate terms of (token g / g+8, the lane's heads) -----------------------
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
                // sqrt_up (one MUFU op, within 3 ulp; w2, s2 are 0 or at least 2^-48: no flush) and
                // the sums' and products' roundings, all within 2^-18 (PROOFS 5.1)
                vwn[x] = vbad[x] ? INF : sqrt_up(w2) * 1.000003814697265625f;
                vrad[x] = 127.5f * sqrt_up(s2 * (float)G) * 1.000003814697265625f + vwn[x];
                if (klive[x]) cvmax = vbad[x] ? INF : fmaxf(cvmax, vrad[x]);
            }
            // the radius's sums of the tile's 16 tokens x the heads on tensor cores (tc_radius): A = the
            // tokens' entries of group t (tc_token_entries; k = t, t + 4); the probabilistic part
            // first, so that two of the three sums are live at a time
            float ea[2][3][2];
#pragma unroll
            for (int x = 0; x < 2; x++) {
                const int tg = t < NG ? t : 0;
                float s1 = ksc[x][0];
#pragma unroll
                for (int grp = 1; grp < NG; grp++) s1 = tg == grp ? ksc[x][grp] : s1;
                const float w1 = __half2float(__ldg(a.kw + (int64_t)krow[x] * NG + tg));
                tc_token_entries(t < NG && !isinf(w1) ? w1 : 0.0f, t < NG && !isinf(s1) ? s1 : 0.0f, ea[x]);
            }
            auto afrag = [&](int q) { return make_float4(ea[0][q][0], ea[1][q][0], ea[0][q][1], ea[1][q][1]); };
            float cx[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // s2, then the probabilistic radius per D value
            {
                const RadiusC rc{a.arith_abs + e_soft, a.radius_mode != 1, a.radius_mode != 0};
                float cy[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                const float2 by = s_tcb[lane][1], bs = s_tcb[lane][2], byl = s_tcb[lane][4], bsl = s_tcb[lane][5];
                mma_tf32(cx, afrag(2), bs.x, bs.y);
                mma_tf32(cx, afrag(2), bsl.x, bsl.y);
                mma_tf32(cy, afrag(1), by.x, by.y);
                mma_tf32(cy, afrag(1), byl.x, byl.y);
#pragma unroll
                for (int c = 0; c < 4; c += 3 - NHL) cy[c] = tc_prob(cx[c], cy[c], rc);  // NHL 1: D columns 2t
                const float2 bx = s_tcb[lane][0], bxl = s_tcb[lane][3];
#pragma unroll
                for (int c = 0; c < 4; c++) cx[c] = 0.0f;
                mma_tf32(cx, afrag(0), bx.x, bx.y);
                mma_tf32(cx, afrag(0), bxl.x, bxl.y);
#pragma unroll
                for (int c = 0; c < 4; c += 3 - NHL) cx[c] = tc_finish(cx[c], cy[c], rc);  // the radius
            }
#pragma unroll
            for (int j = 0; j < NHL; j++) {
                const int h = NHL * t + j;
                float add = 0.0f, vwa = 0.0f;
#pragma unroll
                for (int x = 0; x < 2; x++) {
                    float u = cx[2 * x + (NHL == 2 ? j : 0)];  // D (token g + 8x, column 2t + j)
                    const int v = NHL * x + j;
                    if (kbad[x] || vbad[x] || qbad[j] || ((ovf >> v) & 1u) || !(u == u)) u = INF;
                    if (!klive[x]) continue;
                    if (p[v] > 0.0f) add += p[v] * expm1_up_exp(u);
                    cu[j] = fmaxf(cu[j], u);
                    vwa += vwn[x] == INF ? INF : p[v] * vwn[x];
                    if (a.radius && h < qg)
                        a.radius[((int64_t)b * a.Hq + kvh * qg + h) * a.rad_n + t0 + g + 8 * x] = u;
                }
                ca[j] = (ca[j] == INF ? INF : ca[j] * alpha[j]) + add;
                cvw[j] = (cvw[j] == INF ? INF : cvw[j] * alpha[j]) + vwa;
            }
        }

        // ---- hand the tile's weights and V scales to the V warp (B layout: head g, tokens) --
        if constexpr (SPLIT) bar_sync(bar_empty, 64);  // the V warp has read the previous tile's
#pragma unroll
        for (int v = 0; v < NV; v++) s_p[pw][NHL * t + v % NHL][g + 8 * (v / NHL)] = p[v];
        if (g == 0) {
#pragma unroll
            for (int j = 0; j < NHL; j++) s_alpha[pw][NHL * t + j] = alpha[j];
        }
        if (t == 0) {
#pragma unroll
            for (int x = 0; x < 2; x++)
#pragma unroll
                for (int grp = 0; grp < NG; grp++)
                    s_vs[pw][g + 8 * x][grp] = (klive[x] && !vbad[x]) ? vsc[x][grp] : 0.0f;
        }
        if constexpr (SPLIT) bar_arrive(bar_full, 64); else __syncwarp();
    };
    // the K side's partials
    auto k_end = [&]() {
        // ---- this stream's K-side partials: reduce the lanes, write to shared memory -----------
#pragma unroll
        for (int j = 0; j < NHL; j++) {
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) {
                l_[j] += __shfl_xor_sync(FULL, l_[j], o);
                ca[j] += __shfl_xor_sync(FULL, ca[j], o);
                cvw[j] += __shfl_xor_sync(FULL, cvw[j], o);
                cu[j] = fmaxf(cu[j], __shfl_xor_sync(FULL, cu[j], o));
            }
        }
        for (int o = 1; o < 32; o <<= 1) cvmax = fmaxf(cvmax, __shfl_xor_sync(FULL, cvmax, o));
        if (g == 0) {
#pragma unroll
            for (int j = 0; j < NHL; j++) {
                const int h = NHL * t + j;
                if (h < QGP) {
                    s_red[pw][h][0] = m_[j]; s_red[pw][h][1] = l_[j]; s_red[pw][h][2] = ca[j];
                    s_red[pw][h][3] = cvw[j]; s_red[pw][h][4] = cu[j];
                }
            }
        }
        if (lane == 0) s_vmax[pw] = cvmax;
    };
    // one tile of the V side: the hand-off, the V dither, p.v
    auto v_tile = [&](int t0, uint32_t cur_row, uint32_t cur_w0, uint32_t cur_ep) {
        uint32_t vrow[4], vw0[4], vep[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int src = 2 * t + (k & 1) + 8 * (k >> 1);
            vrow[k] = __shfl_sync(FULL, cur_row, src);
            vw0[k] = __shfl_sync(FULL, cur_w0, src);
            vep[k] = __shfl_sync(FULL, cur_ep, src);
        }
        if constexpr (SPLIT) bar_sync(bar_full, 64);  // the K warp has written this tile's
        float pk[4], vsv[4][NG], rr[NG], inv[NG];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const int tok = 2 * t + (k & 1) + 8 * (k >> 1);
            pk[k] = s_p[pw][g][tok];
#pragma unroll
            for (int grp = 0; grp < NG; grp++) vsv[k][grp] = s_vs[pw][tok][grp];
        }
        const float alpha_g = s_alpha[pw][g];
        // the rescale of the accumulator columns (heads 2t, 2t + 1)
        const float al0 = s_alpha[pw][2 * t];
        const float al1 = s_alpha[pw][2 * t + 1];
        // the K side may write the next tile's hand-off
        if constexpr (SPLIT) { if (t0 + step < t_hi) bar_arrive(bar_empty, 64); } else __syncwarp();
        uint32_t bq[NG][2];
        bool rescale = false;
#pragma unroll
        for (int grp = 0; grp < NG; grp++) {
            float tm = fmaxf(fmaxf(vsv[0][grp], vsv[1][grp]), fmaxf(vsv[2][grp], vsv[3][grp]));
            tm = fmaxf(tm, __shfl_xor_sync(FULL, tm, 1));
            tm = fmaxf(tm, __shfl_xor_sync(FULL, tm, 2));
            float rn = fmaxf(rv[grp], tm);
            rn = rn > 0.0f ? rn : 1.0f;
            // approximate quotients (rn is 1 or an fp16 scale: normal): the operand and the rescale are
            // the output's float tier
            inv[grp] = rcp_approx(rn);
            rr[grp] = rv[grp] == rn ? 1.0f : rv[grp] * inv[grp];
            rv[grp] = rn;
            const __half2 h0 = __floats2half2_rn(pk[0] * (vsv[0][grp] * inv[grp]), pk[1] * (vsv[1][grp] * inv[grp]));
            const __half2 h1 = __floats2half2_rn(pk[2] * (vsv[2][grp] * inv[grp]), pk[3] * (vsv[3][grp] * inv[grp]));
            bq[grp][0] = h2bits(h0);
            bq[grp][1] = h2bits(h1);
            pvc[grp] = pvc[grp] * (alpha_g * rr[grp]) + ((__low2float(h0) + __high2float(h0)) + (__low2float(h1) + __high2float(h1)));
            rescale |= rr[grp] != 1.0f;
        }
        if (__any_sync(FULL, rescale || al0 != 1.0f || al1 != 1.0f)) {
#pragma unroll
            for (int i = 0; i < MT; i++) {
                const float f0 = al0 * rr[i / MPG], f1 = al1 * rr[i / MPG];
                acc[i][0] *= f0; acc[i][1] *= f1; acc[i][2] *= f0; acc[i][3] *= f1;
            }
        }
        // ---- values: per group, the runs of codes and dither of tokens 2t, 2t+1, 2t+8, 2t+9 --
        const __half2 c1152 = __float2half2_rn(1152.0f), c256 = __float2half2_rn(256.0f);
        const int m = g % SHARE;  // this lane's place among the lanes sharing a call
        const int8_t *vrun[4];    // the tokens' first channel of this lane's runs
#pragma unroll
        for (int k = 0; k < 4; k++) vrun[k] = a.vc + (int64_t)vrow[k] * HD + RUN * g;
#pragma unroll
        for (int grp = 0; grp < NG; grp++) {
            const int c0 = G * grp + RUN * g;  // the run's first channel
            uint32_t cw[4][RUN / 4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int8_t *src = vrun[k] + G * grp;
                if constexpr (RUN == 4) {
                    cw[k][0] = __ldg(reinterpret_cast<const unsigned int *>(src));
                } else if constexpr (RUN == 8) {
                    const uint2 u = __ldg(reinterpret_cast<const uint2 *>(src));
                    cw[k][0] = u.x; cw[k][1] = u.y;
                } else {
                    const uint4 u = __ldg(reinterpret_cast<const uint4 *>(src));
                    cw[k][0] = u.x; cw[k][1] = u.y; cw[k][2] = u.z; cw[k][3] = u.w;
                }
            }
            // the dither words of the run: dw[k][w], w < WPR
            uint32_t dw[4][WPR];
            if constexpr (SHARE == 1) {
#pragma unroll
                for (int k = 0; k < 4; k++)
#pragma unroll
                    for (int cc = 0; cc < CPR; cc++) {
                        const uint4 w = philox(vw0[k], lh, (1u << 31) | (uint32_t)(c0 / CPC + cc), vep[k], a.key0, a.key1);
                        dw[k][4 * cc] = w.x; dw[k][4 * cc + 1] = w.y; dw[k][4 * cc + 2] = w.z; dw[k][4 * cc + 3] = w.w;
                    }
            } else {
                // member m (of the SHARE lanes g - m .. g - m + SHARE - 1, same t) computes the
                // calls of tokens m + SHARE q (q < 4 / SHARE) and needs words m WPR .. m WPR + WPR - 1
                // of every token's call: a transpose across the members, by xor butterflies
                // (share_words), the members' places as two predicates
                const uint32_t chunk = (1u << 31) | (uint32_t)(c0 / CPC);
                uint4 wq[4 / SHARE];
#pragma unroll
                for (int q = 0; q < 4 / SHARE; q++) {
                    uint32_t w0s = vw0[SHARE * q], eps = vep[SHARE * q];
#pragma unroll
                    for (int mm = 1; mm < SHARE; mm++) {  // token m + SHARE q, by selects
                        w0s = m == mm ? vw0[mm + SHARE * q] : w0s;
                        eps = m == mm ? vep[mm + SHARE * q] : eps;
                    }
                    wq[q] = philox(w0s, lh, chunk, eps, a.key0, a.key1);
                }
                share_words(wq, dw, m);
            }
            // A operands of the group's m-tiles: channel 2e + h of the run is row g + 8h of
            // m-tile MPG grp + e; tokens (2t, 2t+1) and (2t+8, 2t+9)
            // at b = 8 the codes' B is 256 B and the plane's -B (v_end: the offset), once per group
            const uint32_t bc0 = BITS == 8 ? h2bits(__hmul2(bits2h(bq[grp][0]), c256)) : bq[grp][0];
            const uint32_t bc1 = BITS == 8 ? h2bits(__hmul2(bits2h(bq[grp][1]), c256)) : bq[grp][1];
#pragma unroll
            for (int e = 0; e < MPG; e++) {
                const int i = MPG * grp + e;
                uint32_t ac[4], ap0[4], ap1[4];
#pragma unroll
                for (int r4 = 0; r4 < 4; r4++) {
                    const int h = r4 & 1, kk = r4 >> 1;  // a0 (g, 2t..), a1 (g+8, 2t..), a2 (g, 2t+8..), a3
                    const int b = 2 * e + h;
                    ac[r4] = h2bits(__hsub2(byte_pair(cw[2 * kk][b >> 2], cw[2 * kk + 1][b >> 2], b & 3, 0x00800080u), c1152));
                    if constexpr (BITS == 8) {  // 1024 + r as it is: its weight -B and the codes' 256 B scale it
                        ap0[r4] = h2bits(byte_pair(dw[2 * kk][b >> 2], dw[2 * kk + 1][b >> 2], b & 3, 0u));
                    } else {
                        // channel b of the run: half b % 2 of word b / 2; plane p is byte 2 (b % 2) + p
                        const __half2 sc0 = __float2half2_rn(-0.0000152587890625f), off0 = __float2half2_rn(0.017578125f);
                        const __half2 sc1 = __float2half2_rn(-0.00390625f), off1 = __float2half2_rn(4.5f);
                        ap0[r4] = h2bits(__hfma2(byte_pair(dw[2 * kk][b >> 1], dw[2 * kk + 1][b >> 1], 2 * (b & 1), 0u), sc0, off0));
                        ap1[r4] = h2bits(__hfma2(byte_pair(dw[2 * kk][b >> 1], dw[2 * kk + 1][b >> 1], 2 * (b & 1) + 1, 0u), sc1, off1));
                    }
                }
                mma_f16(acc[i], ac, bc0, bc1);
                if constexpr (BITS == 8) {  // acc += 256 B n - B (1024 + r)
                    mma_f16(acc[i], ap0, bq[grp][0] ^ 0x80008000u, bq[grp][1] ^ 0x80008000u);
                } else {
                    mma_f16(acc[i], ap0, bq[grp][0], bq[grp][1]);
                    mma_f16(acc[i], ap1, bq[grp][0], bq[grp][1]);
                }
            }
        }
    };
    auto v_end = [&]() {
        // ---- this stream's p.v partials --------------------------------------------------------
#pragma unroll
        for (int grp = 0; grp < NG; grp++) {
            pvc[grp] += __shfl_xor_sync(FULL, pvc[grp], 1);
            pvc[grp] += __shfl_xor_sync(FULL, pvc[grp], 2);
            if (t == 0) s_pvc[pw][g][grp] = pvc[grp];
        }
        __syncwarp();
        // out[h][c] = (acc - C_b 2^-(b+1) S) r_g for channel c = ch(i, row) of head h, S the sum of the
        // operand B; at b = 8 acc = sum B (256 (n - xi) - 1151.5), so (2^-8 acc + 1151.5 / 256 S) r_g
        const float vscale = BITS == 8 ? 0.00390625f : 1.0f;
        const float cshift = BITS == 8 ? -4.498046875f : CB / ROWF;
#pragma unroll
        for (int i = 0; i < MT; i++) {
            const int grp = i / MPG, e = i % MPG;
#pragma unroll
            for (int r4 = 0; r4 < 4; r4++) {
                const int h = 2 * t + (r4 & 1), row = r4 >> 1;
                const int c = G * grp + RUN * g + 2 * e + row;
                if (h < qg) s_acc[pw][h][c] = (acc[i][r4] * vscale - cshift * s_pvc[pw][h][grp]) * rv[grp];
            }
        }
    };
    if (vside) {  // (SPLIT only)
        if (first < t_hi) bar_arrive(bar_empty, 64);  // the hand-off buffer starts free
        for (int t0 = first; t0 < t_hi; t0 += step) {
            uint32_t cur_row, cur_w0, cur_ep;
            advance(t0, cur_row, cur_w0, cur_ep);
            v_tile(t0, cur_row, cur_w0, cur_ep);
        }
        v_end();
    } else {
        for (int t0 = first; t0 < t_hi; t0 += step) {
            uint32_t cur_row, cur_w0, cur_ep;
            advance(t0, cur_row, cur_w0, cur_ep);
            k_tile(t0, cur_row, cur_w0, cur_ep);
            if constexpr (!SPLIT) v_tile(t0, cur_row, cur_w0, cur_ep);
        }
        k_end();
        if constexpr (!SPLIT) v_end();
    }
    __syncthreads();

    // ---- merge the streams -------------------------------------------------------------------
    for (int idx = tid; idx < qg * HD; idx += NW * 32) {
        const int h = idx / HD, c = idx % HD;
        float mm = -INF;
        for (int w = 0; w < NP; w++) mm = fmaxf(mm, s_red[w][h][0]);
        float o = 0.0f;
        for (int w = 0; w < NP; w++) {
            const float mw = s_red[w][h][0];
            if (mw != -INF) o += s_acc[w][h][c] * exp_acc(mw - mm);
        }
        const int64_t part = ((int64_t)b * a.Hq + kvh * qg + h) * a.num_splits_grid + split;
        a.pacc[part * HD + c] = o;
    }
    if (tid < qg) {
        const int h = tid;
        float mm = -INF;
        for (int w = 0; w < NP; w++) mm = fmaxf(mm, s_red[w][h][0]);
        float ll = 0.0f, aa = 0.0f, vv = 0.0f, uu = 0.0f, vm = 0.0f;
        for (int w = 0; w < NP; w++) {
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

// sizeof(Args): the ctypes mirror's size must match (tests/test_cuda_build.py, no GPU needed)
extern "C" int wc_decode_args_bytes() { return (int)sizeof(Args); }

extern "C" int wc_decode_launch(const Args *a, int grid_x, int grid_y, cudaStream_t stream) {
    wc_decode_split<<<dim3(grid_x, grid_y), NW * 32, 0, stream>>>(*a);
    return (int)cudaGetLastError();
}
