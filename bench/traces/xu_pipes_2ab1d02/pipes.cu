// Throughput of the epilogue's conversion and special-function instructions on one SM (H200):
// which pipe F2F.BF16.F32, F2FP.BF16.F32.PACK_AB, MUFU.EX2 and MUFU.RCP use, and whether they share it.
// The program that wrote pipes.txt beside it (bench/NOTES_gemm_sm90.md, fifteenth session), kept as
// run: not built by CMake. Reading its output: the EX2, F2F, F2FP, EX2 + F2F, EX2 + F2FP and shift
// rows are measurements. The FFMA (op 0), RCP (op 2) and EX2 + RCP (op 8) rows are not: ptxas
// folded those chains (no SM issues 10 warp instructions a clock), and EX2 + RCP timed EX2 alone.
// The integer RNE row (op 7) counts one step of 6 integer instructions as one.
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

constexpr int kChains = 8, kIters = 2048;

template <int OP>
__device__ __forceinline__ void step(float (&x)[kChains]) {
#pragma unroll
    for (int c = 0; c < kChains; c++) {
        float y = x[c];
        if constexpr (OP == 0) {  // FFMA
            asm volatile("fma.rn.f32 %0, %0, 0f3F7FFFFF, 0f33800000;" : "+f"(y));
        } else if constexpr (OP == 1) {  // ex2
            asm volatile("ex2.approx.ftz.f32 %0, %0;" : "+f"(y));
        } else if constexpr (OP == 2) {  // rcp
            asm volatile("rcp.approx.ftz.f32 %0, %0;" : "+f"(y));
        } else if constexpr (OP == 3) {  // F2F bf16 then back (shift)
            asm volatile("{ .reg .b16 h; cvt.rn.bf16.f32 h, %0; cvt.f32.bf16 %0, h; }" : "+f"(y));
        } else if constexpr (OP == 4) {  // F2FP pack of (y, y)
            asm volatile("{ .reg .b32 p; cvt.rn.bf16x2.f32 p, %0, %0; mov.b32 %0, p; }" : "+f"(y));
        } else if constexpr (OP == 5) {  // ex2 + F2F
            asm volatile("{ .reg .b16 h; ex2.approx.ftz.f32 %0, %0; cvt.rn.bf16.f32 h, %0; cvt.f32.bf16 %0, h; }" : "+f"(y));
        } else if constexpr (OP == 6) {  // ex2 + F2FP
            asm volatile("{ .reg .b32 p; ex2.approx.ftz.f32 %0, %0; cvt.rn.bf16x2.f32 p, %0, %0; mov.b32 %0, p; }" : "+f"(y));
        } else if constexpr (OP == 7) {  // integer RNE to bf16 and back (6 integer instructions)
            asm volatile("{ .reg .b32 u, b; mov.b32 u, %0; shr.u32 b, u, 16; and.b32 b, b, 1; add.u32 u, u, b; add.u32 u, u, 0x7fff; and.b32 u, u, 0xffff0000; mov.b32 %0, u; }" : "+f"(y));
        } else if constexpr (OP == 8) {  // ex2 + rcp
            asm volatile("ex2.approx.ftz.f32 %0, %0; rcp.approx.ftz.f32 %0, %0;" : "+f"(y));
        } else if constexpr (OP == 9) {  // shift only (cvt.f32.bf16 of a b16: the back-conversion)
            asm volatile("{ .reg .b16 h; mov.b32 {h, _}, %0; cvt.f32.bf16 %0, h; }" : "+f"(y));
        }
        x[c] = y;
    }
}

template <int OP>
__global__ void kernel(float* out, long long* cycles) {
    float x[kChains];
#pragma unroll
    for (int c = 0; c < kChains; c++) x[c] = 1.0f + 1e-3f * (threadIdx.x + c);
    __syncthreads();
    const long long t0 = clock64();
    for (int i = 0; i < kIters; i++) step<OP>(x);
    __syncthreads();
    const long long t1 = clock64();
    float s = 0;
#pragma unroll
    for (int c = 0; c < kChains; c++) s += x[c];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}

template <int OP>
void run(const char* name, int ops_per_step, float* out, long long* cyc, int blocks, int threads) {
    kernel<OP><<<blocks, threads>>>(out, cyc);
    cudaDeviceSynchronize();
    kernel<OP><<<blocks, threads>>>(out, cyc);
    cudaDeviceSynchronize();
    long long h[1024];
    cudaMemcpy(h, cyc, blocks * sizeof(long long), cudaMemcpyDeviceToHost);
    double mean = 0;
    for (int b = 0; b < blocks; b++) mean += h[b];
    mean /= blocks;
    const double warp_instr = (double)threads / 32 * kIters * kChains * ops_per_step;
    printf("%-28s %8.1f cycles/1k-iter  %6.2f warp-instr/clk/SM  (%5.1f thread-ops/clk/SM)\n", name, mean / kIters * 1000,
           warp_instr / mean, warp_instr * 32 / mean);
}

int main() {
    int dev = 0, sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    const int blocks = sms, threads = 1024;
    float* out;
    long long* cyc;
    cudaMalloc(&out, blocks * threads * sizeof(float));
    cudaMalloc(&cyc, blocks * sizeof(long long));
    run<0>("FFMA", 1, out, cyc, blocks, threads);
    run<1>("MUFU.EX2", 1, out, cyc, blocks, threads);
    run<2>("MUFU.RCP", 1, out, cyc, blocks, threads);
    run<3>("F2F.BF16 (+shift back)", 1, out, cyc, blocks, threads);
    run<4>("F2FP.PACK_AB", 1, out, cyc, blocks, threads);
    run<5>("EX2 + F2F (+shift)", 2, out, cyc, blocks, threads);
    run<6>("EX2 + F2FP", 2, out, cyc, blocks, threads);
    run<7>("integer RNE (6 int ops)", 1, out, cyc, blocks, threads);
    run<8>("EX2 + RCP", 2, out, cyc, blocks, threads);
    run<9>("shift back only", 1, out, cyc, blocks, threads);
    printf("(counted: one warp instruction per listed op; F2F's shift back not counted)\n");
    return 0;
}
