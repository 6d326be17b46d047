// The tensor cores' rate for the wgmma issue patterns of the engine's tile configurations, with
// nothing else running: no copy engine, no epilogue, operands resident in shared memory. Each
// warpgroup of a block runs the k-loop of one consumer (per k-block of 64: for each k16 step, FM
// wgmmas of m64nN sharing one B, then commit and wait for all but the last group, as
// gemm_sm90.cuh's mainloop does), over the same shared-memory stage again and again.
//
//   bench_wgmma [--iters N]
//
// Prints, for each pattern, dense bf16 flop per clock per SM (4096 is the tensor cores' peak) on one
// block (one SM) and on a block per SM (the median block), both from clock64, and the launch's
// wall time. Questions it answers: does one warpgroup issuing ping-pong's 2 x m64n128 reach the
// peak on its own (ping-pong runs one consumer's mainloop at a time), or does it take two
// warpgroups at once, as the cooperative tiles have; do wider wgmmas (n256, n320) or A from
// registers (loaded by ldmatrix, as an RS mainloop would) change the rate.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gemm_sm90.cuh"

namespace {

#define CHECK_CUDA(x)                                                                                    \
    do {                                                                                                 \
        cudaError_t e_ = (x);                                                                            \
        if (e_ != cudaSuccess) {                                                                         \
            std::fprintf(stderr, "bench_wgmma: %s: %s\n", #x, cudaGetErrorString(e_));                   \
            std::exit(1);                                                                                \
        }                                                                                                \
    } while (0)

constexpr int kBK = 64;  // a k-block: 4 k16 steps over 128-byte rows (K-major, 128-byte swizzle)

#ifdef CODA_SM90_DEVICE  // the wgmma instructions exist in the sm_90a device pass only
// d[64 x 128] += A[64 x 16] B[16 x 128], A from registers (the m16n8k16 A fragment of each warp's
// 16 rows, as ldmatrix.x4 leaves it), B K-major from shared memory. Not in the engine (its mainloop
// takes both operands from shared memory): here to measure what A from registers changes.
__device__ inline void wgmma_rs_n128(float (&d)[64], const uint32_t (&a)[4], uint64_t b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, 1, 1, 1, 0;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}
// The A fragment of k16 step kk of m64 block `base` (64 rows of 128 bytes, 128-byte swizzle): lane l
// gives row l % 16 of its warp's 16, 16-byte chunk 2 kk + l / 16, swizzled by the row.
__device__ inline void ldmatrix_a(uint32_t (&a)[4], uint32_t base, int kk) {
    const int lane = threadIdx.x % 32, row = (threadIdx.x / 32) % 4 * 16 + lane % 16;
    const int chunk = (2 * kk + lane / 16) ^ (row % 8);
    const uint32_t addr = base + row * 128 + chunk * 16;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(addr));
}

namespace ptx = codagpt::coda::sm90::ptx;

// The block's operands: `bytes` of shared memory from a 1024-byte boundary (the swizzle's), filled
// with bits that are not zero (the tensor cores' power depends on them): bf16 in [2^-7, 2^-6).
__device__ inline unsigned char* fill_operands(unsigned char* raw, int bytes) {
    unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
    for (int i = threadIdx.x; i < bytes / 2; i += blockDim.x) {
        const unsigned h = (unsigned)i * 2654435761u;
        reinterpret_cast<unsigned short*>(smem)[i] = (unsigned short)(0x3C00 | (h >> 25));
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    return smem;
}

// Ends the timed loop begun at clock t0: the last wgmmas retired, the block's cycles to cycles[],
// the accumulators' sum to out[] (so that no wgmma is dead code).
template <int FM, int NH>
__device__ inline void finish(float (&acc)[FM][NH], long long t0, float* out, long long* cycles) {
    ptx::wgmma_wait<0>();
#pragma unroll
    for (int fm = 0; fm < FM; fm++)
#pragma unroll
        for (int j = 0; j < NH; j++) ptx::fence_operand(acc[fm][j]);
    __syncthreads();
    const long long t1 = clock64();
    float sum = 0.f;
#pragma unroll
    for (int fm = 0; fm < FM; fm++)
#pragma unroll
        for (int j = 0; j < NH; j++) sum += acc[fm][j];
    out[blockIdx.x * blockDim.x + threadIdx.x] = sum;
    if (threadIdx.x == 0) cycles[blockIdx.x] = t1 - t0;
}
#endif

// N: the wgmma's n; FM: m64 blocks a warpgroup (wgmmas a k16 step sharing B); WGS: warpgroups a
// block, all issuing at once. Shared memory: each warpgroup's A (FM x 64 rows) and one B (N rows).
template <int N, int FM, int WGS>
__global__ void __launch_bounds__(128 * WGS) wgmma_loop(float* out, long long* cycles, int iters) {
#ifdef CODA_SM90_DEVICE
    extern __shared__ unsigned char smem_raw[];
    constexpr int kABytes = FM * 64 * 128, kBBytes = N * 128;
    unsigned char* smem = fill_operands(smem_raw, WGS * kABytes + kBBytes);
    const int wg = threadIdx.x / 128;
    const uint32_t a_lo = ptx::desc_lo(ptx::smem_addr(smem + wg * kABytes));
    const uint32_t b_lo = ptx::desc_lo(ptx::smem_addr(smem + WGS * kABytes));
    using Mma = ptx::Wgmma<N, 0, 0>;
    float acc[FM][N / 2];
#pragma unroll
    for (int fm = 0; fm < FM; fm++)
#pragma unroll
        for (int j = 0; j < N / 2; j++) acc[fm][j] = 0.f;

    __syncthreads();
    const long long t0 = clock64();
    for (int it = 0; it < iters; it++) {
        ptx::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; kk++) {
            const uint64_t b_desc = ptx::desc(b_lo + kk * 32 / 16);
#pragma unroll
            for (int fm = 0; fm < FM; fm++)
                Mma::run(acc[fm], ptx::desc(a_lo + (fm * 64 * 128 + kk * 32) / 16), b_desc, 1);
        }
        ptx::wgmma_commit();
        ptx::wgmma_wait<1>();
    }
    finish(acc, t0, out, cycles);
#endif
}

// Ping-pong's pattern with A from registers: FM m64n128 blocks of one warpgroup, each k16 step's A
// fragments loaded by ldmatrix, every k-block (RELOAD) or once. Two register sets alternate by
// k-block; a set is reloaded once the wait after the next k-block's issue has retired the wgmmas
// that read it.
template <int FM, bool RELOAD>
__global__ void __launch_bounds__(128) wgmma_rs_loop(float* out, long long* cycles, int iters) {
#ifdef CODA_SM90_DEVICE
    extern __shared__ unsigned char smem_raw[];
    constexpr int kABytes = FM * 64 * 128, kBBytes = 128 * 128;
    unsigned char* smem = fill_operands(smem_raw, kABytes + kBBytes);
    const uint32_t a_base = ptx::smem_addr(smem), b_lo = ptx::desc_lo(ptx::smem_addr(smem + kABytes));
    float acc[FM][64];
#pragma unroll
    for (int fm = 0; fm < FM; fm++)
#pragma unroll
        for (int j = 0; j < 64; j++) acc[fm][j] = 0.f;
    uint32_t a[2][FM][kBK / 16][4];
    auto load = [&](int set) {
#pragma unroll
        for (int fm = 0; fm < FM; fm++)
#pragma unroll
            for (int kk = 0; kk < kBK / 16; kk++) ldmatrix_a(a[set][fm][kk], a_base + fm * 64 * 128, kk);
    };
    auto kblock = [&](int set) {
        ptx::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBK / 16; kk++)
#pragma unroll
            for (int fm = 0; fm < FM; fm++) wgmma_rs_n128(acc[fm], a[set][fm][kk], ptx::desc(b_lo + kk * 32 / 16));
        ptx::wgmma_commit();
        ptx::wgmma_wait<1>();
    };
    load(0);
    load(1);
    __syncthreads();
    const long long t0 = clock64();
    for (int it = 0; it < iters; it += 2) {
        kblock(0);  // its wait retired the k-block on set 1
        if (RELOAD) load(1);
        kblock(1);  // and this one's, the k-block on set 0
        if (RELOAD) load(0);
    }
    finish(acc, t0, out, cycles);
#endif
}

