/* Fused CPU decode attention over witcert's paged dithered-INT8 pool, with the certificate.
 *
 * wc_decode: for every (sequence b, KV head), one pass over the sequence's slots reads the
 * packed K record (int8 codes, fp16 scales, fp16 witnesses), regenerates the
 * Philox4x32-10 dither, dequantizes (bitwise the reference), forms the logits of the
 * GQA group's R = Hq / Hkv query heads and their radii; then the max-shifted softmax
 * weights and the certificate sum a = sum_t exp(z_t - m) expm1(u_t) (the extend's row
 * softmax, extend_math.h's wcx_softmax_row: one implementation for both, docs/PROOFS.md
 * 5.3); then a pass over V
 * accumulates the output. Logits, softmax, output and certificate are computed in
 * double and returned in f32. Spec: witcert.ref.attention.decode_attention with one
 * split, docs/MATH.md §1 and §2.
 *
 * Flagged tokens (a non-finite scale or witness on either side, written for NaN/inf
 * input or an fp16 overflow) read as K = 0 / V = 0 and have radius +inf, so any query
 * head that attends one gets cert = +inf. A query head with a non-finite entry is
 * attended with those entries zeroed and gets cert = +inf.
 *
 * Optional outputs (NULL pointers skip them): cert (NULL also skips the radii), lse =
 * m + log l per query head (the reference DecodeOut.lse), and vbound (docs/MATH.md §5, as
 * witcert.ref.attention.merge_partials: 2 min(cert, 1) vmax + sum_t p_t ||w^v_t||, with
 * vmax = max_t (||v^_t|| + ||w^v_t||); a flagged V token has ||w^v|| = +inf; a non-finite
 * query head gets +inf), in float64, inflated by WC_CERT_SLACK and rounded up to f32.
 * vbound needs cert.
 *
 * Exact overlay (witcert.runtime.exact.ExactCopy; xk NULL skips it, bit for bit the plain
 * decode): K / V [num_slots, Hkv, D] contiguous in f32, f16 or bf16 (xdtype), a flag
 * xflag [num_slots, Hkv], the epoch xepoch [num_slots, Hkv] at which it was set and the
 * slot epochs xslot_epochs [num_slots]. An entry (slot, KV head) with xflag set and
 * xepoch == xslot_epochs[slot] is live: its K and V are the exact values converted to f32
 * (exactly, as torch's .to(float32)), its radius is 0 and it is never flagged, whatever the
 * stored record holds (witcert.ref.overlay.overlay_exact in the reference).
 * When the copy may have rounded the model's values (the HF gate's fp16 backup of an fp32
 * model), xw_rel, xw_abs > 0 give each live row its rounding witness, computed from the row
 * itself: w = (xw_rel ||x_copy||_2 + xw_abs) (1 + 2^-20) >= ||x - x_copy||_2
 * (witcert.runtime.exact.rounding_witness, here in float64). The live K's radius gains
 * sm ||q||_2 w_k (the whole q: the copy replaces every channel) and the live V's witness
 * in vbound is w_v (witcert.ref.overlay.overlay_exact). Both 0: an exact copy.
 *
 * Outlier bypass (wc_side.m2 > 0): the bypassed channels of a stored K / V row read their
 * exact fp16 value from outl (never (0 - xi) s); they are left out of the q group norms of
 * the compression radii (their error is 0), and their sum_c |q_c| |outl_c| is added to the
 * dot bound S_t of the arithmetic slack.
 *
 * Letters: B batch, Hq query heads, Hkv KV heads, R = Hq / Hkv, D head dim, G group size,
 * NG = D / G groups, P page size, N tokens of a sequence.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "decode.h"
#include "extend_math.h"


/* Per-thread scratch, sized for the longest sequence. */
typedef struct {
    double *z;       /* [R, N]: logits, then exp(z - m) */
    double *u;       /* [R, N]: radii */
    int64_t *slot;   /* [N] */
    uint32_t *s32;   /* [N] Philox counter word 0: the slot or its position */
    uint32_t *ep;    /* [N] */
    uint8_t *vflag;  /* [N] */
    double *wv;      /* [N] ||V witness||_2 (+inf when flagged); vbound only */
    uint8_t *xlive;  /* [N] a live exact-overlay entry (0 without the overlay) */
    float *vs;       /* [N, NG] the V scales, read by keys_pass (flags) for values_pass */
    double *zc;      /* [N] one query head's logits, kept for the debug output (dbg_fired) */
} wc_scratch;

