/* Fused CPU extend (chunked prefill, prefix reuse) over witcert's paged dithered-INT8 pool,
 * with a certificate per (new token, query head).
 *
 * wc_extend: B sequences in one call. Sequence b has q_len[b] new tokens (rows q_start[b],
 * q_start[b] + 1, ... of q, k_new, v_new, out, lse, cert) and prefix_len[b] tokens already in
 * the pool (token t at slot block_table[b, t / P] * P + t % P). New token i attends to the
 * whole prefix (dither and dequantized K/V bitwise the reference: common.h) and to the new
 * tokens j <= i (causal) or all of them (causal = 0), read exactly from k_new / v_new.
 * Spec: witcert.ref.extend.extend_attention_cert.
 *
 * Pool-read extend (pool_read = 1; the spec's new_from_pool, the consistent reads of the
 * position-keyed dither): the step's new tokens are already in the pool, so prefix_len[b]
 * counts them (its last q_len[b] tokens) and new token j of sequence b sees the pool tokens
 * t < prefix_len[b] - q_len[b] + j + 1, all of them read compressed; k_new / v_new are not
 * read. It is the prefix phase with a per-row visible-token limit: tokens past a row's limit
 * get weight 0 and add nothing to its certificate, maximum or lse (they are simply absent:
 * the same bits as a call whose pool ends at the row's last visible token), and the union
 * bound of a row covers its visible tokens. The new-token phase is skipped.
 *
 * Work items are (sequence, KV head, chunk of new tokens). An item forms the logits of its
 * rows (the chunk's new tokens x the GQA group's R query heads) against every key it sees,
 * tile by tile: a prefix tile is dequantized once per item for all rows, or once per call
 * when several items read the sequence (the wcx_kv cache, loaded by a first pass of the
 * threads, within WCX_KV_BUDGET; the same loaders, so the same bits). Then, per row, the
 * max-shifted softmax weights and the certificate sum a = sum_t exp(z_t - m) expm1(u_t),
 * and a pass over V for the output. Softmax and certificate are float64; the logits' dots
 * and the value pass run in fp32 (arith32 = 1, the default of the launcher: extend_math.h's
 * dots32_tile / accumulate32_tile, logits fl64(sm dot32)) or in float64 (arith32 = 0). The
 * radii are (docs/PROOFS.md 5.3; the constants come from witcert.ref.arith.native_f32_model
 * or native_model through the arguments): stored tokens, the compression radius plus the
 * arithmetic slack with S_t = 127.5 sum_g ||q_g||_1 s_g; new tokens, the slack alone with
 * S = ||q||_2 ||k||_2.
 *
 * +inf patterns (as the reference): a flagged prefix token (a non-finite scale or witness on
 * either side) reads K = 0 / V = 0 and has radius +inf; a new token whose K or V row holds a
 * non-finite value reads that row as 0 and has radius +inf; a query head with a non-finite
 * entry is attended with those entries zeroed and gets cert = +inf.
 *
 * Every sum runs in a fixed order (the float64 dots: one accumulator per (row, token), over
 * d in order; the fp32 dots: eight partial sums of fixed channels, combined as a fixed tree;
 * the output: over tokens in order (fp32: per 16-token tile, then added in float64); the
 * softmax sums: four lanes, token t in lane t mod 4), so threads, the AVX2 clone and the
 * AVX-512 instantiation (wider kernels, chosen at run time) give the same bits as the portable
 * build. One exception, by design: with bf16_dots, on a CPU with AVX512-BF16, the exact new
 * tokens' dots of bf16 operands run as bf16 pairs (dotsbf_tile16: another order of roundings
 * with its own, larger slack, witcert.ref.arith.native_bf16_model), so those logits differ
 * from other CPUs' in their last bits; such an item's value pass over the exact new tokens
 * then multiplies bf16-rounded weights by bf16 values (accumulatebf_rows: the output's float
 * tier of bf16 attention, docs/PROOFS.md 5.3) where every value it reads is a bf16 number
 * (WITCERT_NATIVE_EXTEND_BF16=off restores the common bits). No FMA contraction
 * (-ffp-contract=off), so every product and sum is the one PROOFS.md 5.3 bounds.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "common.h"
#include "extend_math.h"


#define WCX_MAX_ROWS 128        /* rows (new tokens x R query heads) of one work item */
#define WCX_ZU_BUDGET (1 << 19) /* doubles of an item's logits (and again of its radii) */
#define WCX_MAX_KEYS (1 << 22)  /* keys of a row: sum_rel = 2^-28 assumes fewer */
#ifndef WCX_KV_BUDGET /* bytes of the per-call cache of keys and values (wcx_kv) */
#define WCX_KV_BUDGET ((int64_t)256 << 20)
#endif

typedef struct {
    const float *q;              /* f32 [rows, Hq, D], contiguous */
    const float *k_new, *v_new;  /* f32 [rows, Hkv, D], contiguous: the new tokens' exact K/V */
    wc_side k, v;
    const int64_t *epochs;       /* int64 [num_slots] */
    const int64_t *positions;    /* int64 [num_slots] (position-keyed dither), or NULL */
    const int32_t *block_table;  /* int32 [B, pages], row stride bt_s0: the prefix slots */
    const int32_t *q_start;      /* int32 [B]: first row of sequence b */
    const int32_t *q_len;        /* int32 [B]: its new tokens (>= 0) */
    const int32_t *prefix_len;   /* int32 [B]: its prefix tokens (>= 0) */
    const double *delta_loc;     /* f64 [rows] in (0, 1), per new token (prob / min only) */
    float *out;                  /* f32 [rows, Hq, D] (rows of the B sequences written) */
    float *lse;                  /* f32 [rows, Hq], or NULL */
    float *cert;                 /* f32 [rows, Hq], or NULL (no certificate, no radii) */
    int64_t num_slots, bt_s0, pages, rows;
    double sm_scale;
    uint32_t key0, key1;         /* Philox key: seed low 32 bits, high 32 bits */
    int32_t B, Hq, Hkv, D, G, page_size, layer, bits, radius, num_threads, causal, rounds;
    int32_t pool_read;           /* 1: the pool-read extend (header); needs causal = 1 */
    /* witcert.ref.arith.native_model: u_arith = arith_rel_s sm S_t + arith_abs +
     * softmax_slack; cert = (1 + sum_rel) a / l + N exp(2 U - tail_gap) */
    double arith_rel_s, arith_abs, softmax_slack, tail_gap, sum_rel;
    int64_t dbg_n;               /* row length of the debug outputs below */
    float *dbg_radius;           /* f32 [rows, Hq, dbg_n] whole radii (rounded up), or NULL */
    double *dbg_logits;          /* f64 [rows, Hq, dbg_n] logits used, or NULL */
    /* 1: the fp32 arithmetic (the dots in fp32, witcert.ref.arith.native_f32_model's
     * constants above; the value pass in fp32 per tile); 0: float64 (native_model) */
    int32_t arith32;
    /* 1 (with arith32): the exact new tokens' dots may run in bf16 pairs (dotsbf_tile16)
     * where the CPU has AVX512-BF16, sm_scale <= WCX_SMBF_MAX and every query of the item and
     * key of the tile is a bf16 number (wcx_bf16_exact); those rows' new-token radii then take
     * arith_rel_s_bf16 (witcert.ref.arith.native_bf16_model) instead of arith_rel_s */
    int32_t bf16_dots;
    double arith_rel_s_bf16;
} wc_extend_args;

typedef struct {
    int b, kvh, i0, i1; /* new tokens [i0, i1) of sequence b, KV head kvh */
} wcx_item;

