// The CUDA write kernel: quantize, dither, witness and store the K and V of new tokens into the
// dithered-INT8 pool, bitwise what the reference writer stores (witcert.ref.pool.write_, and the
// Triton twin witcert/kernels/write.py: codes, scales and witnesses torch.equal).
//
// Configuration (witcert/kernels/cuda/__init__.py): head dim 128, scale groups of WC_G = 32 / 64 /
// 128 channels, WC_BITS = 8 / 16 dither bits, WC_ROUNDS = 10 / 7 Philox rounds, no bypassed
// channels; other pools take the Triton kernel.
//
// Layout: each thread takes CALLS Philox calls of a row, i.e. CH = CALLS x CPC = 16 consecutive
// channels (CPC = 8 at b = 16, 16 at b = 8), so TPR = 8 threads per (token, KV head) row (adjacent
// lanes of a warp: 4 rows per warp, 32 per CTA); a scale group is G / 16 adjacent lanes. Each thread quantizes its channels of K, then of V
// (both sides share the row's slot, epoch and counter word loads). Per row and side:
//   bad    = a non-finite input anywhere in the row, or a scale that overflows fp16 (row-wide OR)
//   s_g    = max(fp16_up(amax_g / 126.5), 2^-14), amax_g = max |x| over the group (IEEE quotient)
//   xi_c   = (2 r_c + 1 - 2^b) 2^-(b+1), r_c the channel's field of the Philox words of counter
//            (word0, layer << 16 | kv_head, side << 31 | chunk, epoch), key (seed lo, seed hi)
//   n_c    = round_half_even(x_c / s_g + xi_c) (IEEE quotient: div_fast; 0 when bad)
//   wit_g  = fp16_up(e + e 2^-40), e = sqrt(sum_c (fl32((n_c - xi_c) s_g) - x_c)^2) in float64
//            (0 terms when bad)
// stored: codes n (int8), scales s (fp16; +inf when bad), witnesses wit (fp16; +inf when bad).
// Every floating-point step is an explicit _rn intrinsic: no contraction into fused multiply-adds,
// so each value is the one the reference computes. The float64 sum of a group's squared errors
// runs in another order than the reference's, which only matters for a norm within 2^-50 or so
// of an fp16 boundary before the 2^-40 inflation, i.e. never for the stored (rounded-up) witness
// in practice; the tests compare every stored byte.
#include "common.cuh"

constexpr int CALLS = 16 / CPC;  // Philox calls per thread and side: 16 channels per thread (measured
                                 // 1.21x faster than 8 at b = 16, the same as 32 at b = 8: BENCHMARKS 4r)
constexpr int CH = CPC * CALLS;  // channels per thread
constexpr int TPR = HD / CH;     // threads per (token, KV head) row
constexpr int TPG = G / CH;      // threads per scale group
constexpr int THREADS = 256;
constexpr int RPB = THREADS / TPR;  // rows per CTA
static_assert(TPR <= 32 && TPG >= 1 && TPG <= TPR, "layout");

struct WriteArgs {
    const void *k, *v;             // [T, Hkv, 128] fp32 / fp16 / bf16, channel stride 1
    int8_t *kc, *vc;               // codes [num_slots, Hkv, 128]
    __half *ks, *vs, *kw, *vw;     // scales, witnesses [num_slots, Hkv, NG]
    const int64_t *slots;          // [T]
    const int64_t *epochs;         // [num_slots]
    const int64_t *positions;      // [num_slots] (position-keyed dither), or NULL
    int64_t sk_t, sk_h, sv_t, sv_h;  // element strides of k / v (token, head)
    int64_t num_rows;              // T * Hkv (< 2^31)
    uint32_t key0, key1;           // Philox key: seed low / high 32 bits
    int32_t x_dtype;               // 0 fp32, 1 fp16, 2 bf16 (the same for k and v)
    int32_t Hkv, layer;
};

// The least fp16 >= x (x >= 0 or NaN; NaN -> +inf), as bits: witcert.ref.fp.fp16_round_up.
// Any conversion that returns one of x's two fp16 neighbours gives the same result after the
// fix-up, so the float64 one may round once or twice.
__device__ __forceinline__ uint16_t fp16_up_bits(float x) {
    if (x != x) return 0x7C00u;
    const __half h = __float2half_rn(x);
    uint16_t b = __half_as_ushort(h);
    if (__half2float(h) < x) b = b < 0x8000u ? b + 1 : b - 1;
    return b;
}
__device__ __forceinline__ uint16_t fp16_up_bits(double x) {
    if (x != x) return 0x7C00u;
    const __half h = __double2half(x);
    uint16_t b = __half_as_ushort(h);
    if ((double)__half2float(h) < x) b = b < 0x8000u ? b + 1 : b - 1;
    return b;
}