static void scratch_free(wc_scratch *s) {
    free(s->z); free(s->u); free(s->slot); free(s->s32); free(s->ep); free(s->vflag);
    free(s->wv); free(s->xlive); free(s->vs); free(s->zc);
}

static int scratch_alloc(wc_scratch *s, int R, int NG, int64_t nmax) {
    size_t n = (size_t)nmax;
    s->z = malloc(sizeof(double) * R * n);
    s->u = malloc(sizeof(double) * R * n);
    s->slot = malloc(sizeof(int64_t) * n);
    s->s32 = malloc(sizeof(uint32_t) * n);
    s->ep = malloc(sizeof(uint32_t) * n);
    s->vflag = malloc(n);
    s->wv = malloc(sizeof(double) * n);
    s->xlive = malloc(n);
    s->vs = malloc(sizeof(float) * (size_t)NG * n);
    s->zc = malloc(sizeof(double) * n);
    if (!s->z || !s->u || !s->slot || !s->s32 || !s->ep || !s->vflag || !s->wv || !s->xlive ||
        !s->vs || !s->zc) {
        scratch_free(s);
        return WC_ERR_NOMEM;
    }
    return WC_OK;
}

/* Rounding witness of an exact-overlay row x [D] (f32, read from the copy): 0 for an exact
 * copy, else (xw_rel ||x||_2 + xw_abs) (1 + 2^-20) in float64; +inf for a non-finite row. */
static inline double exact_wit(const wc_decode_args *a, const float *x, int D) {
    if (a->xw_rel == 0.0 && a->xw_abs == 0.0) return 0.0;
    double n2 = 0.0;
    for (int d = 0; d < D; d++) n2 += (double)x[d] * (double)x[d];
    double w = (a->xw_rel * sqrt(n2) + a->xw_abs) * (1.0 + 0x1p-20);
    return w < INFINITY ? w : INFINITY; /* NaN (a non-finite row) -> +inf */
}

/* Radius of an exact-overlay entry for the R heads: the copy's rounding witness wk
 * (sm ||q||_2 wk; wk = 0 for an exact copy) plus the arithmetic slack with the exact
 * sum_i |q_i k_i|. qf2 [R]: ||q_r||_2 over all D channels. wk = +inf gives +inf. */
static inline void exact_radius(const wc_decode_args *a, const double *restrict qaT,
                                const double *qf2, const float *k, double wk, int R, int D,
                                double *restrict u, size_t ustride) {
    /* qaT [D][R]: |q| transposed, so the R heads' sums run side by side (each over d in order) */
    double s[WC_MAX_R];
    for (int r = 0; r < R; r++) s[r] = 0.0;
    for (int d = 0; d < D; d++) {
        const double kd = fabs((double)k[d]);
        for (int r = 0; r < R; r++) s[r] += qaT[(size_t)d * R + r] * kd;
    }
    for (int r = 0; r < R; r++) {
        double uw = wk > 0.0 ? a->sm_scale * qf2[r] * wk * WC_RADIUS_INFLATE : 0.0;
        u[(size_t)r * ustride] = wk == INFINITY ? INFINITY
            : uw + a->arith_rel_s * a->sm_scale * s[r] * WC_RADIUS_INFLATE + a->arith_abs + a->softmax_slack;
    }
}

/* The debug outputs of query head row o: its n logits z and radii u (radii of a non-finite query
 * head +inf), NaN past n up to dbg_n. */
static void write_debug(const wc_decode_args *a, int64_t o, const double *z, const double *u, int n,
                        int qbad) {
    if (a->dbg_logits)
        for (int64_t t = 0; t < a->dbg_n; t++) a->dbg_logits[o * a->dbg_n + t] = t < n ? z[t] : NAN;
    if (a->dbg_radius && a->cert)
        for (int64_t t = 0; t < a->dbg_n; t++)
            a->dbg_radius[o * a->dbg_n + t] = t >= n ? NAN : qbad ? INFINITY : wc_f32_up(u[t]);
}