struct Result {
    double one_sm, all_sms;  // flop per clock per SM
    double all_ms, all_mhz;
};

using LoopKernel = void (*)(float*, long long*, int);

Result measure(LoopKernel kernel, int threads, double flop_per_iter, int iters, int sms) {
    // 200 KB of shared memory a block (a pattern needs at most 57 KB): one block an SM.
    const int smem = 200 * 1024;
    CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    float* out;
    long long* cycles;
    CHECK_CUDA(cudaMalloc(&out, sizeof(float) * sms * threads));
    CHECK_CUDA(cudaMalloc(&cycles, sizeof(long long) * sms));
    Result r{};
    // One block: one SM, its own clock (no other SM drawing power).
    kernel<<<1, threads, smem>>>(out, cycles, iters / 10);  // warm-up
    kernel<<<1, threads, smem>>>(out, cycles, iters);
    CHECK_CUDA(cudaDeviceSynchronize());
    long long c1;
    CHECK_CUDA(cudaMemcpy(&c1, cycles, sizeof c1, cudaMemcpyDeviceToHost));
    r.one_sm = flop_per_iter * iters / (double)c1;
    // A block per SM: the median block's cycles, and the wall time by events.
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    kernel<<<sms, threads, smem>>>(out, cycles, iters);
    CHECK_CUDA(cudaEventRecord(e0));
    kernel<<<sms, threads, smem>>>(out, cycles, iters);
    CHECK_CUDA(cudaEventRecord(e1));
    CHECK_CUDA(cudaEventSynchronize(e1));
    CHECK_CUDA(cudaGetLastError());
    float ms = 0.f;
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    std::vector<long long> c(sms);
    CHECK_CUDA(cudaMemcpy(c.data(), cycles, sizeof(long long) * sms, cudaMemcpyDeviceToHost));
    std::sort(c.begin(), c.end());
    const double med = (double)c[sms / 2];
    r.all_sms = flop_per_iter * iters / med;
    r.all_ms = ms;
    r.all_mhz = med / (ms * 1e3);  // block cycles over the launch's wall time: a lower bound of the clock
    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
    CHECK_CUDA(cudaFree(out));
    CHECK_CUDA(cudaFree(cycles));
    return r;
}

