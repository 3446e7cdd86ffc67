/* The gate's repair of one gated decode call in C: every fired row, in batch order, in one call.
 *
 * The steps of witcert/runtime/repair_rows.py (RowCtx.repair_row / _repair_head /
 * _exact_terms, numpy and the C decode: its specification and the fallback), the same
 * arithmetic in the same order, so the same bits:
 *
 *   for each row (in order; a later row sees the entries an earlier one made exact):
 *     state = the first pass's outputs, logits and radii of the row (decoded again, all KV
 *             heads, when absent or when an earlier row of this call made one of its slots exact)
 *     todo  = the row's fired heads
 *     while todo:
 *       live = the overlay's live entries of the row's slots (this round's start)
 *       for h in todo (a non-finite query head is skipped):
 *         exact logits zx and radii ux of h's KV head from the copy (once per row and KV head)
 *         z, u = the state's; overlaid with (zx, ux) where this round already marked entries
 *                of the KV head; without such marks a head at or under tau is left alone
 *         cand  = copy finite (and held) & not live & not marked this round
 *         take  = wc_plan_head(z, u, zx, ux, cand) (policy head: every candidate)
 *         mark the taken entries exact (flag, epoch = the slot's epoch)
 *       nothing taken: stop
 *       decode the row again, only the KV heads marked this round (wc_decode, kv_sel)
 *       todo = heads with cert > tau (finite query)
 *
 * Exact terms of (row b, KV head g) for its R query heads, token t with copy rows k, v
 * (converted to f32 exactly): k64 = k with non-finite elements 0; finite_t = k, v all
 * finite (and the slot's copy held); q = the f32 query with non-finite elements 0;
 * zx = sm dot(q_r, k64) and S = dot(|q_r|, |k64|), each dot four partial sums over d mod 4
 * combined (s0 + s1) + (s2 + s3) (the fp32 operands multiply exactly in double);
 * ux = rel_s sm S + rel_l |zx| + (abs_err + softmax). An exact copy only (no rounding
 * witness: the launcher sends rounding copies to the Python path).
 */
#include <stdlib.h>

#include "decode.h"

#define WC_MAX_HQ 1024

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(WC_NO_CLONES)
/* an AVX2 clone picked at load time (as decode.c's): the same IEEE operations in the same order */
#define WC_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define WC_CLONES
#endif

int64_t wc_plan_head(int64_t n, const double *z, const double *u, const double *zx, const double *ux,
                     const uint8_t *cand, double tau, int64_t bt, double slack,
                     int64_t *blocks_out, uint8_t *take_out);

typedef struct {
    int32_t nrows;
    const int32_t *rows;       /* [nrows] rows of the batch (a) to repair, in this order */
    const uint8_t *fired;      /* [B, Hq] the heads gated (finite query heads only) */
    const float *f_out;        /* [B, Hq, D] the first pass (NULL: decode every row again) */
    const float *f_cert;       /* [B, Hq] */
    const double *f_logits;    /* [B, Hq, f_n] its logits */
    const float *f_radius;     /* [B, Hq, f_n] its whole radii */
    int64_t f_n;
    double tau, slack;         /* threshold; the plan's target slack */
    int64_t block_tokens;
    int32_t whole;             /* the head policy: every candidate at once */
    uint8_t *xflag;            /* [num_slots, Hkv] the overlay's flags (written) */
    int64_t *xepoch;           /* [num_slots, Hkv] and epochs (written) */
    const uint8_t *have;       /* [num_slots] the slot's copy is held, or NULL (all held) */
    double rel_s, rel_l, abs_err, softmax; /* the path's logit model (native_model) */
    float *out;                /* [B, Hq, D] the repaired rows' outputs (the others untouched) */
    float *cert;               /* [B, Hq] their certificates */
    int64_t *row_stats;        /* [nrows, 3]: entries made exact, fallbacks, (block, KV head) */
} wc_repair_args;

/* Whether the copy's row [D] at (slot, g) in base has a non-finite element (its bits). */
static inline int row_nonfinite(const wc_decode_args *a, const void *base, int64_t slot, int g) {
    const int64_t off = (slot * a->Hkv + g) * (int64_t)a->D;
    int bad = 0;
    if (a->xdtype == WC_X_F32) {
        const uint32_t *x = (const uint32_t *)base + off;
        for (int d = 0; d < a->D; d++) bad |= (x[d] & 0x7f800000u) == 0x7f800000u;
    } else {
        const uint16_t *x = (const uint16_t *)base + off;
        const uint16_t e = a->xdtype == WC_X_BF16 ? 0x7f80u : 0x7c00u;
        for (int d = 0; d < a->D; d++) bad |= (x[d] & e) == e;
    }
    return bad;
}