/* Per-thread scratch, sized for the largest item. */
typedef struct {
    double *q;            /* [rows, D]: queries (non-finite entries zeroed) */
    float *q32;           /* [rows, D]: the same, fp32 (exact) */
    double *qnorm;        /* [rows]: ||q||_2 */
    double *qn2, *qn1;    /* [rows, NG] group norms */
    double *lf, *l;       /* [rows]: union-bound factor, sum of the weights */
    uint8_t *qbad;        /* [rows] */
    double *z, *u;        /* [rows, keys]: logits then weights; whole radii (prefix tokens) */
    double *unew;         /* [rows]: the one radius of the row's exact new tokens */
    double *acc;          /* [rows, D] */
    uint32_t *s32, *ep;   /* [prefix]: Philox counter words 0 (slot or position) and 3 */
    int64_t *slot;        /* [prefix] */
    uint8_t *vflag;       /* [prefix]: V reads 0 */
    uint8_t *nvbad;       /* [new]: the new token's V row reads 0 */
    uint32_t *qbf;        /* [rows, D/2]: the queries' bf16 pairs (bf: the call's route) */
    int bf;               /* the call may take the bf16 dots (wc_extend: args, CPU, scale) */
    int qbf_ok;           /* the item's queries are all bf16 numbers (qbf valid) */
} wcx_scratch;

static void scratch_free(wcx_scratch *s) {
    free(s->q); free(s->q32); free(s->qnorm); free(s->qn2); free(s->qn1); free(s->lf); free(s->l);
    free(s->qbad);
    free(s->z); free(s->u); free(s->unew); free(s->acc); free(s->s32); free(s->ep); free(s->slot);
    free(s->vflag); free(s->nvbad); free(s->qbf);
}

static int scratch_alloc(wcx_scratch *s, int rows, int D, int NG, int64_t keys, int64_t np,
                         int64_t nt) {
    size_t r = (size_t)rows, k = (size_t)(keys > 0 ? keys : 1);
    size_t p = (size_t)(np > 0 ? np : 1), n = (size_t)(nt > 0 ? nt : 1);
    memset(s, 0, sizeof *s);
    s->q = malloc(sizeof(double) * r * D);
    s->q32 = malloc(sizeof(float) * r * D);
    s->qnorm = malloc(sizeof(double) * r);
    s->qn2 = malloc(sizeof(double) * r * NG);
    s->qn1 = malloc(sizeof(double) * r * NG);
    s->lf = malloc(sizeof(double) * r);
    s->l = malloc(sizeof(double) * r);
    s->qbad = malloc(r);
    s->z = malloc(sizeof(double) * r * k);
    s->u = malloc(sizeof(double) * r * k);
    s->unew = malloc(sizeof(double) * r);
    s->acc = malloc(sizeof(double) * r * D);
    s->s32 = malloc(sizeof(uint32_t) * p);
    s->ep = malloc(sizeof(uint32_t) * p);
    s->slot = malloc(sizeof(int64_t) * p);
    s->vflag = malloc(p);
    s->nvbad = malloc(n);
    s->qbf = malloc(sizeof(uint32_t) * r * (size_t)(D / 2 > 0 ? D / 2 : 1));
    if (!s->qbf || !s->q || !s->q32 || !s->qnorm || !s->qn2 || !s->qn1 || !s->lf || !s->l || !s->qbad ||
        !s->z || !s->u || !s->unew ||
        !s->acc || !s->s32 || !s->ep || !s->slot || !s->vflag || !s->nvbad) {
        scratch_free(s);
        return WC_ERR_NOMEM;
    }
    return WC_OK;
}

/* ---- Tile loaders: the keys and values of one tile of 16 tokens ------------------------
 * Called per item (the plain path) or once per call into the per-(sequence, KV head) cache
 * (wcx_kv, when several items read the same keys): the same code either way, so the same
 * bits. Tokens past tn read as 0. */

/* Prefix tile t0 (tn tokens) of sequence b at KV head kvh: per token i < tn its slot,
 * Philox counter words and V flag (slot[i], s32[i], ep[i], vflag[i]); K scales and
 * witnesses [NG][WC_TILE] (0 where flagged or past tn) and flag[i] (K or V flagged) for the
 * radii; the dequantized keys kT [D][WC_TILE] (a flagged key reads 0, so its logit is 0). */
WCX_BODY int k_tile(const wc_extend_args *a, int b, int kvh, int t0, int tn, uint32_t *s32,
                    uint32_t *ep, int64_t *slots, uint8_t *vflag, float *ksT, float *kwT,
                    uint8_t *flag, double *kT) {
    const int D = a->D, G = a->G, NG = D / G, P = a->page_size;
    const uint32_t c1 = ((uint32_t)a->layer << 16) | (uint32_t)kvh;
    const int32_t *bt = a->block_table + (int64_t)b * a->bt_s0;
    const int cpc = wc_cpc(a->bits), nch = (D + cpc - 1) / cpc;
    wc_words wb;
    float ks[WC_MAX_NG], kw[WC_MAX_NG], vs[WC_MAX_NG], vw[WC_MAX_NG], kst[WC_TILE * WC_MAX_NG];
    float row[WC_MAX_D];
    uint8_t kflag[WC_TILE];
    memset(ksT, 0, sizeof(float) * (size_t)NG * WC_TILE);
    memset(kwT, 0, sizeof(float) * (size_t)NG * WC_TILE);
    for (int i = 0; i < tn; i++) {
        const int t = t0 + i;
        const int64_t slot = (int64_t)bt[t / P] * P + t % P;
        if (slot < 0 || slot >= a->num_slots) return WC_ERR_SLOT;
        const int err = wc_counter_words(a->positions, a->epochs, slot, &s32[i], &ep[i]);
        if (err) return err;
        slots[i] = slot;
        int kb = wc_load_groups(a->k.scales, a->k.scales_s0, a->k.scales_s1, slot, kvh, NG, ks);
        kb |= wc_load_groups(a->k.wit, a->k.wit_s0, a->k.wit_s1, slot, kvh, NG, kw);
        int vb = wc_load_groups(a->v.scales, a->v.scales_s0, a->v.scales_s1, slot, kvh, NG, vs);
        vb |= wc_load_groups(a->v.wit, a->v.wit_s0, a->v.wit_s1, slot, kvh, NG, vw);
        kflag[i] = (uint8_t)kb;
        vflag[i] = (uint8_t)vb;
        flag[i] = (uint8_t)(kb | vb);
        memcpy(kst + i * NG, ks, sizeof(float) * NG);
        if (!flag[i])
            for (int g = 0; g < NG; g++) {
                ksT[g * WC_TILE + i] = ks[g];
                kwT[g * WC_TILE + i] = kw[g];
            }
    }
    wc_words_tile(tn, s32, ep, c1, 0u, nch, a->key0, a->key1, a->rounds, &wb);
    for (int i = 0; i < WC_TILE; i++) {
        if (i >= tn || kflag[i]) { /* a flagged key reads as 0, so its logit is 0 */
            for (int d = 0; d < D; d++) kT[d * WC_TILE + i] = 0.0;
            continue;
        }
        wc_dequant(a->bits, a->k.codes + slots[i] * a->k.codes_s0 + (int64_t)kvh * a->k.codes_s1,
                   &wb, (size_t)i * nch * cpc, kst + i * NG, D, G, row);
        for (int d = 0; d < D; d++) kT[d * WC_TILE + i] = (double)row[d];
    }
    return WC_OK;
}

/* The dequantized values vt [WC_TILE][D] of a prefix tile (tn tokens; slot, Philox words
 * and V flag per token from k_tile; a flagged V reads as 0). */
WCX_BODY void v_tile(const wc_extend_args *a, int kvh, int tn, const uint32_t *s32,
                     const uint32_t *ep, const int64_t *slots, const uint8_t *vflag, double *vt) {
    const int D = a->D, G = a->G, NG = D / G;
    const uint32_t c1 = ((uint32_t)a->layer << 16) | (uint32_t)kvh;
    const int cpc = wc_cpc(a->bits), nch = (D + cpc - 1) / cpc;
    wc_words wb;
    float vs[WC_MAX_NG], row[WC_MAX_D];
    wc_words_tile(tn, s32, ep, c1, 1u, nch, a->key0, a->key1, a->rounds, &wb);
    for (int i = 0; i < WC_TILE; i++) {
        double *vr = vt + (size_t)i * D;
        if (i >= tn || vflag[i]) { /* a flagged V reads as 0 */
            for (int d = 0; d < D; d++) vr[d] = 0.0;
            continue;
        }
        wc_load_groups(a->v.scales, a->v.scales_s0, a->v.scales_s1, slots[i], kvh, NG, vs);
        wc_dequant(a->bits, a->v.codes + slots[i] * a->v.codes_s0 + (int64_t)kvh * a->v.codes_s1,
                   &wb, (size_t)i * nch * cpc, vs, D, G, row);
        for (int d = 0; d < D; d++) vr[d] = (double)row[d];
    }
}