// The CH inputs of this thread (16-byte aligned: the launcher checks) as floats.
__device__ __forceinline__ void load_x(const void *base, int dtype, int64_t off, float (&x)[CH]) {
    if (dtype == 0) {
        const float4 *p = reinterpret_cast<const float4 *>(static_cast<const float *>(base) + off);
#pragma unroll
        for (int i = 0; i < CH / 4; i++) {
            const float4 f = __ldg(p + i);
            x[4 * i] = f.x; x[4 * i + 1] = f.y; x[4 * i + 2] = f.z; x[4 * i + 3] = f.w;
        }
    } else {
        const uint4 *p = reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(base) + off);
#pragma unroll
        for (int i = 0; i < CH / 8; i++) {
            const uint4 u = __ldg(p + i);
            const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const uint16_t lo = (uint16_t)(w[j] & 0xFFFFu), hi = (uint16_t)(w[j] >> 16);
                if (dtype == 1) {
                    x[8 * i + 2 * j] = __half2float(__ushort_as_half(lo));
                    x[8 * i + 2 * j + 1] = __half2float(__ushort_as_half(hi));
                } else {  // bf16: the top half of an fp32 (exact, subnormals included)
                    x[8 * i + 2 * j] = __uint_as_float((uint32_t)lo << 16);
                    x[8 * i + 2 * j + 1] = __uint_as_float((uint32_t)hi << 16);
                }
            }
        }
    }
}

// The IEEE quotient RN(x / s) where the code needs it. div.rn.f32 compiles to MUFU.RCP of s, one
// Newton step r = r0 + r0 (1 - s r0), q0 = RN(x r), q1 = RN(q0 + r (x - s q0)) (fused), and a range
// check (FCHK) that sends operands near the exponent limits to a slow path. Every thread divides
// by one scale s in [2^-14, 65504] (an fp16 value), so r is formed once (div_rcp) and each x
// costs three operations (div_fast): the same operations, so the same bits as div.rn wherever
// FCHK passes, which holds for these s and 2^-80 <= |x| < 2^23 (|x| <= 126.5 s in a row that is
// not flagged). Smaller x (zeros and subnormals included) return 0: there |x / s| < 2^-66, and
// the code only reads RN(q + xi) with |xi| >= 2^-17, which is xi for any such q. A flagged row's
// codes are 0 whatever q is. tests/test_cuda_write.py compares div_fast with div.rn over every
// fp16 scale (wc_div_probe).
__device__ __forceinline__ float div_rcp(float s) {
    const float r0 = rcp_approx(s);
    return __fmaf_rn(r0, __fmaf_rn(-s, r0, 1.0f), r0);
}
__device__ __forceinline__ float div_fast(float x, float s, float r) {
    const float q0 = __fmul_rn(x, r);
    const float q1 = __fmaf_rn(r, __fmaf_rn(-s, q0, x), q0);
    return fabsf(x) < 0x1p-80f ? 0.0f : q1;
}

// One side of this thread's row: lane `sub` (0..TPR-1) of the row holds channels sub * CH...,
// Philox chunks sub * CALLS...; x: its CH inputs of this side (0 for a row past the end).
__device__ __forceinline__ void quant_side(const float (&x)[CH], int8_t *codes, __half *scales, __half *wits,
                                           int64_t prow, int sub, uint32_t word0, uint32_t c1, uint32_t side,
                                           uint32_t epoch, uint32_t k0, uint32_t k1, bool row_ok) {
    int nonfinite = 0;
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < CH; i++) {
        const float a = fabsf(x[i]);
        nonfinite |= !(a <= FMAX);  // inf or NaN
        amax = fmaxf(amax, a);
    }
#pragma unroll
    for (int o = TPG / 2; o >= 1; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(FULL, amax, o));
    float s = __half2float(__ushort_as_half(fp16_up_bits(__fdiv_rn(amax, 126.5f))));
    s = fmaxf(s, 6.103515625e-05f);  // 2^-14
    int bad = nonfinite | (s == INF);
#pragma unroll
    for (int o = TPR / 2; o >= 1; o >>= 1) bad |= __shfl_xor_sync(FULL, bad, o);

    const float rs = div_rcp(s);
    uint4 w[CALLS];
#pragma unroll
    for (int c = 0; c < CALLS; c++) w[c] = philox(word0, c1, (side << 31) | (uint32_t)(sub * CALLS + c), epoch, k0, k1);
    double ss = 0.0;
    uint32_t packed[CH / 4], nb[4];
#pragma unroll
    for (int i = 0; i < CH; i++) {
        const float xi = dither_xi(w[i / CPC], i % CPC);
        const float y = __fadd_rn(div_fast(x[i], s, rs), xi);
        const float tn = __fadd_rn(y, 12582912.0f);  // 1.5 2^23 + n: half to even, n in its low byte
        float n = __fsub_rn(tn, 12582912.0f);
        n = bad ? 0.0f : n;
        const float xhat = __fmul_rn(__fsub_rn(n, xi), s);
        const double e = bad ? 0.0 : __dsub_rn((double)xhat, (double)x[i]);
        ss = __dadd_rn(ss, __dmul_rn(e, e));
        // the code byte from tn's bits (its mantissa is 2^22 + n: the low byte is n's two's
        // complement), four of them packed by byte permutes (a flagged row's codes are 0 below)
        nb[i & 3] = __float_as_uint(tn);
        if ((i & 3) == 3)
            packed[i >> 2] = __byte_perm(__byte_perm(nb[0], nb[1], 0x0040u), __byte_perm(nb[2], nb[3], 0x0040u), 0x5410u);
    }