/* zx, ux [R, n] and fin [n] of KV head g of row b (slots [n]) for the tokens not live
 * (live [n]: already exact, never a candidate; their entries are left unset, fin 0). */
WC_CLONES static void exact_terms(const wc_decode_args *a, const wc_repair_args *r, int b, int g,
                                  const int64_t *slots, const uint8_t *live, int n, double *zx,
                                  double *ux, uint8_t *fin) {
    const int D = a->D, R = a->Hq / a->Hkv;
    double q[WC_MAX_R * WC_MAX_D], qa[WC_MAX_R * WC_MAX_D];
    float kr[WC_MAX_D], ka[WC_MAX_D];
    for (int h = 0; h < R; h++)
        for (int d = 0; d < D; d++) {
            float x = a->q[((int64_t)b * a->Hq + (int64_t)g * R + h) * D + d];
            q[h * D + d] = isfinite(x) ? (double)x : 0.0;
            qa[h * D + d] = fabs(q[h * D + d]);
        }
    const double sm = a->sm_scale, cs = r->rel_s * sm, c0 = r->abs_err + r->softmax;
    for (int t = 0; t < n; t++) {
        fin[t] = 0;
        if (live[t]) continue;
        exact_row(a, a->xk, slots[t], g, kr);
        int ok = (r->have ? r->have[slots[t]] != 0 : 1) && !row_nonfinite(a, a->xv, slots[t], g);
        for (int d = 0; d < D; d++) {
            const int kf = isfinite(kr[d]);
            ok &= kf;
            kr[d] = kf ? kr[d] : 0.0f;
            ka[d] = fabsf(kr[d]);
        }
        fin[t] = (uint8_t)ok;
        /* the decode's fixed-order dots: zx = sm q.k, ux (for now) = cs |q|.|k| */
        dots_qk(q, kr, R, D, sm, zx + t, (size_t)n);
        dots_qk(qa, ka, R, D, cs, ux + t, (size_t)n);
        for (int h = 0; h < R; h++)
            ux[(size_t)h * n + t] = (ux[(size_t)h * n + t] + r->rel_l * fabs(zx[(size_t)h * n + t])) + c0;
    }
}

typedef struct {
    float *out, *lse, *cert, *vb, *ur;   /* the row's state: [Hq, D], [Hq] x 3, radii [Hq, n] */
    double *z, *zx, *ux, *zz, *uu;       /* logits [Hq, n]; exact terms [Hq, n]; plan inputs [n] */
    uint8_t *fin, *have_x, *live, *mk, *nw, *cand, *take, *touched, *sel;
    int64_t *slots, *blocks;
} wc_rbuf;

static void rbuf_free(wc_rbuf *s) {
    free(s->out); free(s->lse); free(s->cert); free(s->vb); free(s->ur); free(s->z);
    free(s->zx); free(s->ux); free(s->zz); free(s->uu); free(s->fin); free(s->have_x);
    free(s->live); free(s->mk); free(s->nw); free(s->cand); free(s->take); free(s->touched);
    free(s->sel); free(s->slots); free(s->blocks);
}

static int rbuf_alloc(wc_rbuf *s, const wc_decode_args *a, int64_t n) {
    const size_t Hq = (size_t)a->Hq, Hkv = (size_t)a->Hkv, N = (size_t)n;
    memset(s, 0, sizeof(*s));
    s->out = malloc(sizeof(float) * Hq * a->D);
    s->lse = malloc(sizeof(float) * Hq);
    s->cert = malloc(sizeof(float) * Hq);
    s->vb = malloc(sizeof(float) * Hq);
    s->ur = malloc(sizeof(float) * Hq * N);
    s->z = malloc(sizeof(double) * Hq * N);
    s->zx = malloc(sizeof(double) * Hq * N);
    s->ux = malloc(sizeof(double) * Hq * N);
    s->zz = malloc(sizeof(double) * N);
    s->uu = malloc(sizeof(double) * N);
    s->fin = malloc(Hkv * N);
    s->have_x = malloc(Hkv);
    s->live = malloc(Hkv * N);
    s->mk = malloc(Hkv * N);
    s->nw = malloc(Hkv * N);
    s->cand = malloc(N);
    s->take = malloc(N);
    s->touched = calloc((size_t)a->num_slots, 1);
    s->sel = malloc(Hkv);
    s->slots = malloc(sizeof(int64_t) * N);
    s->blocks = malloc(sizeof(int64_t) * N); /* blocks <= tokens */
    if (!s->out || !s->lse || !s->cert || !s->vb || !s->ur || !s->z || !s->zx || !s->ux || !s->zz ||
        !s->uu || !s->fin || !s->have_x || !s->live || !s->mk || !s->nw || !s->cand || !s->take ||
        !s->touched || !s->sel || !s->slots || !s->blocks) {
        rbuf_free(s);
        return WC_ERR_NOMEM;
    }
    return WC_OK;
}