/* The row of new token j (sequence row `base + j`) of k_new or v_new at KV head kvh; 1 if it
 * holds a non-finite value (it then reads as 0). */
static inline int new_row(const wc_extend_args *a, const float *src, int64_t base, int j, int kvh,
                          const float **row) {
    const float *r = src + ((base + j) * a->Hkv + kvh) * (int64_t)a->D;
    int bad = 0;
    for (int d = 0; d < a->D; d++) bad |= !isfinite(r[d]);
    *row = r;
    return bad;
}

/* New-token key tile j0 (tn tokens) of sequence b at KV head kvh: kT [D][WC_TILE], the norms
 * knorm[i] = ||k||_2 (float64, over d in order), flag[i] (K or V row non-finite; 1 past tn),
 * nvbad[i] (the V row reads 0). */
WCX_BODY void nk_tile(const wc_extend_args *a, int b, int kvh, int j0, int tn, double *kT,
                      double *knorm, uint8_t *flag, uint8_t *nvbad) {
    const int D = a->D;
    const int64_t base = a->q_start[b];
    for (int i = 0; i < WC_TILE; i++) {
        const float *kr = NULL, *vr = NULL;
        int kb = 1;
        flag[i] = 1;
        if (i < tn) {
            kb = new_row(a, a->k_new, base, j0 + i, kvh, &kr);
            const int vb = new_row(a, a->v_new, base, j0 + i, kvh, &vr);
            nvbad[i] = (uint8_t)vb;
            flag[i] = (uint8_t)(kb | vb);
        }
        double k2 = 0.0;
        for (int d = 0; d < D; d++) {
            const double x = kb ? 0.0 : (double)kr[d];
            kT[d * WC_TILE + i] = x;
            k2 += x * x;
        }
        knorm[i] = sqrt(k2);
    }
}

/* The new tokens' values vt [WC_TILE][D] of tile j0 (a non-finite V row reads as 0). */
WCX_BODY void nv_tile(const wc_extend_args *a, int b, int kvh, int j0, int tn,
                      const uint8_t *nvbad, double *vt) {
    const int D = a->D;
    const int64_t base = a->q_start[b];
    for (int i = 0; i < WC_TILE; i++) {
        double *vr = vt + (size_t)i * D;
        if (i >= tn || nvbad[i]) {
            for (int d = 0; d < D; d++) vr[d] = 0.0;
            continue;
        }
        const float *src = a->v_new + ((base + j0 + i) * a->Hkv + kvh) * (int64_t)D;
        for (int d = 0; d < D; d++) vr[d] = (double)src[d];
    }
}

/* The keys and values of one (sequence, KV head), loaded once per call when several items
 * read them (the tiles of k_tile / v_tile / nk_tile / nv_tile, whole: a tile's tokens past
 * an item's own limit are real tokens here, and the phases ignore or zero them). */
typedef struct {
    double *pk, *pv;      /* prefix: [tiles][D][WC_TILE] keys, [tiles][WC_TILE][D] values */
    float *pks, *pkw;     /* [tiles][NG][WC_TILE] K scales / witnesses for the radii */
    uint8_t *pflag;       /* [tiles * WC_TILE] K or V flagged */
    double *nk, *nv;      /* new tokens: the same layouts */
    double *nnorm;        /* [tiles * WC_TILE] ||k||_2 */
    uint8_t *nflag, *nvbad;
    float *pk32, *pv32;   /* arith32: fp32 copies of pk, pv, nk, nv (exact), else NULL */
    float *nk32, *nv32;
    uint32_t *nkbf;       /* the call's bf16 route: nk32's tiles in pairs [tiles][D/2][WC_TILE] */
    uint8_t *nbfok;       /* [tiles]: every key of the tile is a bf16 number (nkbf usable) */
    uint32_t *nvbf;       /* the call's bf16 route, D % 16 == 0: nv32's tiles in token pairs
                           * [tiles][WC_TILE/2][D] (wcx_bf16_rowpairs), or NULL */
    uint8_t *nvbfok;      /* [tiles]: every value of the tile is a bf16 number (nvbf usable) */
} wcx_kv;

/* The tile's values for tokens < tn: the cached tile itself when it is whole, else a copy
 * with the rows past tn zeroed (as the loaders give them). */
static inline const double *kv_vt(const double *vt, int tn, int D, double *buf) {
    if (tn == WC_TILE) return vt;
    memcpy(buf, vt, sizeof(double) * (size_t)tn * D);
    memset(buf + (size_t)tn * D, 0, sizeof(double) * (size_t)(WC_TILE - tn) * D);
    return buf;
}

/* kv_vt of an fp32 value tile (NULL stays NULL). */
static inline const float *kv_vt32(const float *vt, int tn, int D, float *buf) {
    if (!vt || tn == WC_TILE) return vt;
    memcpy(buf, vt, sizeof(float) * (size_t)tn * D);
    memset(buf + (size_t)tn * D, 0, sizeof(float) * (size_t)(WC_TILE - tn) * D);
    return buf;
}

/* dst[i] = (float)src[i], i < n (exact: the tiles hold fp32 values). */
static inline void to_f32(const double *restrict src, float *restrict dst, int n) {
    for (int i = 0; i < n; i++) dst[i] = (float)src[i];
}

/* The fp32 dots serve scales up to 2^40: their underflow term sm D 2^-150 then stays below
 * the model's abs_err 2^-100 (witcert.ref.arith.native_f32_model); larger scales take the
 * float64 dots, whose error the same (larger) radius covers. */
#define WCX_SM32_MAX 0x1p40
/* The bf16 dots serve scales up to 2^16: their flushes to zero (at most 2 D of them, each
 * below 2^-126, docs/PROOFS.md 5.3) then add at most sm 2 D 2^-126 <= 2^-101 to a logit,
 * inside the model's abs_err 2^-100 (D <= 256). */
#define WCX_SMBF_MAX 0x1p16

/* Logits z[r * zs + i] of rows [0, nrows) (q, q32: their float64 / fp32 copies) against a key
 * tile kT [D][WC_TILE] (float64 copies of fp32 values, 0 past tn; kT32: its fp32 copy, or NULL
 * to convert here, exactly): the fp32 dots (arith32) or the float64 ones. */
WCX_BODY void tile_logits(const wc_extend_args *a, int nrows, const double *q, const float *q32,
                          const double *kT, const float *kT32, double *z, int64_t zs, int tn,
                          const int wide) {
    const int D = a->D;
    if (a->arith32 && a->sm_scale <= WCX_SM32_MAX) {
        float buf[WC_MAX_D * WC_TILE];
        const float *k32 = kT32;
        if (!k32) to_f32(kT, buf, D * WC_TILE);
        if (!k32) k32 = buf;
        if (wide) dots32_tile16(nrows, D, q32, q, k32, a->sm_scale, z, zs, tn);
        else dots32_tile(nrows, D, q32, q, k32, a->sm_scale, z, zs, tn);
        return;
    }
    if (wide) dots_tile8(nrows, D, q, kT, a->sm_scale, z, zs, tn);
    else dots_tile(nrows, D, q, kT, a->sm_scale, z, zs, tn);
}

/* acc[r] += the weights z[r * zs + i] (i < tn) times a value tile vt [WC_TILE][D] (rows past
 * tn zero; vt32 its fp32 copy or NULL) for the rows [r0, nrows): per tile in fp32 (arith32) or
 * in float64. */
WCX_BODY void tile_values(const wc_extend_args *a, double *acc, const double *z, int64_t zs,
                          int tn, const double *vt, const float *vt32, int r0, int nrows,
                          const int wide) {
    const int D = a->D;
    if (a->arith32) {
        float buf[WC_TILE * WC_MAX_D];
        const float *v32 = vt32;
        if (!v32) to_f32(vt, buf, WC_TILE * D);
        if (!v32) v32 = buf;
        if (wide) accumulate32_tile16(acc, z, zs, tn, v32, r0, nrows, D);
        else accumulate32_tile(acc, z, zs, tn, v32, r0, nrows, D);
        return;
    }
    if (wide) accumulate_tile8(acc, z, zs, tn, vt, r0, nrows, D);
    else accumulate_tile(acc, z, zs, tn, vt, r0, nrows, D);
}

