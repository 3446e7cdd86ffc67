/* The gate's block plan of one query head in C: the steps of witcert/runtime/repair_plan.py
 * (`_plan`, numpy, its specification and the fallback), in double precision.
 *
 * A head's certificate is E / W with W = sum_t exp(z_t - m) and E = sum_t exp(z_t - m) expm1(u_t).
 * Making an entry exact replaces (z_t, u_t) by (zx_t, ux_t), which changes W and E by that
 * entry's terms only, so the greedy order (largest block contribution sum p_t expm1(u_t) first)
 * is one sort and the certificate after the first k blocks is a ratio of prefix sums. The
 * estimate decides the order and where to stop, never what is reported: the caller recomputes
 * the certificate and plans again if it is still above tau. Sums here are sequential, numpy's
 * are pairwise, so a plan can differ from the numpy one only where two block contributions or a
 * certificate and tau agree to the last bits.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* exp(s + u) (1 - exp(-u)) = exp(s) expm1(u); +inf where u = +inf */
static double excess(double s, double u) { return u == INFINITY ? INFINITY : exp(s + u) * -expm1(-u); }

typedef struct { double key; int64_t j; } wc_blk;

/* descending contribution; NaN last; ties by block index (a stable sort) */
static int cmp_blk(const void *pa, const void *pb) {
    const wc_blk *a = pa, *b = pb;
    int an = isnan(a->key), bn = isnan(b->key);
    if (an != bn) return an - bn;
    if (!an && a->key != b->key) return a->key > b->key ? -1 : 1;
    return (a->j > b->j) - (a->j < b->j);
}

/* z, u, zx, ux: double [n]; cand: uint8 [n]; blocks of bt tokens; an estimate is under tau
 * when estimate * slack <= tau. Writes the blocks to take, in order, to blocks_out [nb] and the
 * entries to take (candidates in those blocks) to take_out [n]. Returns the number of blocks
 * (0: nothing to do), or -1 when scratch memory cannot be had. */
int64_t wc_plan_head(int64_t n, const double *z, const double *u, const double *zx, const double *ux,
                     const uint8_t *cand, double tau, int64_t bt, double slack,
                     int64_t *blocks_out, uint8_t *take_out) {
    for (int64_t i = 0; i < n; i++) take_out[i] = 0;
    int any_c = 0;
    for (int64_t i = 0; i < n; i++) {
        if (u[i] == INFINITY && !cand[i]) return 0;  /* a flagged entry no repair can reach */
        any_c |= cand[i] != 0;
    }
    if (!any_c) return 0;
    const int64_t nb = (n + bt - 1) / bt;
    double m = -INFINITY;
    int has_nan = 0;
    for (int64_t i = 0; i < n; i++) {
        double a = z[i], b = cand[i] ? zx[i] : z[i];
        has_nan |= isnan(a) || isnan(b);
        if (a > m) m = a;
        if (b > m) m = b;
    }
    if (has_nan) m = NAN;
    double *blk = malloc(sizeof(double) * 3 * (size_t)nb);
    wc_blk *ord = malloc(sizeof(wc_blk) * (size_t)nb);
    int64_t *nbad = malloc(sizeof(int64_t) * (size_t)nb);
    if (!blk || !ord || !nbad) {
        free(blk); free(ord); free(nbad);
        return -1;
    }
    double *contrib = blk, *dw = blk + nb, *de = blk + 2 * nb;
    for (int64_t j = 0; j < nb; j++) contrib[j] = dw[j] = de[j] = 0.0, nbad[j] = 0;
    double sw = 0.0, sef = 0.0;
    int64_t bad_total = 0;
    for (int64_t i = 0; i < n; i++) {
        const int c = cand[i] != 0;
        const double zc = c ? zx[i] : z[i];
        const double w = exp(z[i] - m), x = exp(zc - m);
        const double e = excess(z[i] - m, u[i]);
        const double ex = excess(zc - m, c ? ux[i] : u[i]);
        const int bad = e == INFINITY;
        const double ef = bad ? 0.0 : e;
        const int64_t j = i / bt;
        sw += w;
        sef += ef;
        bad_total += bad;
        if (c) {
            contrib[j] += e;
            dw[j] += x - w;
            de[j] += ex - ef;
            nbad[j] += bad;
        }
    }
    int64_t k = 0;
    if (bad_total || !(sef / sw * slack <= tau)) {
        int64_t npos = 0;
        for (int64_t j = 0; j < nb; j++) {
            ord[j].key = contrib[j];
            ord[j].j = j;
            npos += contrib[j] > 0.0;
        }
        if (npos > 0) {
            qsort(ord, (size_t)nb, sizeof(wc_blk), cmp_blk);
            double cw = 0.0, ce = 0.0;
            int64_t left = bad_total;
            k = npos;
            for (int64_t t = 0; t < npos; t++) {
                const int64_t j = ord[t].j;
                ce += de[j];
                cw += dw[j];
                left -= nbad[j];
                const double cert = left > 0 ? INFINITY : (sef + ce) / (sw + cw);
                if (cert * slack <= tau) {
                    k = t + 1;
                    break;
                }
            }
            for (int64_t t = 0; t < k; t++) {
                const int64_t j = ord[t].j;
                blocks_out[t] = j;
                for (int64_t i = j * bt; i < n && i < (j + 1) * bt; i++) take_out[i] = cand[i] != 0;
            }
        }
    }
    free(blk); free(ord); free(nbad);
    return k;
}