/* Decode row b of a into the state s (kv_sel: the KV heads to decode, NULL: all). */
static int decode_row(const wc_decode_args *a, int b, int n, wc_rbuf *s, const uint8_t *kv_sel) {
    wc_decode_args l = *a;
    l.q = a->q + (int64_t)b * a->Hq * a->D;
    l.block_table = a->block_table + (int64_t)b * a->bt_s0;
    l.seq_lens = a->seq_lens + b;
    l.delta_loc = a->delta_loc ? a->delta_loc + b : NULL;
    l.B = 1;
    l.out = s->out, l.lse = s->lse, l.cert = s->cert, l.vbound = s->vb;
    l.dbg_n = n, l.dbg_logits = s->z, l.dbg_radius = s->ur;
    l.kv_sel = kv_sel;
    return wc_decode(&l);
}

/* Repair row b (its fired heads); stats [3] += entries, fallbacks, (block, KV head) pairs. */
static int repair_row(const wc_decode_args *a, const wc_repair_args *r, int b, wc_rbuf *s,
                      int64_t *stats) {
    const int Hq = a->Hq, Hkv = a->Hkv, R = Hq / Hkv, D = a->D, P = a->page_size;
    const int n = a->seq_lens[b];
    const int32_t *bt = a->block_table + (int64_t)b * a->bt_s0;
    int touched = 0;
    for (int t = 0; t < n; t++) {
        const int64_t slot = (int64_t)bt[t / P] * P + t % P;
        if (slot < 0 || slot >= a->num_slots) return WC_ERR_SLOT;
        s->slots[t] = slot;
        touched |= s->touched[slot];
    }
    uint8_t qbad[WC_MAX_HQ], todo[WC_MAX_HQ]; /* qbad: a non-finite query head, never repaired */
    for (int h = 0; h < Hq; h++) {
        const float *x = a->q + ((int64_t)b * Hq + h) * D;
        qbad[h] = 0;
        for (int d = 0; d < D; d++) qbad[h] |= !isfinite(x[d]);
    }
    if (!r->f_logits || touched || n > r->f_n) {
        int err = decode_row(a, b, n, s, NULL);
        if (err) return err;
    } else {
        memcpy(s->out, r->f_out + (int64_t)b * Hq * D, sizeof(float) * Hq * D);
        memcpy(s->cert, r->f_cert + (int64_t)b * Hq, sizeof(float) * Hq);
        for (int h = 0; h < Hq; h++) {
            const int64_t o = ((int64_t)b * Hq + h) * r->f_n;
            memcpy(s->z + (size_t)h * n, r->f_logits + o, sizeof(double) * n);
            memcpy(s->ur + (size_t)h * n, r->f_radius + o, sizeof(float) * n);
        }
    }
    memset(s->have_x, 0, (size_t)Hkv);
    memset(s->nw, 0, (size_t)Hkv * n);
    for (int h = 0; h < Hq; h++) todo[h] = r->fired[(int64_t)b * Hq + h];
    int64_t entries = 0, fallbacks = 0;
    for (;;) {
        int any = 0;
        for (int h = 0; h < Hq; h++) any |= todo[h];
        if (!any) break;
        for (int g = 0; g < Hkv; g++)
            for (int t = 0; t < n; t++) s->live[(size_t)g * n + t] = (uint8_t)exact_live(a, s->slots[t], g);
        memset(s->sel, 0, (size_t)Hkv);
        int64_t added = 0;
        for (int h = 0; h < Hq; h++) {
            if (!todo[h] || qbad[h]) continue;
            const int g = h / R, hr = h % R;
            if (!s->have_x[g]) {
                exact_terms(a, r, b, g, s->slots, s->live + (size_t)g * n, n, s->zx + (size_t)g * R * n,
                            s->ux + (size_t)g * R * n, s->fin + (size_t)g * n);
                s->have_x[g] = 1;
            }
            const double *zx = s->zx + ((size_t)g * R + hr) * n, *ux = s->ux + ((size_t)g * R + hr) * n;
            const double *zh = s->z + (size_t)h * n;
            const float *uh = s->ur + (size_t)h * n;
            uint8_t *mk = s->mk + (size_t)g * n;
            const uint8_t *fin = s->fin + (size_t)g * n, *live = s->live + (size_t)g * n;
            if (s->sel[g]) { /* entries an earlier head of this group made exact this round */
                for (int t = 0; t < n; t++) {
                    s->zz[t] = mk[t] ? zx[t] : zh[t];
                    s->uu[t] = mk[t] ? ux[t] : (double)uh[t];
                }
            } else {
                if (!((double)s->cert[h] > r->tau)) continue;
                for (int t = 0; t < n; t++) s->zz[t] = zh[t], s->uu[t] = (double)uh[t];
            }
            int any_c = 0;
            for (int t = 0; t < n; t++) {
                s->cand[t] = fin[t] && !live[t] && !(s->sel[g] && mk[t]);
                any_c |= s->cand[t];
            }
            int64_t k;
            if (r->whole) {
                k = any_c;
                memcpy(s->take, s->cand, (size_t)n);
            } else {
                k = wc_plan_head(n, s->zz, s->uu, zx, ux, s->cand, r->tau, r->block_tokens,
                                 r->slack, s->blocks, s->take);
                if (k < 0) return WC_ERR_NOMEM;
            }
            if (!k) continue;
            int64_t cnt = 0;
            if (!s->sel[g]) memset(mk, 0, (size_t)n);
            for (int t = 0; t < n; t++) {
                if (!s->take[t]) continue;
                const int64_t slot = s->slots[t], i = slot * Hkv + g;
                r->xflag[i] = 1;
                r->xepoch[i] = a->xslot_epochs[slot];
                s->touched[slot] = 1;
                mk[t] = 1;
                s->nw[(size_t)g * n + t] = 1;
                cnt++;
            }
            s->sel[g] = 1;
            entries += cnt;
            fallbacks += r->whole != 0;
            added += cnt;
        }
        if (!added) break;
        int err = decode_row(a, b, n, s, s->sel);
        if (err) return err;
        for (int h = 0; h < Hq; h++) todo[h] = (double)s->cert[h] > r->tau && !qbad[h];
    }
    memcpy(r->out + (int64_t)b * Hq * D, s->out, sizeof(float) * Hq * D);
    memcpy(r->cert + (int64_t)b * Hq, s->cert, sizeof(float) * Hq);
    int64_t blocks = 0;
    const int64_t bk = r->block_tokens;
    for (int g = 0; g < Hkv; g++)
        for (int64_t j = 0; j * bk < n; j++) {
            int hit = 0;
            for (int64_t t = j * bk; t < n && t < (j + 1) * bk; t++) hit |= s->nw[(size_t)g * n + t];
            blocks += hit;
        }
    stats[0] += entries, stats[1] += fallbacks, stats[2] += blocks;
    return WC_OK;
}