/* Prefix keys: slots, flags, radii and logits of every prefix token for the item's rows
 * (kv: the call's cache of this (sequence, KV head), or NULL: load the tiles here). */
WCX_BODY int keys_prefix_t(const wc_extend_args *a, const wcx_item *it, int rows, int np,
                          int64_t nk, const wc_radius_consts *rc, wcx_scratch *s,
                          const wcx_kv *kv, const int wide) {
    const int D = a->D, NG = D / a->G;
    float ksT_[WC_MAX_NG * WC_TILE], kwT_[WC_MAX_NG * WC_TILE];
    double kT_[WC_MAX_D * WC_TILE];
    uint8_t flag_[WC_TILE];
    for (int t0 = 0; t0 < np; t0 += WC_TILE) {
        const int tn = np - t0 < WC_TILE ? np - t0 : WC_TILE;
        const float *ksT = ksT_, *kwT = kwT_;
        const double *kT = kT_;
        const float *kT32 = NULL;
        const uint8_t *flag = flag_;
        if (kv) {
            const size_t tile = (size_t)(t0 / WC_TILE);
            ksT = kv->pks + tile * NG * WC_TILE;
            kwT = kv->pkw + tile * NG * WC_TILE;
            kT = kv->pk + tile * D * WC_TILE;
            kT32 = kv->pk32 ? kv->pk32 + tile * D * WC_TILE : NULL;
            flag = kv->pflag + t0;
        } else {
            const int err = k_tile(a, it->b, it->kvh, t0, tn, s->s32 + t0, s->ep + t0,
                                   s->slot + t0, s->vflag + t0, ksT_, kwT_, flag_, kT_);
            if (err) return err;
        }
        if (a->cert && wide)
            wcx_radius_rows8(rc, rows, NG, tn, s->qn2, s->qn1, s->lf, kwT, ksT, flag, s->u + t0, nk);
        else if (a->cert)
            wc_radius_rows(rc, rows, NG, tn, s->qn2, s->qn1, s->lf, kwT, ksT, flag, s->u + t0, nk);
        tile_logits(a, rows, s->q, s->q32, kT, kT32, s->z + t0, nk, tn, wide);
    }
    return WC_OK;
}

/* The coefficient of the dot bound in a new token's slack, cs qnorm kmax (keys_new_t): the
 * fp32 dots' (arith_rel_s) or, once a row saw a tile through the bf16 dots, the larger
 * arith_rel_s_bf16 (checked >= arith_rel_s), times sm and the radius inflation. */
static inline double new_slack_coef(const wc_extend_args *a, int bf) {
    return (bf ? a->arith_rel_s_bf16 : a->arith_rel_s) * a->sm_scale * WC_RADIUS_INFLATE;
}

/* A row's one radius for its exact new tokens (keys_new_t): the slack cs qnorm kmax + c0 of
 * the largest live new key's norm kmax, +inf once one of its new keys is flagged. */
static inline double new_radius(int kbad, double cs, double qnorm, double kmax, double c0) {
    return kbad ? INFINITY : cs * qnorm * kmax + c0;
}

/* New-token keys j < jn: logits and (with the certificate) the one radius of each row's exact
 * new tokens, unew[row]: the arithmetic slack alone (exact keys: no compression radius) with
 * the dot bound S = ||q||_2 max_j ||k_j||_2 >= sum_i |q_i| |k_{j,i}| over the row's live new
 * keys j (Cauchy-Schwarz; a few roundings of the norms, inside WC_RADIUS_INFLATE), +inf when
 * one of them is flagged. One radius per row instead of one per (row, key): the certificate's
 * share of the new tokens is then their weights' sum times one expm1 (softmax_rows_t), and
 * the term it bounds, rel_s sm S, stays far below the softmax's own slack at ordinary
 * magnitudes (docs/PROOFS.md 5.3). */
WCX_BODY void keys_new_t(const wc_extend_args *a, const wcx_item *it, int rows, int np, int jn,
                        int64_t nk, wcx_scratch *s, const wcx_kv *kv, const int wide) {
    const int D = a->D, R = a->Hq / a->Hkv;
    /* the bf16 dots: the call's route, the item's queries and the cache's pairs (per tile) */
    const int bfi = WCX_BF16 && wide && s->bf && s->qbf_ok && kv && kv->nkbf;
    int bfany = 0; /* whether a tile so far took them (its rows' slack: arith_rel_s_bf16) */
    (void)bfi;
    const double c0 = a->arith_abs + a->softmax_slack;
    double kT_[WC_MAX_D * WC_TILE], knorm_[WC_TILE];
    uint8_t flag_[WC_TILE];
    double kmax = 0.0; /* the largest norm of the new keys so far (token order), */
    int kbad = 0;      /* and whether one of them is flagged */
    for (int j0 = 0; j0 < jn; j0 += WC_TILE) {
        const int tn = jn - j0 < WC_TILE ? jn - j0 : WC_TILE;
        /* causal: rows of new tokens i < j0 see none of the tile (their logits there are
         * never read: softmax_rows stops at a row's last live key) */
        const int r0 = a->causal && j0 > it->i0 ? (j0 - it->i0) * R : 0;
        if (r0 >= rows) continue; /* (never: j0 < jn = i1 when causal) */
        const double *kT = kT_, *knorm = knorm_;
        const float *kT32 = NULL;
        const uint8_t *flag = flag_;
        if (kv) {
            kT = kv->nk + (size_t)(j0 / WC_TILE) * D * WC_TILE;
            kT32 = kv->nk32 ? kv->nk32 + (size_t)(j0 / WC_TILE) * D * WC_TILE : NULL;
            knorm = kv->nnorm + j0;
            flag = kv->nflag + j0;
        } else {
            nk_tile(a, it->b, it->kvh, j0, tn, kT_, knorm_, flag_, s->nvbad + j0);
        }
        const int64_t zo = (int64_t)r0 * nk + np + j0;
#if WCX_BF16
        if (bfi && kv->nbfok[j0 / WC_TILE]) {
            dotsbf_tile16(rows - r0, D, s->qbf + (size_t)r0 * (D / 2), s->q + (size_t)r0 * D,
                          kv->nkbf + (size_t)(j0 / WC_TILE) * (D / 2) * WC_TILE, kT32,
                          a->sm_scale, s->z + zo, nk, tn);
            bfany = 1;
        } else
#endif
            tile_logits(a, rows - r0, s->q + (size_t)r0 * D, s->q32 + (size_t)r0 * D, kT, kT32,
                        s->z + zo, nk, tn, wide);
        if (!a->cert) continue;
        /* a row of token j sees the tiles up to j's: all of them went through bfany */
        const double cs = new_slack_coef(a, bfany);
        for (int i = 0; i < tn; i++) {
            const int j = j0 + i;
            if (flag[i]) kbad = 1;
            else if (knorm[i] > kmax) kmax = knorm[i];
            if (!a->causal || j < it->i0 || j >= it->i1) continue;
            for (int rho = (j - it->i0) * R; rho < (j - it->i0 + 1) * R; rho++) /* token j's rows */
                s->unew[rho] = new_radius(kbad, cs, s->qnorm[rho], kmax, c0);
        }
    }
    const double cs = new_slack_coef(a, bfany);
    if (a->cert && !a->causal)
        for (int rho = 0; rho < rows; rho++)
            s->unew[rho] = new_radius(kbad, cs, s->qnorm[rho], kmax, c0);
}

/* Softmax, lse and certificate of every row; z becomes the weights exp(z - m) (0 past the
 * row's last live key and in the tail), l the sums. The sums run over four lanes (token
 * t in lane t mod 4) combined in a fixed order: the same bits for any thread count or clone;
 * the certificate's sum_rel bounds any order.
 *
 * A row's exact new tokens share one radius un (keys_new_t). Where un < 1/16 (every ordinary
 * row) their terms are not formed one by one: the row's prefix tokens [0, nc) take the
 * softmax with their own radii, the new ones [nc, nl) the weights alone, and the new tokens'
 * certificate share is sum_t w_t expm1(un) <= lB expm1_up(un) with lB their weights' computed
 * sum (one more rounding per term, inside sum_rel; a sum lB <= 1e-290 is bounded by 1e-291 >=
 * lB (1 + 2^-30) expm1(1/16), so no product is formed below the normal range). Otherwise
 * (un in [1/16, +inf): huge logits) the new tokens take un as their radius one by one, as the
 * prefix tokens do; un = +inf (a flagged new key, or a logit replaced by wcx_finite_row)
 * makes the certificate +inf, as a radius of +inf does on that path (docs/PROOFS.md 5.3). */