/* Prefetch the K / V scales and witnesses of (slot, kvh) (a token of the next tile). */
static inline void wc_prefetch_record(const wc_decode_args *a, int64_t slot, int kvh) {
    __builtin_prefetch(a->k.scales + slot * a->k.scales_s0 + (int64_t)kvh * a->k.scales_s1);
    __builtin_prefetch(a->k.wit + slot * a->k.wit_s0 + (int64_t)kvh * a->k.wit_s1);
    __builtin_prefetch(a->v.scales + slot * a->v.scales_s0 + (int64_t)kvh * a->v.scales_s1);
    __builtin_prefetch(a->v.wit + slot * a->v.wit_s0 + (int64_t)kvh * a->v.wit_s1);
    __builtin_prefetch(a->k.codes + slot * a->k.codes_s0 + (int64_t)kvh * a->k.codes_s1);
    if (a->xk) {
        const int64_t i = slot * a->Hkv + kvh;
        __builtin_prefetch(a->xflag + i);
        __builtin_prefetch(a->xepoch + i);
        __builtin_prefetch(a->xslot_epochs + slot);
    }
}

/* Prefetch the exact overlay's row [D] of (slot, kvh) in base (xk or xv). */
static inline void wc_prefetch_exact(const wc_decode_args *a, const void *base, int64_t slot,
                                     int kvh) {
    const int esz = a->xdtype == WC_X_F32 ? 4 : 2;
    const char *p = (const char *)base + (slot * a->Hkv + kvh) * (int64_t)a->D * esz;
    for (int o = 0; o < a->D * esz; o += 64) __builtin_prefetch(p + o);
}

