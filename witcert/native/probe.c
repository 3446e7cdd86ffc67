/* Probes of the native path for the bitwise tests: the dither and the dequantized pool.
 *
 * wc_dither is witcert.ref.philox.dither and wc_gather the xhat of witcert.ref.pool.gather,
 * built from the same helpers (common.h) the decode and the write use.
 */
#include "common.h"

/* Dither xi f32 [T, H, D] of KV heads 0..H-1 (witcert.ref.philox.dither), for tests. */
int wc_dither(const int64_t *slots, const int64_t *epochs, int64_t T, int32_t H, int32_t D,
              int32_t layer, int32_t side, int32_t bits, uint32_t key0, uint32_t key1,
              float *xi, int32_t rounds) {
    if (D < 1 || D > WC_MAX_D || (bits != 8 && bits != 16 && bits != 24) || H < 1 ||
        H > 0x10000 || layer < 0 || layer > 0xFFFF || (side != 0 && side != 1) ||
        (rounds != 7 && rounds != 10))
        return WC_ERR_ARGS;
    const int cpc = wc_cpc(bits), nch = (D + cpc - 1) / cpc;
    wc_words wb;
    uint32_t s32[WC_TILE], e32[WC_TILE];
    for (int32_t h = 0; h < H; h++) {
        uint32_t c1 = ((uint32_t)layer << 16) | (uint32_t)h;
        for (int64_t t0 = 0; t0 < T; t0 += WC_TILE) {
            int tn = T - t0 < WC_TILE ? (int)(T - t0) : WC_TILE;
            for (int i = 0; i < tn; i++) {
                int64_t sl = slots[t0 + i], ep = epochs[t0 + i];
                if (sl < 0 || sl > (int64_t)UINT32_MAX) return WC_ERR_SLOT;
                if (ep < 0 || ep > (int64_t)UINT32_MAX) return WC_ERR_EPOCH;
                s32[i] = (uint32_t)sl;
                e32[i] = (uint32_t)ep;
            }
            wc_words_tile(tn, s32, e32, c1, (uint32_t)side, nch, key0, key1, rounds, &wb);
            for (int i = 0; i < tn; i++)
                wc_xi(bits, &wb, (size_t)i * nch * cpc, D, xi + ((t0 + i) * H + h) * (int64_t)D);
        }
    }
    return WC_OK;
}

/* Dequantized tokens f32 [T, Hkv, D] of one side, exactly the reference pool.gather:
 * (float(n) - xi) * float(s), bypassed channels take outl, a token-head with any infinite
 * scale reads 0. positions: int64 [num_slots] (position-keyed dither) or NULL (slot key). */
int wc_gather(const wc_side *sd, const int64_t *epochs, const int64_t *positions,
              int64_t num_slots, const int64_t *slots,
              int64_t T, int32_t Hkv, int32_t D, int32_t G, int32_t layer, int32_t side,
              int32_t bits, uint32_t key0, uint32_t key1, float *out, int32_t rounds) {
    if (D < 1 || D > WC_MAX_D || G < 1 || D % G || D / G > WC_MAX_NG ||
        (bits != 8 && bits != 16 && bits != 24) || Hkv < 1 || Hkv > 0x10000 || layer < 0 ||
        layer > 0xFFFF || (side != 0 && side != 1) || (rounds != 7 && rounds != 10) ||
        !wc_side_ok(sd, Hkv, D))
        return WC_ERR_ARGS;
    const int NG = D / G, cpc = wc_cpc(bits), nch = (D + cpc - 1) / cpc;
    wc_words wb;
    float sc[WC_MAX_NG];
    uint32_t s32[WC_TILE], e32[WC_TILE];
    for (int32_t h = 0; h < Hkv; h++) {
        uint32_t c1 = ((uint32_t)layer << 16) | (uint32_t)h;
        for (int64_t t0 = 0; t0 < T; t0 += WC_TILE) {
            int tn = T - t0 < WC_TILE ? (int)(T - t0) : WC_TILE;
            for (int i = 0; i < tn; i++) {
                int64_t sl = slots[t0 + i];
                if (sl < 0 || sl >= num_slots) return WC_ERR_SLOT;
                int err = wc_counter_words(positions, epochs, sl, &s32[i], &e32[i]);
                if (err) return err;
            }
            wc_words_tile(tn, s32, e32, c1, (uint32_t)side, nch, key0, key1, rounds, &wb);
            for (int i = 0; i < tn; i++) {
                int64_t sl = slots[t0 + i];
                float *dst = out + ((t0 + i) * Hkv + h) * (int64_t)D;
                wc_load_groups(sd->scales, sd->scales_s0, sd->scales_s1, sl, h, NG, sc);
                int bad = 0;
                for (int g = 0; g < NG; g++) bad |= isinf(sc[g]) != 0;
                wc_dequant(bits, sd->codes + sl * sd->codes_s0 + (int64_t)h * sd->codes_s1, &wb,
                           (size_t)i * nch * cpc, sc, D, G, dst);
                wc_apply_outl(sd, sl, h, dst);
                if (bad)
                    for (int d = 0; d < D; d++) dst[d] = 0.0f;
            }
        }
    }
    return WC_OK;
}