WCX_BODY void softmax_rows_t(const wc_extend_args *a, const wcx_item *it, int rows, int np,
                            int64_t nk, wcx_scratch *s, const int wide) {
    const int R = a->Hq / a->Hkv, cert = a->cert != NULL;
    const int T = a->q_len[it->b];
    const int64_t base = a->q_start[it->b];
    for (int rho = 0; rho < rows; rho++) {
        const int i = it->i0 + rho / R, r = rho % R;
        /* live keys: pool-read, the pool up to the row's own token (np counts the new ones) */
        const int64_t nl = a->pool_read ? (int64_t)a->prefix_len[it->b] - T + i + 1
                           : a->causal ? (int64_t)np + i + 1 : (int64_t)np + T;
        const int64_t nc = nl < np ? nl : np; /* tokens with radii of their own: the prefix */
        double *z = s->z + (size_t)rho * nk;
        double *u = s->u + (size_t)rho * nk;
        const int64_t o = (base + i) * a->Hq + (int64_t)it->kvh * R + r;
        const int fixed = wcx_finite_row(z, u, nl, cert);
        const double un = !cert || nl == nc ? 0.0 : fixed ? INFINITY : s->unew[rho];
        const int split = cert && nl > nc && !(un >= 0.0625 && un < INFINITY);
        if (cert && !split)
            for (int64_t t = nc; t < nl; t++) u[t] = un;
        if (a->dbg_logits)
            for (int64_t t = 0; t < nl; t++) a->dbg_logits[o * a->dbg_n + t] = z[t];
        if (a->dbg_radius && cert)
            for (int64_t t = 0; t < nl; t++)
                a->dbg_radius[o * a->dbg_n + t] = s->qbad[rho] ? INFINITY
                                                  : wc_f32_up(t < nc || !split ? u[t] : un);
        double m;
        wcx_row_sums rs;
        if (split) {
            m = max_of(z, nl);
            rs = wcx_row_softmax_at(z, u, m, nc, 1, wide);
            const wcx_row_sums rn = wcx_row_softmax_at(z + nc, NULL, m, nl - nc, 0, wide);
            const double exn = un == INFINITY ? INFINITY
                               : rn.lsum > 1e-290 ? rn.lsum * wcx_expm1_up4(WC_V4_SPLAT(un))[0]
                               : rn.lsum > 0.0 ? 1e-291 : 0.0;
            rs.lsum += rn.lsum;
            rs.ex += exn;
            rs.umax = un > rs.umax ? un : rs.umax;
        } else {
            rs = wcx_row_softmax(z, u, nl, cert, wide, &m);
        }
        for (int64_t t = nl; t < nk; t++) z[t] = 0.0;
        s->l[rho] = rs.lsum;
        if (a->lse) a->lse[o] = (float)(m + log(rs.lsum));
        if (cert)
            a->cert[o] = wc_f32_up(s->qbad[rho] ? INFINITY
                                   : wcx_cert_of(rs, nl, a->tail_gap, a->sum_rel));
    }
}

/* out[row] = sum_t p[row, t] v_t / l[row], tokens in order (prefix, then new). */
WCX_BODY void values_pass_t(const wc_extend_args *a, const wcx_item *it, int rows, int np, int jn,
                           int64_t nk, wcx_scratch *s, const wcx_kv *kv, const int wide) {
    const int D = a->D, R = a->Hq / a->Hkv;
    const int64_t base = a->q_start[it->b];
    double vt_[WC_TILE * WC_MAX_D];
    float vb32[WC_TILE * WC_MAX_D];
    for (size_t i = 0; i < (size_t)rows * D; i++) s->acc[i] = 0.0;
    for (int t0 = 0; t0 < np; t0 += WC_TILE) {
        const int tn = np - t0 < WC_TILE ? np - t0 : WC_TILE;
        const double *vt = vt_;
        const float *vt32 = NULL;
        if (kv && kv->pv32)
            vt32 = kv_vt32(kv->pv32 + (size_t)(t0 / WC_TILE) * WC_TILE * D, tn, D, vb32);
        else if (kv) vt = kv_vt(kv->pv + (size_t)(t0 / WC_TILE) * WC_TILE * D, tn, D, vt_);
        else v_tile(a, it->kvh, tn, s->s32 + t0, s->ep + t0, s->slot + t0, s->vflag + t0, vt_);
        tile_values(a, s->acc, s->z + t0, nk, tn, vt, vt32, 0, rows, wide);
    }
#if WCX_BF16 && !defined(WCX_NO_BFV) /* (WCX_NO_BFV: tests' build without the route) */
    /* the bf16 value pass (accumulatebf_rows): the bf16 dots' conditions on the call and the
     * item (bf16 queries: the route serves bf16 activations whole), the cached pairs, and
     * every new-token tile the item reads in bf16 numbers */
    int bfv = wide && jn > 0 && s->qbf_ok && kv && kv->nvbf;
    for (int k = 0; bfv && k < (jn + WC_TILE - 1) / WC_TILE; k++) bfv = kv->nvbfok[k];
    if (bfv) {
        int last[WCX_MAX_ROWS];
        for (int rho = 0; rho < rows; rho++)
            last[rho] = a->causal ? it->i0 + rho / R + 1 : jn;
        accumulatebf_rows(s->acc, s->z + np, nk, last, kv->nvbf, rows, D);
        jn = 0; /* done */
    }
#endif
    for (int j0 = 0; j0 < jn; j0 += WC_TILE) {
        const int tn = jn - j0 < WC_TILE ? jn - j0 : WC_TILE;
        /* causal: rows of new tokens i < j0 have weight 0 on the whole tile */
        const int r0 = a->causal && j0 > it->i0 ? (j0 - it->i0) * R : 0;
        if (r0 >= rows) continue;
        const double *vt = vt_;
        const float *vt32 = NULL;
        if (kv && kv->nv32)
            vt32 = kv_vt32(kv->nv32 + (size_t)(j0 / WC_TILE) * WC_TILE * D, tn, D, vb32);
        else if (kv) vt = kv_vt(kv->nv + (size_t)(j0 / WC_TILE) * WC_TILE * D, tn, D, vt_);
        else nv_tile(a, it->b, it->kvh, j0, tn, s->nvbad + j0, vt_);
        tile_values(a, s->acc, s->z + np + j0, nk, tn, vt, vt32, r0, rows, wide);
    }
    for (int rho = 0; rho < rows; rho++) {
        const int i = it->i0 + rho / R, r = rho % R;
        float *o = a->out + ((base + i) * a->Hq + (int64_t)it->kvh * R + r) * D;
        for (int d = 0; d < D; d++) o[d] = (float)(s->acc[(size_t)rho * D + d] / s->l[rho]);
    }
}

/* The phases after the queries, one instantiation per vector width. */
WCX_BODY int item_phases_t(const wc_extend_args *a, const wcx_item *it, int rows, int np, int jn,
                           int64_t nk, const wc_radius_consts *rc, wcx_scratch *s,
                           const wcx_kv *kv, const int wide) {
    const int err = keys_prefix_t(a, it, rows, np, nk, rc, s, kv, wide);
    if (err) return err;
    keys_new_t(a, it, rows, np, jn, nk, s, kv, wide);
    softmax_rows_t(a, it, rows, np, nk, s, wide);
    values_pass_t(a, it, rows, np, jn, nk, s, kv, wide);
    return WC_OK;
}

WCX_CLONES static int item_phases(const wc_extend_args *a, const wcx_item *it, int rows, int np,
                                  int jn, int64_t nk, const wc_radius_consts *rc, wcx_scratch *s,
                                  const wcx_kv *kv) {
    return item_phases_t(a, it, rows, np, jn, nk, rc, s, kv, 0);
}