/* Phase 1: slots, flags, dequantized K, logits z [R, n] and radii u [R, n]. */
WCX_BODY int keys_pass(const wc_decode_args *a, int b, int kvh, int n, const double *qd,
                     const double *qn2, const double *qn1, const double *qf2, double lf,
                     wc_scratch *s) {
    const int D = a->D, G = a->G, NG = D / G, R = a->Hq / a->Hkv, P = a->page_size;
    const uint32_t c1 = ((uint32_t)a->layer << 16) | (uint32_t)kvh;
    const int32_t *bt = a->block_table + (int64_t)b * a->bt_s0;
    const int cpc = wc_cpc(a->bits), nch = (D + cpc - 1) / cpc;
    wc_words wb;
    float ks[WC_MAX_NG], kw[WC_MAX_NG], vw[WC_MAX_NG], kst[WC_TILE * WC_MAX_NG];
    float ksT[WC_MAX_NG * WC_TILE], kwT[WC_MAX_NG * WC_TILE];
    uint8_t kflag[WC_TILE], flag[WC_TILE];
    double vw2[WC_TILE]; /* squared V witness norms of the tile (vbound) */
    double bx[WC_MAX_R * WC_TILE]; /* sum_c |q_c| |outl_c| over the bypassed K channels */
    const int m2 = a->k.m2;
    const int32_t *kix = m2 ? a->k.oidx + (int64_t)kvh * m2 : NULL;
    double qaT[WC_MAX_D * WC_MAX_R]; /* |q| [D][R] for the exact overlay's dot bounds */
    /* the radii of the stored tokens: the extend's (common.h wc_radius_rows), every row with
     * this sequence's lf; with bypassed channels, plus the slack of their exact share of
     * sum_i |q_i k^_i| (bx: sum_c |q_c| |outl_c|) */
    const wc_radius_consts rc = wc_radius_setup(a->radius, a->bits, a->sm_scale, a->arith_rel_s,
                                                a->arith_abs, a->softmax_slack);
    const double cb = a->arith_rel_s * a->sm_scale * WC_RADIUS_INFLATE;
    double lfr[WC_MAX_R];
    for (int r = 0; r < R; r++) lfr[r] = lf;
    if (a->xk && a->cert)
        for (int r = 0; r < R; r++)
            for (int d = 0; d < D; d++) qaT[(size_t)d * R + r] = fabs(qd[(size_t)r * D + d]);
    for (int t0 = 0; t0 < n; t0 += WC_TILE) {
        int tn = n - t0 < WC_TILE ? n - t0 : WC_TILE;
        memset(ksT, 0, sizeof(float) * (size_t)NG * WC_TILE); /* the groups the radii read */
        memset(kwT, 0, sizeof(float) * (size_t)NG * WC_TILE);
        if (m2) memset(bx, 0, sizeof(double) * (size_t)R * WC_TILE);
        for (int i = 0; i < tn; i++) {
            int t = t0 + i;
            if (t + WC_TILE < n) { /* the next tile's records: loaded a tile from now */
                const int64_t ps = (int64_t)bt[(t + WC_TILE) / P] * P + (t + WC_TILE) % P;
                if (ps >= 0 && ps < a->num_slots) wc_prefetch_record(a, ps, kvh);
            }
            int64_t slot = (int64_t)bt[t / P] * P + t % P;
            if (slot < 0 || slot >= a->num_slots) return WC_ERR_SLOT;
            /* this token's K codes, read after the tile's radii and Philox */
            __builtin_prefetch(a->k.codes + slot * a->k.codes_s0 + (int64_t)kvh * a->k.codes_s1);
            int err = wc_counter_words(a->positions, a->epochs, slot, &s->s32[t], &s->ep[t]);
            if (err) return err;
            s->slot[t] = slot;
            const int live = exact_live(a, slot, kvh);
            s->xlive[t] = (uint8_t)live;
            if (live) wc_prefetch_exact(a, a->xk, slot, kvh);
            int kb = wc_load_groups(a->k.scales, a->k.scales_s0, a->k.scales_s1, slot, kvh, NG, ks);
            kb |= wc_load_groups(a->k.wit, a->k.wit_s0, a->k.wit_s1, slot, kvh, NG, kw);
            float *vs = s->vs + (size_t)t * NG;
            int vb = wc_load_groups(a->v.scales, a->v.scales_s0, a->v.scales_s1, slot, kvh, NG, vs);
            vb |= wc_load_groups(a->v.wit, a->v.wit_s0, a->v.wit_s1, slot, kvh, NG, vw);
            if (live) kb = vb = 0; /* exact K and V: no compression radius, never flagged */
            kflag[i] = (uint8_t)kb;
            s->vflag[t] = (uint8_t)vb;
            if (a->vbound) {
                double w2 = 0.0;
                for (int g = 0; g < NG; g++) w2 += (double)vw[g] * (double)vw[g];
                vw2[i] = vb ? INFINITY : live ? 0.0 : w2; /* live: set by values_pass */
            }
            flag[i] = (uint8_t)(kb | vb);
            if (m2 && !flag[i] && !live) {
                const uint16_t *o = a->k.outl + slot * a->k.outl_s0 + (int64_t)kvh * a->k.outl_s1;
                for (int j = 0; j < m2; j++) {
                    const double ov = fabs((double)wc_h2f(o[j]));
                    for (int r = 0; r < R; r++) bx[r * WC_TILE + i] += fabs(qd[r * D + kix[j]]) * ov;
                }
            }
            memcpy(kst + i * NG, ks, sizeof(float) * NG);
            if (!flag[i])
                for (int g = 0; g < NG; g++) {
                    ksT[g * WC_TILE + i] = ks[g];
                    kwT[g * WC_TILE + i] = kw[g];
                }
        }
        if (a->vbound) /* the tile's V witness norms (sqrt of +inf and 0 are themselves) */
            for (int i = 0; i < tn; i++) s->wv[t0 + i] = sqrt(vw2[i]);
        if (a->cert) {
            wc_radius_rows(&rc, R, NG, tn, qn2, qn1, lfr, kwT, ksT, flag, s->u + t0, n);
            if (m2)
                for (int r = 0; r < R; r++)
                    for (int i = 0; i < tn; i++)
                        s->u[(size_t)r * n + t0 + i] += cb * bx[r * WC_TILE + i];
        }
        wc_words_tile(tn, s->s32 + t0, s->ep + t0, c1, 0u, nch, a->key0, a->key1, a->rounds, &wb);
        for (int i = 0; i < tn; i++) {
            double *zi = s->z + t0 + i;
            if (kflag[i]) { /* a flagged key reads as 0, so its logit is 0 */
                for (int r = 0; r < R; r++) zi[(size_t)r * n] = 0.0;
                continue;
            }
            int64_t slot = s->slot[t0 + i];
            float row[WC_MAX_D];
            if (s->xlive[t0 + i]) {
                exact_row(a, a->xk, slot, kvh, row);
                if (a->cert)
                    exact_radius(a, qaT, qf2, row, exact_wit(a, row, D), R, D, s->u + t0 + i, n);
            } else {
                wc_dequant(a->bits, a->k.codes + slot * a->k.codes_s0 + (int64_t)kvh * a->k.codes_s1,
                           &wb, (size_t)i * nch * cpc, kst + i * NG, D, G, row);
                wc_apply_outl(&a->k, slot, kvh, row);
            }
            dots_qk(qd, row, R, D, a->sm_scale, zi, n);
        }
    }
    return WC_OK;
}