/* Returns WC_OK or a negative WC_ERR_* code (the overlay's flags may then be partly written). */
int wc_repair_rows(const wc_decode_args *a, const wc_repair_args *r) {
    if (!a->xk || !a->cert || a->kv_sel || a->xw_rel != 0.0 || a->xw_abs != 0.0 ||
        a->D % 4 || a->Hq > WC_MAX_HQ || r->block_tokens < 1 || !r->xflag || !r->xepoch ||
        (r->f_logits && (!r->f_out || !r->f_cert || !r->f_radius)))
        return WC_ERR_ARGS;
    int64_t nmax = 1;
    for (int i = 0; i < r->nrows; i++) {
        const int b = r->rows[i];
        if (b < 0 || b >= a->B) return WC_ERR_ARGS;
        nmax = a->seq_lens[b] > nmax ? a->seq_lens[b] : nmax;
    }
    if (nmax > (int64_t)a->pages * a->page_size) return WC_ERR_ARGS;
    wc_rbuf s;
    int err = rbuf_alloc(&s, a, nmax);
    if (err) return err;
    for (int i = 0; i < r->nrows && !err; i++) {
        int64_t *st = r->row_stats + (int64_t)i * 3;
        st[0] = st[1] = st[2] = 0;
        err = repair_row(a, r, r->rows[i], &s, st);
    }
    rbuf_free(&s);
    return err;
}