#if WCX_WIDE
WCX_WIDE_TARGET static int item_phases_wide(const wc_extend_args *a, const wcx_item *it, int rows,
                                            int np, int jn, int64_t nk,
                                            const wc_radius_consts *rc, wcx_scratch *s,
                                            const wcx_kv *kv) {
    return item_phases_t(a, it, rows, np, jn, nk, rc, s, kv, 1);
}

#endif

/* One item: queries, keys, softmax and certificate, values. */
static int extend_item(const wc_extend_args *a, const wcx_item *it, wcx_scratch *s,
                       const wcx_kv *kv, int wide) {
    const int D = a->D, G = a->G, NG = D / G, R = a->Hq / a->Hkv;
    const int b = it->b, T = a->q_len[b], pbefore = a->prefix_len[b] - T;
    /* pool-read: the item reads the pool up to its last row's token, no new-token keys */
    const int np = a->pool_read ? pbefore + it->i1 : a->prefix_len[b];
    const int rows = (it->i1 - it->i0) * R;
    const int jn = a->pool_read ? 0 : a->causal ? it->i1 : T; /* new-token keys this item sees */
    const int64_t nk = (int64_t)np + jn, base = a->q_start[b];
    for (int rho = 0; rho < rows; rho++) {
        const int i = it->i0 + rho / R, r = rho % R;
        const float *src = a->q + ((base + i) * a->Hq + (int64_t)it->kvh * R + r) * D;
        double *qr = s->q + (size_t)rho * D, q2 = 0.0;
        float *qf = s->q32 + (size_t)rho * D;
        int bad = 0;
        for (int d = 0; d < D; d++) {
            float x = src[d];
            if (!isfinite(x)) { bad = 1; x = 0.0f; }
            qf[d] = x;
            qr[d] = (double)x;
            q2 += qr[d] * qr[d];
        }
        s->qnorm[rho] = sqrt(q2);
        s->qbad[rho] = (uint8_t)bad;
        wc_group_norms(qr, D, G, s->qn2 + (size_t)rho * NG, s->qn1 + (size_t)rho * NG);
        s->lf[rho] = 0.0;
        if (a->cert && a->radius != WC_RMODE_DET) {
            const double dl = a->delta_loc[base + i];
            if (!(dl > 0.0 && dl < 1.0)) return WC_ERR_ARGS;
            /* the union bound covers the prefix tokens (pool-read: the row's visible ones) */
            const int np0 = a->prefix_len[b];
            const double nu = a->pool_read ? (double)(pbefore + i + 1) : np0 > 0 ? (double)np0 : 1.0;
            s->lf[rho] = sqrt(2.0 * log(2.0 * nu / dl));
        }
    }
    s->qbf_ok = 0;
    if (s->bf) { /* the bf16 dots need every query of the item a bf16 number */
        int ok = 1;
        for (int rho = 0; rho < rows && ok; rho++)
            ok = wcx_bf16_pairs(s->q32 + (size_t)rho * D, D, s->qbf + (size_t)rho * (D / 2));
        s->qbf_ok = ok;
    }
    const wc_radius_consts rc = wc_radius_setup(a->radius, a->bits, a->sm_scale, a->arith_rel_s,
                                                a->arith_abs, a->softmax_slack);
#if WCX_WIDE
    if (wide) return item_phases_wide(a, it, rows, np, jn, nk, &rc, s, kv);
#endif
    (void)wide;
    return item_phases(a, it, rows, np, jn, nk, &rc, s, kv);
}

/* A cache-loading task: `count` tiles from tile `tile` of the prefix (new = 0) or new tokens
 * (new = 1) of sequence b at KV head kvh. */
typedef struct {
    int b, kvh, isnew, tile, count;
} wcx_load;

WCX_CLONES static int load_tiles(const wc_extend_args *a, const wcx_load *t, const wcx_kv *kv) {
    const int D = a->D, NG = D / a->G;
    for (int k = t->tile; k < t->tile + t->count; k++) {
        const int t0 = k * WC_TILE;
        if (!t->isnew) {
            const int np = a->prefix_len[t->b], tn = np - t0 < WC_TILE ? np - t0 : WC_TILE;
            uint32_t s32[WC_TILE], ep[WC_TILE];
            int64_t slots[WC_TILE];
            uint8_t vflag[WC_TILE];
            const int err = k_tile(a, t->b, t->kvh, t0, tn, s32, ep, slots, vflag,
                                   kv->pks + (size_t)k * NG * WC_TILE,
                                   kv->pkw + (size_t)k * NG * WC_TILE, kv->pflag + t0,
                                   kv->pk + (size_t)k * D * WC_TILE);
            if (err) return err;
            v_tile(a, t->kvh, tn, s32, ep, slots, vflag, kv->pv + (size_t)k * WC_TILE * D);
            if (kv->pk32) {
                to_f32(kv->pk + (size_t)k * D * WC_TILE, kv->pk32 + (size_t)k * D * WC_TILE,
                       D * WC_TILE);
                to_f32(kv->pv + (size_t)k * WC_TILE * D, kv->pv32 + (size_t)k * WC_TILE * D,
                       D * WC_TILE);
            }
        } else {
            const int T = a->q_len[t->b], tn = T - t0 < WC_TILE ? T - t0 : WC_TILE;
            nk_tile(a, t->b, t->kvh, t0, tn, kv->nk + (size_t)k * D * WC_TILE, kv->nnorm + t0,
                    kv->nflag + t0, kv->nvbad + t0);
            nv_tile(a, t->b, t->kvh, t0, tn, kv->nvbad + t0, kv->nv + (size_t)k * WC_TILE * D);
            if (kv->nk32) {
                to_f32(kv->nk + (size_t)k * D * WC_TILE, kv->nk32 + (size_t)k * D * WC_TILE,
                       D * WC_TILE);
                to_f32(kv->nv + (size_t)k * WC_TILE * D, kv->nv32 + (size_t)k * WC_TILE * D,
                       D * WC_TILE);
            }
            if (kv->nkbf)
                kv->nbfok[k] = (uint8_t)wcx_bf16_rowpairs(kv->nk32 + (size_t)k * D * WC_TILE,
                                                          D / 2, WC_TILE,
                                                          kv->nkbf + (size_t)k * (D / 2) * WC_TILE);
            if (kv->nvbf)
                kv->nvbfok[k] = (uint8_t)wcx_bf16_rowpairs(kv->nv32 + (size_t)k * WC_TILE * D,
                                                           WC_TILE / 2, D,
                                                           kv->nvbf + (size_t)k * (WC_TILE / 2) * D);
        }
    }
    return WC_OK;
}

typedef struct {
    const wc_extend_args *a;
    const wcx_item *items;
    const wcx_load *loads;
    const wcx_kv *kv;        /* [B * Hkv] */
    const uint8_t *cached;   /* [B]: the items of sequence b read kv[b * Hkv + kvh] */
    int nitems, nloads, rows_max, wide, bf, phase;
    int64_t keys_max, np_max, nt_max;
    atomic_int next;
    atomic_int err;
} wcx_pool;

static void *worker(void *arg) {
    wcx_pool *p = arg;
    const wc_extend_args *a = p->a;
    if (p->phase == 0) { /* load the cached keys and values */
        for (;;) {
            const int i = atomic_fetch_add(&p->next, 1);
            if (i >= p->nloads || atomic_load(&p->err)) break;
            const wcx_load *t = &p->loads[i];
            const int err = load_tiles(a, t, &p->kv[(size_t)t->b * a->Hkv + t->kvh]);
            if (err) atomic_store(&p->err, err);
        }
        return NULL;
    }
    wcx_scratch s;
    int err = scratch_alloc(&s, p->rows_max, a->D, a->D / a->G, p->keys_max, p->np_max, p->nt_max);
    if (err) {
        atomic_store(&p->err, err);
        return NULL;
    }
    s.bf = p->bf;
    for (;;) {
        const int i = atomic_fetch_add(&p->next, 1);
        if (i >= p->nitems || atomic_load(&p->err)) break;
        const wcx_item *it = &p->items[i];
        const wcx_kv *kv = p->cached[it->b] ? &p->kv[(size_t)it->b * a->Hkv + it->kvh] : NULL;
        err = extend_item(a, it, &s, kv, p->wide);
        if (err) atomic_store(&p->err, err);
    }
    scratch_free(&s);
    return NULL;
}