/* Phase 3: out[r] = sum_t p[r, t] v_t / l[r]; with a->vbound also *vmax = max_t
 * (||v_t|| + wv_t) and vw[r] = sum_t p[r, t] wv_t (+inf if a flagged V token is attended). */
WCX_BODY void values_pass(const wc_decode_args *a, int b, int kvh, int n, const double *l,
                        wc_scratch *s, double *vmax, double *vw) {
    const int D = a->D, G = a->G, NG = D / G, R = a->Hq / a->Hkv;
    const uint32_t c1 = ((uint32_t)a->layer << 16) | (uint32_t)kvh;
    const int cpc = wc_cpc(a->bits), nch = (D + cpc - 1) / cpc;
    wc_words wb;
    float rows[WC_TILE * WC_MAX_D], rowT[WC_MAX_D * WC_TILE]; /* the tile's V rows */
    double vt[WC_TILE * WC_MAX_D]; /* their float64 copies, zero for a flagged or absent token */
    double n2[WC_TILE];                                      /* their squared norms (vbound) */
    double accp[WC_MAX_R * WC_MAX_D];
    for (int i = 0; i < R * D; i++) accp[i] = 0.0;
    const int want_vb = a->vbound != NULL;
    double vm = 0.0;
    if (want_vb)
        for (int r = 0; r < R; r++) vw[r] = 0.0;
    for (int t0 = 0; t0 < n; t0 += WC_TILE) {
        int tn = n - t0 < WC_TILE ? n - t0 : WC_TILE;
        /* the V codes of the next tile (and, at the first, of this one: read after its Philox;
         * every later tile's were asked for a tile earlier) */
        for (int i = t0 == 0 ? 0 : WC_TILE; i < WC_TILE * 2 && t0 + i < n; i++) {
            if (s->xlive[t0 + i]) wc_prefetch_exact(a, a->xv, s->slot[t0 + i], kvh);
            else __builtin_prefetch(a->v.codes + s->slot[t0 + i] * a->v.codes_s0
                                    + (int64_t)kvh * a->v.codes_s1);
        }
        wc_words_tile(tn, s->s32 + t0, s->ep + t0, c1, 1u, nch, a->key0, a->key1, a->rounds, &wb);
        /* the tile's rows first (and, for vbound, their squared norms: one chain per token, in
         * channel order as before, the tokens' chains side by side through rowT [D][TILE]) */
        for (int i = 0; i < WC_TILE; i++) {
            int t = t0 + i;
            float *row = rows + (size_t)i * D;
            if (i >= tn || s->vflag[t]) { /* reads as 0 (the weights past tn are 0 too) */
                for (int d = 0; d < D; d++) vt[(size_t)i * D + d] = 0.0;
                continue;
            }
            int64_t slot = s->slot[t];
            if (s->xlive[t]) {
                exact_row(a, a->xv, slot, kvh, row);
                if (want_vb) s->wv[t] = exact_wit(a, row, D);
            } else {
                wc_dequant(a->bits, a->v.codes + slot * a->v.codes_s0 + (int64_t)kvh * a->v.codes_s1,
                           &wb, (size_t)i * nch * cpc, s->vs + (size_t)t * NG, D, G, row);
                wc_apply_outl(&a->v, slot, kvh, row);
            }
            for (int d = 0; d < D; d++) vt[(size_t)i * D + d] = (double)row[d];
            if (want_vb)
                for (int d = 0; d < D; d++) rowT[d * WC_TILE + i] = row[d];
        }
        if (want_vb) {
            for (int i = 0; i < WC_TILE; i++) n2[i] = 0.0;
            for (int d = 0; d < D; d++)
                for (int i = 0; i < WC_TILE; i++) {
                    const double x = (double)rowT[d * WC_TILE + i];
                    n2[i] += x * x;
                }
        }
        for (int i = 0; i < tn; i++) {
            int t = t0 + i;
            if (s->vflag[t]) { /* V reads as 0; its witness norm is +inf */
                if (want_vb) {
                    vm = INFINITY;
                    for (int r = 0; r < R; r++) vw[r] = INFINITY;
                }
                continue;
            }
            if (want_vb) {
                double vn = sqrt(n2[i]) + s->wv[t];
                if (vn != vn) vn = INFINITY; /* a NaN value (a live exact entry's copy): no bound, as the spec */
                vm = vn > vm ? vn : vm;
                for (int r = 0; r < R; r++) vw[r] += s->z[(size_t)r * n + t] * s->wv[t];
            }
        }
        /* the extend's tile sum: per element the same adds in token order as one token at
         * a time (a flagged token's zero row adds +0, which leaves the sum unchanged) */
        accumulate_tile(accp, s->z + t0, n, tn, vt, 0, R, D);
    }
    for (int r = 0; r < R; r++) {
        float *o = a->out + ((int64_t)b * a->Hq + (int64_t)kvh * R + r) * D;
        for (int d = 0; d < D; d++) o[d] = (float)(accp[(size_t)r * D + d] / l[r]);
    }
    if (want_vb) *vmax = vm;
}

