// The tensor cores' issue rate of the three mma.sync shapes the extend's prefix kernel uses, on
// the GPU at hand: int8 m16n8k32 (the q.k's integer dots), fp16 m16n8k16 with fp32 accumulators
// (the p.v, and SDPA fp16's q.k and p.v), tf32 m16n8k8 (the radius's sums). Each warp runs
// `iters` rounds of 8 independent accumulator chains (enough to cover the mma latency) over fixed
// operands; the grid fills every SM several times. Printed: instructions per SM per cycle-free
// microsecond, the dense rate, and the cost of one instruction relative to one fp16 m16n8k16: the
// prices any new design of the prefix kernel's q.k (issue 19) is counted in.
//
//   nvcc -O3 -arch=sm_90a -o /tmp/mma_rates benchmarks/mma_rates.cu && /tmp/mma_rates
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>

constexpr int CHAINS = 8;

__device__ __forceinline__ void mma_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_tf32(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// kind 0: int8, 1: fp16, 2: tf32; the sum of every accumulator goes to out (no dead code)
template <int KIND>
__global__ void rate_kernel(int iters, uint32_t seed, float *out) {
    const uint32_t x = seed ^ (threadIdx.x * 2654435761u);
    // small operands, no special values: int8 bytes 0 / 1, fp16 pairs near 1.0, tf32 near 1.0
    const uint32_t lo = x & 0x01010101u;
    const uint32_t a0 = KIND == 0 ? lo : (KIND == 1 ? (0x3c003c00u | (lo & 0x00ff00ffu)) : (0x3f800000u | (lo << 13)));
    const uint32_t a1 = a0 ^ (KIND == 2 ? 0x2000u : 0x00010001u), a2 = a0, a3 = a1, b0 = a0, b1 = a1;
    int ci[CHAINS][4] = {};
    float cf[CHAINS][4] = {};
    for (int it = 0; it < iters; it++) {
#pragma unroll
        for (int k = 0; k < CHAINS; k++) {
            if constexpr (KIND == 0) mma_s8(ci[k], a0, a1, a2, a3, b0, b1);
            if constexpr (KIND == 1) mma_f16(cf[k], a0, a1, a2, a3, b0, b1);
            if constexpr (KIND == 2) mma_tf32(cf[k], a0, a1, a2, a3, b0, b1);
        }
    }
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < CHAINS; k++)
#pragma unroll
        for (int v = 0; v < 4; v++) s += (float)ci[k][v] + cf[k][v];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

template <int KIND>
static double run(int sms, int warps, int iters, float *out) {
    const int blocks = sms * 8;
    rate_kernel<KIND><<<blocks, warps * 32>>>(iters / 8, 1u, out);  // warm-up
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaEventRecord(e0);
    rate_kernel<KIND><<<blocks, warps * 32>>>(iters, 1u, out);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, e0, e1);
    const double inst = (double)blocks * warps * iters * CHAINS;  // warp-level mma instructions
    return inst / (ms * 1e-3) / sms;                            // per SM per second
}

int main() {
    int dev = 0, sms = 0, clk = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, dev);  // kHz
    cudaDeviceProp p;
    cudaGetDeviceProperties(&p, dev);
    float *out;
    cudaMalloc(&out, (size_t)sms * 8 * 512 * sizeof(float));
    const int iters = 4096;
    printf("device %s, %d SMs, clock %.0f MHz (nominal)\n", p.name, sms, clk / 1e3);
    printf("%-22s %5s %14s %14s %12s\n", "shape", "warps", "inst/SM/us", "dense TOP/s", "vs fp16");
    for (int warps : {4, 8}) {
        const double s8 = run<0>(sms, warps, iters, out), f16 = run<1>(sms, warps, iters, out),
                     tf = run<2>(sms, warps, iters, out);
        const double macs[3] = {16.0 * 8 * 32, 16.0 * 8 * 16, 16.0 * 8 * 8};
        const double r[3] = {s8, f16, tf};
        const char *names[3] = {"int8 m16n8k32", "fp16 m16n8k16 f32acc", "tf32 m16n8k8"};
        for (int i = 0; i < 3; i++)
            printf("%-22s %5d %14.1f %14.1f %12.2f\n", names[i], warps, r[i] * 1e-6, r[i] * sms * 2 * macs[i] * 1e-12,
                   f16 / r[i]);
    }
    const cudaError_t e = cudaDeviceSynchronize();
    printf("status: %s\n", cudaGetErrorString(e));
    return e == cudaSuccess ? 0 : 1;
}