static int check_args(const wc_extend_args *a) {
    if (!wc_attn_args_ok(a->B, a->Hq, a->Hkv, a->D, a->G, a->page_size, a->bits, a->radius,
                         a->layer, a->sm_scale, a->rounds, a->arith_rel_s, a->arith_abs,
                         a->softmax_slack, a->tail_gap, a->sum_rel) ||
        (a->causal != 0 && a->causal != 1) || a->rows < 0 ||
        (a->pool_read != 0 && a->pool_read != 1) || (a->arith32 != 0 && a->arith32 != 1) ||
        (a->bf16_dots != 0 && a->bf16_dots != 1) ||
        (a->bf16_dots && !(a->arith_rel_s_bf16 >= a->arith_rel_s && isfinite(a->arith_rel_s_bf16))) ||
        (a->pool_read && !a->causal) ||
        (a->cert && a->radius != WC_RMODE_DET && !a->delta_loc))
        return WC_ERR_ARGS;
    for (int b = 0; b < a->B; b++) {
        const int64_t st = a->q_start[b], n = a->q_len[b], np = a->prefix_len[b];
        if (st < 0 || n < 0 || st + n > a->rows || np < 0 || np > a->pages * a->page_size ||
            np + n >= WCX_MAX_KEYS || (a->pool_read && n > np))
            return WC_ERR_ARGS;
        if ((a->dbg_logits || a->dbg_radius) && (a->pool_read ? np : np + n) > a->dbg_n)
            return WC_ERR_ARGS;
    }
    return WC_OK;
}

/* Bytes of one aligned cache array. */
static size_t kv_bytes(size_t n) { return (n + 63) & ~(size_t)63; }

/* The cache of the call: sequences whose keys several items read (more than one chunk of
 * new tokens, ch per item) get their tiles loaded once (cached[b] = 1; kv[b * Hkv + kvh]
 * carved out of *mem), as long as the cache stays within WCX_KV_BUDGET bytes; the loading
 * tasks (*loads, *nloads) run before the items. */
static int kv_plan(const wc_extend_args *a, int64_t ch, int bf, uint8_t *cached, void **mem,
                   wcx_kv **kv_out, wcx_load **loads_out, int *nloads_out) {
    const int D = a->D, NG = D / a->G, H = a->Hkv;
    const int per_task = 8; /* tiles */
    size_t total = 0;
    int64_t nloads = 0;
    for (int b = 0; b < a->B; b++) {
        const int64_t T = a->q_len[b];
        /* worth a first pass of the threads where several items read the same tiles: the
         * dequantized pool, or the new tokens' keys and values (their float64 copies and
         * norms; a fresh prompt, prefix 0, has only those) */
        if ((T + ch - 1) / ch < 2) continue;
        const int64_t pt = (a->prefix_len[b] + WC_TILE - 1) / WC_TILE;
        const int64_t nt = a->pool_read ? 0 : (T + WC_TILE - 1) / WC_TILE;
        const size_t pn = (size_t)pt * WC_TILE, nn = (size_t)nt * WC_TILE;
        /* the bf16 route's pairs and per-tile flags of one side (keys; values where D % 16 == 0) */
        const size_t bf_pairs = kv_bytes(sizeof(uint32_t) * nn * (D / 2)) + kv_bytes(nn / WC_TILE);
        const size_t one = 2 * kv_bytes(sizeof(double) * pn * D) + 2 * kv_bytes(sizeof(float) * pn * NG)
                           + kv_bytes(pn) + 2 * kv_bytes(sizeof(double) * nn * D)
                           + kv_bytes(sizeof(double) * nn) + 2 * kv_bytes(nn)
                           + (a->arith32 ? 2 * kv_bytes(sizeof(float) * pn * D)
                                           + 2 * kv_bytes(sizeof(float) * nn * D) : 0)
                           + (bf ? (1 + (D % 16 == 0)) * bf_pairs : 0);
        if (total + one * H > (size_t)WCX_KV_BUDGET) continue;
        total += one * H;
        cached[b] = 1;
        nloads += H * ((pt + per_task - 1) / per_task + (nt + per_task - 1) / per_task);
    }
    *mem = NULL;
    *kv_out = NULL;
    *loads_out = NULL;
    *nloads_out = 0;
    if (!nloads) return WC_OK;
    if (nloads > (1 << 30)) return WC_ERR_ARGS;
    char *m = aligned_alloc(64, total);
    wcx_kv *kv = calloc((size_t)a->B * H, sizeof(wcx_kv));
    wcx_load *loads = malloc(sizeof(wcx_load) * (size_t)nloads);
    if (!m || !kv || !loads) {
        free(m);
        free(kv);
        free(loads);
        return WC_ERR_NOMEM;
    }
    size_t off = 0;
    int64_t n = 0;
#define WCX_CARVE(type, count) ((type *)(m + (off += kv_bytes(sizeof(type) * (count))) \
                                          - kv_bytes(sizeof(type) * (count))))
    for (int b = 0; b < a->B; b++) {
        if (!cached[b]) continue;
        const int64_t T = a->q_len[b];
        const int pt = (int)((a->prefix_len[b] + WC_TILE - 1) / WC_TILE);
        const int nt = a->pool_read ? 0 : (int)((T + WC_TILE - 1) / WC_TILE);
        const size_t pn = (size_t)pt * WC_TILE, nn = (size_t)nt * WC_TILE;
        for (int h = 0; h < H; h++) {
            wcx_kv *e = &kv[(size_t)b * H + h];
            e->pk = WCX_CARVE(double, pn * D);
            e->pv = WCX_CARVE(double, pn * D);
            e->pks = WCX_CARVE(float, pn * NG);
            e->pkw = WCX_CARVE(float, pn * NG);
            e->pflag = WCX_CARVE(uint8_t, pn);
            e->nk = WCX_CARVE(double, nn * D);
            e->nv = WCX_CARVE(double, nn * D);
            e->nnorm = WCX_CARVE(double, nn);
            e->nflag = WCX_CARVE(uint8_t, nn);
            e->nvbad = WCX_CARVE(uint8_t, nn);
            if (a->arith32) {
                e->pk32 = WCX_CARVE(float, pn * D);
                e->pv32 = WCX_CARVE(float, pn * D);
                e->nk32 = WCX_CARVE(float, nn * D);
                e->nv32 = WCX_CARVE(float, nn * D);
            }
            if (bf && nn) {
                e->nkbf = WCX_CARVE(uint32_t, nn * (D / 2));
                e->nbfok = WCX_CARVE(uint8_t, nn / WC_TILE);
                if (D % 16 == 0) {
                    e->nvbf = WCX_CARVE(uint32_t, nn * (D / 2));
                    e->nvbfok = WCX_CARVE(uint8_t, nn / WC_TILE);
                }
            }
            for (int k = 0; k < pt; k += per_task)
                loads[n++] = (wcx_load){b, h, 0, k, pt - k < per_task ? pt - k : per_task};
            for (int k = 0; k < nt; k += per_task)
                loads[n++] = (wcx_load){b, h, 1, k, nt - k < per_task ? nt - k : per_task};
        }
    }
#undef WCX_CARVE
    *mem = m;
    *kv_out = kv;
    *loads_out = loads;
    *nloads_out = (int)n;
    return WC_OK;
}