/* One (sequence, KV head): all R query heads of the group. extend_math.h's WCX_CLONES: the AVX2
 * clone and the plain one, the same bits (an AVX-512 instantiation like the extend's measured no
 * faster: BENCHMARKS.md 10f). */
WCX_CLONES static int decode_item(const wc_decode_args *a, int b, int kvh, wc_scratch *s) {
    const int D = a->D, G = a->G, NG = D / G, R = a->Hq / a->Hkv;
    const int n = a->seq_lens[b];
    if (n < 1 || n >= (1 << 22) || (int64_t)n > a->pages * a->page_size) return WC_ERR_ARGS;
    if ((a->dbg_logits || a->dbg_radius) && (int64_t)n > a->dbg_n) return WC_ERR_ARGS;
    double q[WC_MAX_R * WC_MAX_D];
    double qn2[WC_MAX_R * WC_MAX_NG], qn1[WC_MAX_R * WC_MAX_NG], cd[WC_MAX_R];
    double l[WC_MAX_R] = {0}; /* set for every row r < R below; zeroed for the compiler */
    double qf2[WC_MAX_R];
    int qbad[WC_MAX_R];
    uint8_t kbyp[WC_MAX_D]; /* the K side's bypassed channels of this KV head: exact */
    if (a->k.m2) wc_bypass_mask(&a->k, kvh, D, kbyp);
    else memset(kbyp, 0, (size_t)D);
    for (int r = 0; r < R; r++) {
        const float *src = a->q + ((int64_t)b * a->Hq + (int64_t)kvh * R + r) * D;
        qbad[r] = 0;
        for (int d = 0; d < D; d++) {
            float x = src[d];
            if (!isfinite(x)) { qbad[r] = 1; x = 0.0f; }
            q[r * D + d] = (double)x;
        }
        double f2 = 0.0;
        for (int g = 0; g < NG; g++) {
            double s2 = 0.0, s1 = 0.0;
            for (int c = 0; c < G; c++) {
                double x = q[r * D + g * G + c];
                f2 += x * x;
                if (kbyp[g * G + c]) continue;
                s2 += x * x;
                s1 += fabs(x);
            }
            qn2[r * NG + g] = sqrt(s2);
            qn1[r * NG + g] = s1;
        }
        qf2[r] = sqrt(f2);
    }
    const int fired_only = a->dbg_fired && a->cert && (a->dbg_logits || a->dbg_radius);
    double lf = 0.0;
    if (a->cert && a->radius != WC_RMODE_DET) {
        double dl = a->delta_loc[b];
        if (!(dl > 0.0 && dl < 1.0)) return WC_ERR_ARGS;
        lf = sqrt(2.0 * log(2.0 * (double)n / dl));
    }
    int err = keys_pass(a, b, kvh, n, q, qn2, qn1, qf2, lf, s);
    if (err) return err;
    for (int r = 0; r < R; r++) {
        double *z = s->z + (size_t)r * n;
        double *u = s->u + (size_t)r * n;
        const int64_t o = (int64_t)b * a->Hq + (int64_t)kvh * R + r;
        wcx_finite_row(z, u, n, a->cert != NULL);
        /* the debug outputs now, or (dbg_fired) once the certificate says whether to: the softmax
         * below overwrites z with the weights, so the logits wait in zc */
        if (fired_only && a->dbg_logits) memcpy(s->zc, z, sizeof(double) * n);
        else if (!fired_only) write_debug(a, o, z, u, n, qbad[r]);
        /* the extend's row softmax (extend_math.h): weights, sums, certificate */
        double m;
        const wcx_row_sums rs = wcx_row_softmax(z, u, n, a->cert != NULL, 0, &m);
        l[r] = rs.lsum;
        if (a->lse) a->lse[o] = (float)(m + log(rs.lsum));
        if (a->cert) {
            cd[r] = qbad[r] ? INFINITY : wcx_cert_of(rs, n, a->tail_gap, a->sum_rel);
            a->cert[o] = wc_f32_up(cd[r]);
        }
        if (fired_only && (double)a->cert[o] >= a->dbg_tau) write_debug(a, o, s->zc, u, n, qbad[r]);
    }
    double vmax = 0.0, vw[WC_MAX_R];
    values_pass(a, b, kvh, n, l, s, &vmax, vw);
    if (a->vbound)
        for (int r = 0; r < R; r++) {
            const int64_t o = (int64_t)b * a->Hq + (int64_t)kvh * R + r;
            /* cd[r] >= 0 (+inf for a non-finite query head, or an attended flagged token) */
            double c1 = cd[r] < 1.0 ? cd[r] : 1.0;
            double vb = 2.0 * c1 * vmax + vw[r] / l[r];
            a->vbound[o] = qbad[r] ? INFINITY : wc_f32_up(vb * (1.0 + a->sum_rel));
        }
    return WC_OK;
}