#pragma unroll
    for (int i = 0; i < CH / 4; i++) packed[i] = bad ? 0u : packed[i];
#pragma unroll
    for (int o = TPG / 2; o >= 1; o >>= 1) ss = __dadd_rn(ss, __shfl_xor_sync(FULL, ss, o));
    if (!row_ok) return;
    int8_t *cp = codes + prow * HD + sub * CH;
    if (CH == 8) *reinterpret_cast<uint2 *>(cp) = make_uint2(packed[0], packed[1]);
    else
#pragma unroll
        for (int i = 0; i < CH / 16; i++)
            reinterpret_cast<uint4 *>(cp)[i] = make_uint4(packed[4 * i], packed[4 * i + 1], packed[4 * i + 2],
                                                          packed[4 * i + 3]);
    if (sub % TPG == 0) {
        const double nrm = __dsqrt_rn(ss);
        const uint16_t wb = bad ? 0x7C00u : fp16_up_bits(__dadd_rn(nrm, __dmul_rn(nrm, 9.094947017729282e-13)));
        const int g = sub / TPG;
        scales[prow * NG + g] = bad ? __ushort_as_half(0x7C00u) : __float2half_rn(s);
        wits[prow * NG + g] = __ushort_as_half(wb);
    }
}

__global__ void __launch_bounds__(THREADS) wc_write_kernel(const WriteArgs a) {
    const int lane_row = threadIdx.x / TPR, sub = threadIdx.x % TPR;
    const uint32_t row = blockIdx.x * RPB + lane_row;  // < 2^31: the launcher checks
    const bool row_ok = row < (uint32_t)a.num_rows;  // the row's lanes stay for the shuffles
    const uint32_t tok32 = row_ok ? row / (uint32_t)a.Hkv : 0u;  // a 32-bit division, once per thread
    const int64_t tok = tok32;
    const int head = row_ok ? (int)(row - tok32 * (uint32_t)a.Hkv) : 0;
    const int64_t slot = row_ok ? a.slots[tok] : 0;
    const uint32_t epoch = row_ok ? (uint32_t)a.epochs[slot] : 0u;
    const uint32_t word0 = row_ok ? (uint32_t)(a.positions ? a.positions[slot] : slot) : 0u;
    const uint32_t c1 = ((uint32_t)a.layer << 16) | (uint32_t)head;
    const int64_t prow = slot * a.Hkv + head;
    float xk[CH], xv[CH];  // both sides' loads first: V's are in flight while K is quantized
    if (row_ok) {
        load_x(a.k, a.x_dtype, tok * a.sk_t + head * a.sk_h + sub * CH, xk);
        load_x(a.v, a.x_dtype, tok * a.sv_t + head * a.sv_h + sub * CH, xv);
    } else {
#pragma unroll
        for (int i = 0; i < CH; i++) xk[i] = xv[i] = 0.0f;
    }
    quant_side(xk, a.kc, a.ks, a.kw, prow, sub, word0, c1, 0u, epoch, a.key0, a.key1, row_ok);
    quant_side(xv, a.vc, a.vs, a.vw, prow, sub, word0, c1, 1u, epoch, a.key0, a.key1, row_ok);
}

// Probe for the tests: out[i] = div_fast(x[i], s[i]) and ieee[i] = RN(x[i] / s[i]) (div.rn).
__global__ void wc_div_probe_kernel(const float *x, const float *s, float *out, float *ieee, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[i] = div_fast(x[i], s[i], div_rcp(s[i]));
    ieee[i] = __fdiv_rn(x[i], s[i]);
}
extern "C" int wc_div_probe(const float *x, const float *s, float *out, float *ieee, int n, cudaStream_t stream) {
    wc_div_probe_kernel<<<(n + 255) / 256, 256, 0, stream>>>(x, s, out, ieee, n);
    return (int)cudaGetLastError();
}

// Rows per CTA of this build (the launcher's grid is cdiv(T * Hkv, wc_write_rows_per_cta())).
extern "C" int wc_write_rows_per_cta() { return RPB; }

// sizeof(WriteArgs): the ctypes mirror's size must match (tests/test_cuda_build.py, no GPU needed)
extern "C" int wc_write_args_bytes() { return (int)sizeof(WriteArgs); }

extern "C" int wc_write_launch(const WriteArgs *a, int grid, cudaStream_t stream) {
    wc_write_kernel<<<grid, THREADS, 0, stream>>>(*a);
    return (int)cudaGetLastError();
}