/* One Philox4x32 block per counter (Random123 known-answer tests): ctr uint32 [n, 4],
 * key uint32 [n, 2] -> out uint32 [n, 4], `rounds` rounds (10 or 7). */
int wc_philox_block(const uint32_t *ctr, const uint32_t *key, int64_t n, int32_t rounds,
                    uint32_t *out) {
    if (n < 0 || (rounds != 7 && rounds != 10)) return WC_ERR_ARGS;
    for (int64_t i = 0; i < n; i++) {
        uint32_t x0 = ctr[4 * i], x1 = ctr[4 * i + 1], x2 = ctr[4 * i + 2], x3 = ctr[4 * i + 3];
        wc_philox(1, &x0, &x1, &x2, &x3, key[2 * i], key[2 * i + 1], rounds);
        out[4 * i] = x0;
        out[4 * i + 1] = x1;
        out[4 * i + 2] = x2;
        out[4 * i + 3] = x3;
    }
    return WC_OK;
}

/* Philox4x32 of n lanes sharing one key (k0, k1), as a tile's lanes do, through one
 * implementation: impl 0 the portable C, 1 the AVX2 path, 2 the AVX-512 path (each with its
 * interleaved vectors and its remainder), 3 the dispatcher the kernels call. ctr, out: uint32
 * [n, 4]. Returns WC_ERR_ARGS for an implementation this build or CPU does not have. */
int wc_philox_lanes(int32_t impl, const uint32_t *ctr, uint32_t k0, uint32_t k1, int64_t n,
                    int32_t rounds, uint32_t *out) {
    if (n < 0 || n > WC_MAX_LANES || (rounds != 7 && rounds != 10) || impl < 0 || impl > 3)
        return WC_ERR_ARGS;
    uint32_t x[4][WC_MAX_LANES];
    for (int64_t i = 0; i < n; i++)
        for (int w = 0; w < 4; w++) x[w][i] = ctr[4 * i + w];
    const int m = (int)n;
    if (impl == 0) wc_philox_c(m, x[0], x[1], x[2], x[3], k0, k1, rounds);
    else if (impl == 3) wc_philox(m, x[0], x[1], x[2], x[3], k0, k1, rounds);
#ifdef WC_PHILOX_AVX2
    else if (impl == 1 && __builtin_cpu_supports("avx2"))
        wc_philox_avx2(m, x[0], x[1], x[2], x[3], k0, k1, rounds);
    else if (impl == 2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2"))
        wc_philox_avx512(m, x[0], x[1], x[2], x[3], k0, k1, rounds);
#endif
    else return WC_ERR_ARGS;
    for (int64_t i = 0; i < n; i++)
        for (int w = 0; w < 4; w++) out[4 * i + w] = x[w][i];
    return WC_OK;
}

/* out[i] = wc_h2f(h[i]) for n fp16 bit patterns (tests compare every pattern with torch). */
int wc_h2f_probe(const uint16_t *h, int64_t n, float *out) {
    if (n < 0) return WC_ERR_ARGS;
    for (int64_t i = 0; i < n; i++) out[i] = wc_h2f(h[i]);
    return WC_OK;
}