typedef struct {
    const wc_decode_args *a;
    atomic_int next;
    atomic_int err;
    int64_t nmax;
} wc_pool;

static void *worker(void *arg) {
    wc_pool *p = arg;
    const wc_decode_args *a = p->a;
    wc_scratch s;
    int err = scratch_alloc(&s, a->Hq / a->Hkv, a->D / a->G, p->nmax);
    if (err) {
        atomic_store(&p->err, err);
        return NULL;
    }
    int items = a->B * a->Hkv;
    for (;;) {
        int i = atomic_fetch_add(&p->next, 1);
        if (i >= items || atomic_load(&p->err)) break;
        if (a->kv_sel && !a->kv_sel[i]) continue; /* item i = (b, kvh) at b * Hkv + kvh */
        err = decode_item(a, i / a->Hkv, i % a->Hkv, &s);
        if (err) atomic_store(&p->err, err);
    }
    scratch_free(&s);
    return NULL;
}

/* Returns WC_OK or a negative WC_ERR_* code (outputs then undefined). */
int wc_decode(const wc_decode_args *a) {
    if (!wc_attn_args_ok(a->B, a->Hq, a->Hkv, a->D, a->G, a->page_size, a->bits, a->radius,
                         a->layer, a->sm_scale, a->rounds, a->arith_rel_s, a->arith_abs,
                         a->softmax_slack, a->tail_gap, a->sum_rel) ||
        (a->vbound && !a->cert) ||
        !(a->xw_rel >= 0.0 && a->xw_abs >= 0.0 && a->xw_rel < INFINITY && a->xw_abs < INFINITY) ||
        (a->xk && (!a->xv || !a->xflag || !a->xepoch || !a->xslot_epochs || a->xdtype < 0 ||
                   a->xdtype > 2)) ||
        !wc_side_ok(&a->k, a->Hkv, a->D) || !wc_side_ok(&a->v, a->Hkv, a->D))
        return WC_ERR_ARGS;
    if (a->B == 0) return WC_OK;
    int64_t nmax = 1;
    for (int b = 0; b < a->B; b++) nmax = a->seq_lens[b] > nmax ? a->seq_lens[b] : nmax;
    wc_pool pool = {.a = a, .nmax = nmax};
    atomic_init(&pool.next, 0);
    atomic_init(&pool.err, 0);
    int nt = a->num_threads < 1 ? 1 : a->num_threads;
    if (nt > a->B * a->Hkv) nt = a->B * a->Hkv;
    wc_run_workers(worker, &pool, nt, &pool.err);
    return atomic_load(&pool.err);
}