void print_row(const char* name, const char* engine_use, const Result& r) {
    std::printf("%-26s %-34s %8.0f %8.0f %6.0f%% %8.2f %6.0f\n", name, engine_use, r.one_sm, r.all_sms,
                100.0 * r.all_sms / 4096.0, r.all_ms, r.all_mhz);
}

template <int N, int FM, int WGS>
void row(const char* name, const char* engine_use, int iters, int sms) {
    print_row(name, engine_use, measure(wgmma_loop<N, FM, WGS>, 128 * WGS, 2.0 * WGS * FM * 64.0 * N * kBK, iters, sms));
}

template <int FM, bool RELOAD>
void row_rs(const char* name, const char* engine_use, int iters, int sms) {
    print_row(name, engine_use, measure(wgmma_rs_loop<FM, RELOAD>, 128, 2.0 * FM * 64.0 * 128 * kBK, iters, sms));
}

}  // namespace

int main(int argc, char** argv) {
    int iters = 20000;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        if (a == "--iters" && i + 1 < argc) iters = std::max(10, std::atoi(argv[++i]));
        else {
            std::fprintf(stderr, "bench_wgmma: unknown argument %s (usage: bench_wgmma [--iters N])\n", a.c_str());
            return 2;
        }
    }
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    if (prop.major != 9) {
        std::fprintf(stderr, "bench_wgmma: needs a Hopper GPU (sm_90), found %s\n", prop.name);
        return 1;
    }
    const int sms = prop.multiProcessorCount;
    std::printf("%s, %d SMs, %d k-blocks of 64 a warpgroup\n", prop.name, sms, iters);
    std::printf("%-26s %-34s %8s %8s %7s %8s %6s\n", "pattern (a warpgroup)", "where the engine issues it",
                "1 SM", "all SMs", "/peak", "ms", "MHz>=");
    row<128, 2, 1>("2 x m64n128, 1 WG", "ping-pong 128x128 (one consumer)", iters, sms);
    row<128, 2, 2>("2 x m64n128, 2 WGs", "cooperative 256x128", iters, sms);
    row<128, 1, 1>("1 x m64n128, 1 WG", "ping-pong half tile rows", iters, sms);
    row<128, 1, 2>("1 x m64n128, 2 WGs", "cooperative 128x128", iters, sms);
    row<256, 1, 1>("1 x m64n256, 1 WG", "(ping-pong 64x256, dropped)", iters, sms);
    row<256, 1, 2>("1 x m64n256, 2 WGs", "cooperative 128x256", iters, sms);
    row<320, 1, 2>("1 x m64n320, 2 WGs", "cooperative 128x320 (n256 + n64)", iters, sms);
    row<64, 2, 1>("2 x m64n64, 1 WG", "(narrow half tiles, one consumer)", iters, sms);
    row_rs<2, true>("2 x m64n128 RS, 1 WG", "A by ldmatrix each k-block (not used)", iters & ~1, sms);
    row_rs<2, false>("2 x m64n128 RS, 1 WG", "A loaded once (not used)", iters & ~1, sms);
    return 0;
}