/* Returns WC_OK or a negative WC_ERR_* code (outputs then undefined). */
int wc_extend(const wc_extend_args *a) {
    int err = check_args(a);
    if (err) return err;
    const int R = a->Hq / a->Hkv;
    int64_t keys_max = 1, np_max = 0, nt_max = 0;
    for (int b = 0; b < a->B; b++) {
        const int64_t np = a->prefix_len[b], n = a->q_len[b];
        const int64_t nk = a->pool_read ? np : np + n; /* pool-read: np counts the new tokens */
        keys_max = nk > keys_max ? nk : keys_max;
        np_max = np > np_max ? np : np_max;
        nt_max = n > nt_max ? n : nt_max;
    }
    /* new tokens per item: its logits and radii stay within WCX_ZU_BUDGET doubles each */
    int64_t ch = WCX_ZU_BUDGET / ((int64_t)R * keys_max);
    ch = ch < 1 ? 1 : ch;
    ch = ch * R > WCX_MAX_ROWS ? WCX_MAX_ROWS / R : ch;
    int64_t nitems = 0;
    for (int b = 0; b < a->B; b++) nitems += a->Hkv * ((a->q_len[b] + ch - 1) / ch);
    if (nitems == 0) return WC_OK;
    if (nitems > (1 << 30)) return WC_ERR_ARGS;
    wcx_item *items = malloc(sizeof(wcx_item) * (size_t)nitems);
    if (!items) return WC_ERR_NOMEM;
    int64_t k = 0;
    for (int b = 0; b < a->B; b++) {
        /* the sequence's chunks evened out (at most ch tokens each; a row's result does not
         * depend on its chunk) */
        const int64_t nc = (a->q_len[b] + ch - 1) / ch;
        const int cb = nc ? (int)((a->q_len[b] + nc - 1) / nc) : 1;
        for (int i0 = 0; i0 < a->q_len[b]; i0 += cb)
            for (int h = 0; h < a->Hkv; h++) {
                const int i1 = i0 + cb < a->q_len[b] ? i0 + cb : a->q_len[b];
                items[k++] = (wcx_item){b, h, i0, i1};
            }
    }
    nitems = k; /* evening out never adds a chunk, may save one */
    wcx_pool pool = {.a = a, .items = items, .nitems = (int)nitems, .rows_max = (int)ch * R,
                     .keys_max = keys_max, .np_max = np_max, .nt_max = nt_max,
#if WCX_WIDE
                     .wide = wcx_wide(),
#endif
    };
#if WCX_BF16
    /* the bf16 dots (dotsbf_tile16): the fp32 arithmetic, asked for, the AVX-512 build on a
     * CPU with AVX512-BF16, and a scale whose flushes stay inside arith_abs */
    pool.bf = a->arith32 && a->bf16_dots && pool.wide && a->sm_scale <= WCX_SMBF_MAX && wcx_bf16();
#endif
    atomic_init(&pool.err, 0);
    void *mem = NULL;
    wcx_load *loads = NULL;
    wcx_kv *kv = NULL;
    uint8_t *cached = calloc((size_t)a->B, 1);
    err = cached ? kv_plan(a, ch, pool.bf, cached, &mem, &kv, &loads, &pool.nloads)
                 : WC_ERR_NOMEM;
    if (err) {
        free(cached);
        free(items);
        return err;
    }
    pool.kv = kv;
    pool.loads = loads;
    pool.cached = cached;
    for (int phase = pool.nloads ? 0 : 1; phase < 2 && !atomic_load(&pool.err); phase++) {
        pool.phase = phase;
        atomic_init(&pool.next, 0);
        const int64_t work = phase ? nitems : pool.nloads;
        int nt = a->num_threads < 1 ? 1 : a->num_threads;
        if (nt > work) nt = (int)work;
        wc_run_workers(worker, &pool, nt, &pool.err);
    }
    free(mem);
    free(loads);
    free(kv);
    free(cached);
    free(items);
    return atomic_load(&pool.err);
}

/* The softmax's interleaved exp (WCX_EXP_N) over 16 values per step, x padded with 0. */
WCX_BODY void probe_exp_n(const double *x, double *out, int64_t n, const int wide) {
    for (int64_t i0 = 0; i0 < n; i0 += 16) {
        double xb[16] = {0}, ob[16];
        for (int j = 0; j < 16 && i0 + j < n; j++) xb[j] = x[i0 + j];
        if (wide) {
            wc_v8d v[2], o[2];
            for (int k = 0; k < 2; k++) v[k] = WC_V8_LD(xb + 8 * k);
            WCX_EXP_N(wc_v8d, wc_v8i, WC_V8_SPLAT, 2, v, o);
            for (int k = 0; k < 2; k++) WC_V8_ST(ob + 8 * k, o[k]);
        } else {
            wc_v4d v[4], o[4];
            for (int k = 0; k < 4; k++) v[k] = WC_V4_LD(xb + 4 * k);
            WCX_EXP_N(wc_v4d, wc_v4i, WC_V4_SPLAT, 4, v, o);
            for (int k = 0; k < 4; k++) WC_V4_ST(ob + 4 * k, o[k]);
        }
        for (int j = 0; j < 16 && i0 + j < n; j++) out[i0 + j] = ob[j];
    }
}

WCX_CLONES static void probe_exp_plain(const double *x, double *out, int64_t n) {
    probe_exp_n(x, out, n, 0);
}

#if WCX_WIDE
WCX_WIDE_TARGET static void probe_exp_wide(const double *x, double *out, int64_t n) {
    probe_exp_n(x, out, n, 1);
}
#endif

/* Test probe of the weight and certificate-term helpers: out[i] = exp(x[i]) as the extend
 * computes it (which = 0: wcx_exp4; which = 2: the softmax's interleaved 4-wide WCX_EXP_N,
 * which = 3: its 8-wide AVX-512 instantiation, WC_ERR_ARGS where the build or the CPU has
 * none; x in [-700, 0]) or its upper bound of expm1(x[i]) (which = 1; x in [0, 1/16)),
 * through the vector code path. */
WCX_CLONES int wc_extend_probe(int32_t which, const double *x, double *out, int64_t n) {
    if (which < 0 || which > 3 || n < 0) return WC_ERR_ARGS;
    if (which == 2) {
        probe_exp_plain(x, out, n);
        return WC_OK;
    }
    if (which == 3) {
#if WCX_WIDE
        if (wcx_wide()) {
            probe_exp_wide(x, out, n);
            return WC_OK;
        }
#endif
        return WC_ERR_ARGS;
    }
    for (int64_t i = 0; i < n; i++) {
        const wc_v4d v = WC_V4_SPLAT(x[i]);
        /* expm1's bound as the softmax takes it: the polynomial below 1/16, else the mid form */
        out[i] = (which == 0 ? wcx_exp4(v) : x[i] < 0.0625 ? wcx_expm1_up4(v) : wcx_expm1_mid4(v))[0];
    }
    return WC_OK;
}

/* The bf16 value pass (accumulatebf_rows) alone, for the tests: acc f64 [nrows, D] += the pass
 * over the weights z f64 [nrows, zs] (row rho's first last[rho] <= n of them; z is read only
 * there) and the values v f32 [ceil(n / 16) * 16, D], bf16 numbers (wcx_bf16_exact). Returns
 * WC_ERR_ARGS where the build or the CPU has no bf16 route, D % 16 != 0, or a value fails. */
int wc_extend_probe_bfv(const double *z, int64_t zs, const int32_t *last, const float *v,
                        int32_t nrows, int32_t n, int32_t D, double *acc) {
#if WCX_BF16
    if (!(wcx_wide() && wcx_bf16()) || D < 16 || D % 16 || D > WC_MAX_D || nrows < 1 || n < 1 ||
        zs < n)
        return WC_ERR_ARGS;
    for (int r = 0; r < nrows; r++)
        if (last[r] < 0 || last[r] > n) return WC_ERR_ARGS;
    const int tiles = (n + WC_TILE - 1) / WC_TILE;
    uint32_t *vp = malloc(sizeof(uint32_t) * (size_t)tiles * (WC_TILE / 2) * D);
    if (!vp) return WC_ERR_NOMEM;
    int ok = 1;
    for (int k = 0; k < tiles; k++)
        ok &= wcx_bf16_rowpairs(v + (size_t)k * WC_TILE * D, WC_TILE / 2, D,
                                vp + (size_t)k * (WC_TILE / 2) * D);
    if (ok) accumulatebf_rows(acc, z, zs, last, vp, nrows, D);
    free(vp);
    return ok ? WC_OK : WC_ERR_ARGS;
#else
    (void)z, (void)zs, (void)last, (void)v, (void)nrows, (void)n, (void)D, (void)acc;
    return WC_ERR_ARGS;
#endif
}

/* 1 when wc_extend can take the bf16 dots here (the build and the CPU; the call's own
 * conditions are in wc_extend): for the tests. */
int wc_extend_bf16_route(void) {
#if WCX_BF16
    return wcx_wide() && wcx_bf16();
#else
    return 0;
#endif
}
