// The tensor cores' rate and energy for the wgmma issue patterns of the engine's tile
// configurations, with nothing else running: no copy engine, no epilogue, operands resident in
// shared memory. Each warpgroup of a block runs the k-loop of one consumer (per k-block of 64: for
// each k16 step, FM wgmmas of m64nN sharing one B, then commit and wait for all but the last group,
// as gemm_sm90.cuh's mainloop does), cycling over as many stages of distinct operands as shared
// memory holds (a mainloop's k-blocks bring new bits to the tensor cores, whose power depends on
// them).
//
//   bench_wgmma [--iters N] [--energy SECONDS] [--json FILE] [--work]
//
// Prints, for each pattern, dense bf16 flop per clock per SM (4096 is the tensor cores' peak) on one
// block (one SM) and on a block per SM (the median block), both from clock64, and the launch's
// wall time. Questions it answers: does one warpgroup issuing ping-pong's 2 x m64n128 reach the
// peak on its own (ping-pong runs one consumer's mainloop at a time), or does it take two
// warpgroups at once, as the cooperative tiles have; do wider wgmmas (n256, n320) or A from
// registers (loaded by ldmatrix, as an RS mainloop would) change the rate.
//
// --energy S: each pattern again on every SM, back to back for about S seconds, with NVML's energy
// counter read around the run (bench_util.cuh's sustained) and the SM clock sampled every 20 ms:
// watts, the median clock, TFLOP/s and picojoules a flop. Beside them, the operand traffic a
// mainloop adds, on its own: 1D bulk copies (the copy engine's path, as the mainloop's tensor
// copies take) from a 16 MiB buffer that stays in L2 and from a 4 GiB one that streams from DRAM
// into shared memory on every SM, in picojoules a byte; and every SM asleep (nanosleep), the
// baseline the "above idle" columns subtract (its watts times the run's time). Where a GPU runs at
// its power limit a kernel's time follows its joules, so these per-unit costs say which of a
// GEMM's resources (its tensor work by issue pattern, its L2 and DRAM bytes, from Nsight Compute's
// counters) its energy, and so its speed there, goes to (bench/results/h100_unit_energy_585679b/).
// --work: instead, the work-between-wgmmas table (wgmma_work_loop): how much of GeluBackward's epilogue
// the cooperative 128 x 256 mainloop's consumers can run between a k-block's commit and wait, and
// at what cost to the wgmmas' rate.
// --json appends a "unit_energy" record a row (../shared/design/RESULTS.md's common keys, then
// part, pattern, ms, w, sm_mhz, calls, seconds, and the row's rate and prices: tflops, pj_flop and
// pj_flop_above_idle; gbs, pj_byte and pj_byte_above_idle; for the mixed row j and j_from_parts).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_util.cuh"
#include "device.hpp"
#include "gemm_sm90.cuh"
#include "results.hpp"

using namespace codagpt;

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
// the accumulators' sum to out[] (so that no wgmma is dead code). SYNC: the block's last warpgroup
// sets the time (every thread of the block comes here).
template <bool SYNC = true, int FM, int NH>
__device__ inline void finish(float (&acc)[FM][NH], long long t0, float* out, long long* cycles) {
    ptx::wgmma_wait<0>();
#pragma unroll
    for (int fm = 0; fm < FM; fm++)
#pragma unroll
        for (int j = 0; j < NH; j++) ptx::fence_operand(acc[fm][j]);
    if (SYNC) __syncthreads();
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

// Shared memory a block of these kernels takes (one block an SM); a pattern's stages fill it.
constexpr int kSmemBytes = 200 * 1024;
// Operand stages a pattern cycles over: as many of `stage_bytes` as fit (beside the 1 KB the base
// may need for the swizzle's alignment), at most 8.
__host__ __device__ constexpr int stages_for(int stage_bytes) {
    return (kSmemBytes - 1024) / stage_bytes < 8 ? (kSmemBytes - 1024) / stage_bytes : 8;
}

#ifdef CODA_SM90_DEVICE
// One warpgroup's k-loop from clock t0 on: `iters` k-blocks, k-block `it` on stage it % STAGES
// (stages STAGE_BYTES apart; this warpgroup's A and the stage's B at descriptors a_lo0, b_lo0 in
// stage 0): for each k16 step FM wgmmas of m64nN sharing B, then commit and wait for all but the
// last group.
template <int N, int FM, int STAGES, int STAGE_BYTES>
__device__ inline void kloop(float (&acc)[FM][N / 2], uint32_t a_lo0, uint32_t b_lo0, int iters) {
    using Mma = ptx::Wgmma<N, 0, 0>;
#pragma unroll
    for (int fm = 0; fm < FM; fm++)
#pragma unroll
        for (int j = 0; j < N / 2; j++) acc[fm][j] = 0.f;
    int stage = 0;
    for (int it = 0; it < iters; it++) {
        const uint32_t a_lo = a_lo0 + stage * (STAGE_BYTES / 16), b_lo = b_lo0 + stage * (STAGE_BYTES / 16);
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
        if (++stage == STAGES) stage = 0;
    }
}
#endif

// N: the wgmma's n; FM: m64 blocks a warpgroup (wgmmas a k16 step sharing B); WGS: warpgroups a
// block, all issuing at once. A stage: each warpgroup's A (FM x 64 rows), then one B (N rows).
template <int N, int FM, int WGS>
__global__ void __launch_bounds__(128 * WGS) wgmma_loop(float* out, long long* cycles, int iters) {
#ifdef CODA_SM90_DEVICE
    extern __shared__ unsigned char smem_raw[];
    constexpr int kABytes = FM * 64 * 128, kBBytes = N * 128, kStageBytes = WGS * kABytes + kBBytes;
    constexpr int kStages = stages_for(kStageBytes);
    static_assert(kStages >= 1 && kStageBytes % 1024 == 0, "a stage fits and keeps the swizzle's alignment");
    unsigned char* smem = fill_operands(smem_raw, kStages * kStageBytes);
    const int wg = threadIdx.x / 128;
    const uint32_t a_lo0 = ptx::desc_lo(ptx::smem_addr(smem + wg * kABytes));
    const uint32_t b_lo0 = ptx::desc_lo(ptx::smem_addr(smem + WGS * kABytes));
    float acc[FM][N / 2];
    __syncthreads();
    const long long t0 = clock64();
    kloop<N, FM, kStages, kStageBytes>(acc, a_lo0, b_lo0, iters);
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

// The operand traffic alone: one block an SM, one thread of it streaming `pieces` 16 KB pieces
// of `src` into a ring of kSlots slots of shared memory by 1D bulk copies
// (cp.async.bulk...mbarrier::complete_tx, the copy engine's path), kSlots in flight. Block b starts
// at byte b * block_stride of the span and walks on by a piece, wrapping at `span` (a multiple of
// the piece): a span that fits in L2 is read from L2 after its first pass; a span of gigabytes,
// with blocks far apart, streams from DRAM.
constexpr int kPiece = 16 * 1024, kSlots = 12;
#ifdef CODA_SM90_DEVICE
// The streaming thread's loop: `slots` slots of the ring at shared address `ring`, their barriers
// at `full` (initialized here).
__device__ inline void stream_pieces(const unsigned char* src, long span, long block_stride, int pieces, uint32_t ring,
                                     uint64_t* full, int slots) {
    for (int s = 0; s < slots; s++) ptx::mbar_init(ptx::smem_addr(&full[s]), 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    long at = blockIdx.x * block_stride % span;
    auto wait = [&](int p) { ptx::mbar_wait(ptx::smem_addr(&full[p % slots]), (uint32_t)(p / slots - 1) & 1); };
    for (int p = 0; p < pieces; p++) {
        const int slot = p % slots;
        if (p >= slots) wait(p);  // the slot's last piece has landed
        const uint32_t bar = ptx::smem_addr(&full[slot]);
        ptx::mbar_expect_tx(bar, kPiece);
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                ring + slot * kPiece),
            "l"(src + at), "r"(kPiece), "r"(bar)
            : "memory");
        at += kPiece;
        if (at == span) at = 0;
    }
    for (int p = max(pieces, slots); p < pieces + slots; p++) wait(p);  // the last pieces land
}
#endif

__global__ void __launch_bounds__(32) bulk_copy_loop(const unsigned char* src, long span, long block_stride,
                                                     int pieces) {
#ifdef CODA_SM90_DEVICE
    extern __shared__ unsigned char smem_raw[];
    __shared__ __align__(8) uint64_t full[kSlots];
    if (threadIdx.x == 0)
        stream_pieces(src, span, block_stride, pieces, (ptx::smem_addr(smem_raw) + 127u) & ~127u, full, kSlots);
#endif
}

// Both at once, as a ping-pong mainloop has them: one warpgroup issuing 2 x m64n128 a k16 step over
// 3 stages of operands while a fifth warp streams 2 pieces (32 KB, the operands of a 128 x 128 x 64
// k-block) a k-block from `src` into a ring of 6 slots. The two run unpaced, each its own count.
constexpr int kMixStages = 3, kMixSlots = 6, kMixStageBytes = 2 * 64 * 128 + 128 * 128;
constexpr int kMixSmem = kMixStages * kMixStageBytes + kMixSlots * kPiece + 1024, kMixThreads = 128 + 32;
__global__ void __launch_bounds__(kMixThreads) wgmma_copy_loop(float* out, long long* cycles, int iters,
                                                       const unsigned char* src, long span, long block_stride) {
#ifdef CODA_SM90_DEVICE
    extern __shared__ unsigned char smem_raw[];
    __shared__ __align__(8) uint64_t full[kMixSlots];
    // The copy ring first (its slots are not operands: no fill needed), the operands from a 1 KB boundary after it.
    const uint32_t ring = (ptx::smem_addr(smem_raw) + 1023u) & ~1023u;
    unsigned char* operands = smem_raw + (ring - ptx::smem_addr(smem_raw)) + kMixSlots * kPiece;
    unsigned char* smem = fill_operands(operands, kMixStages * kMixStageBytes);  // already aligned: no shift
    if (threadIdx.x >= 128) {
        if (threadIdx.x == 128) stream_pieces(src, span, block_stride, 2 * iters, ring, full, kMixSlots);
        return;
    }
    const uint32_t a_lo0 = ptx::desc_lo(ptx::smem_addr(smem)), b_lo0 = ptx::desc_lo(ptx::smem_addr(smem + 2 * 64 * 128));
    float acc[2][64];
    const long long t0 = clock64();
    kloop<128, 2, kMixStages, kMixStageBytes>(acc, a_lo0, b_lo0, iters);
    finish</*SYNC=*/false>(acc, t0, out, cycles);  // the copy warp has left
#endif
}

// GeluBackward's epilogue run inside the cooperative 128 x 256 mainloop (a question for a design
// not built: each consumer running the previous tile's epilogue on accumulators it left in shared
// memory as bf16, between issuing a k-block's wgmmas and waiting on them). Two warpgroups issue 1 x
// m64n256 a k16 step over 2 resident stages, as wgmma_loop<256, 1, 2>; after each k-block's commit
// every thread runs W4 segments every 4 k-blocks (spread evenly) of 8 elements: 16 bytes of bf16
// accumulators from a 32 KB region of shared memory, 16 bytes of f from global memory (loaded a
// k-block ahead into registers), gelu and gelu' of f (the engine's gelu_values), df = acc gelu'(f)
// and gelu(f) stored, 16 bytes each. f, df and g stream over 256 MiB each (DRAM, not L2).
// MMA = false: the segments alone, the same loop without the wgmmas (the work's own time).
// COPY: a ninth warp streams a 128 x 256 tile's operands a k-block (48 KB) from a 16 MiB span of L2
// into a ring of shared memory by bulk copies, unpaced, as the mainloop's producer would.
// A 1.5B GeluBackward tile (K = 1600: 25 k-blocks, 16 segments a thread) is W4 ~ 2.6, 350M's (K =
// 1024) W4 = 4.
constexpr int kWorkStages = 2, kWorkStageBytes = 2 * 64 * 128 + 256 * 128, kWorkAccBytes = 32 * 1024;
constexpr int kWorkSlots = 6, kWorkPiecesPerKBlock = kWorkStageBytes / kPiece;
constexpr int kWorkSmem = 1024 + kWorkSlots * kPiece + kWorkStages * kWorkStageBytes + kWorkAccBytes;
constexpr long kWorkSpanBytes = 256L << 20;
constexpr int kWorkThreads = 256 + 32;                              // two consumer warpgroups and the copy warp
constexpr int kSegmentBytes = 3 * 16;                               // a segment's f in, df and gelu(f) out
constexpr double kWorkFlopPerKBlock = 2.0 * 2 * 64 * 256 * kBK;    // both warpgroups' m64n256 wgmmas
template <int W4, bool MMA, bool COPY>
__global__ void __launch_bounds__(kWorkThreads, 1) wgmma_work_loop(float* out, long long* cycles, int iters, const uint4* f,
                                                               uint4* df, uint4* g, const unsigned char* src) {
#ifdef CODA_SM90_DEVICE
    extern __shared__ unsigned char smem_raw[];
    __shared__ __align__(8) uint64_t full[kWorkSlots];
    // The copy ring first (not operands: no fill), the operands and the accumulators' region after it.
    const uint32_t ring = (ptx::smem_addr(smem_raw) + 1023u) & ~1023u;
    unsigned char* smem = fill_operands(smem_raw + (ring - ptx::smem_addr(smem_raw)) + kWorkSlots * kPiece,
                                        kWorkStages * kWorkStageBytes + kWorkAccBytes);
    if (threadIdx.x >= 256) {
        if (COPY && threadIdx.x == 256)
            stream_pieces(src, 16L << 20, 64L << 10, kWorkPiecesPerKBlock * iters, ring, full, kWorkSlots);
        return;
    }
    const int wg = threadIdx.x / 128;
    const uint32_t a_lo0 = ptx::desc_lo(ptx::smem_addr(smem + wg * 64 * 128));
    const uint32_t b_lo0 = ptx::desc_lo(ptx::smem_addr(smem + 2 * 64 * 128));
    const uint32_t acc_tile = ptx::smem_addr(smem + kWorkStages * kWorkStageBytes);
    constexpr int kSegs = (W4 + 3) / 4;  // the most a k-block runs
    constexpr long kSpanPieces = kWorkSpanBytes / 16;
    const long threads = (long)gridDim.x * 256, me = (long)blockIdx.x * 256 + threadIdx.x;
    auto piece = [&](int it, int s) { return ((long)it * kSegs + s) * threads % kSpanPieces + me; };
    auto segs_of = [](int it) { return ((it % 4) + 1) * W4 / 4 - (it % 4) * W4 / 4; };
    uint4 fcur[kSegs > 0 ? kSegs : 1];
#pragma unroll
    for (int s = 0; s < kSegs; s++)
        if (s < segs_of(0)) fcur[s] = __ldcs(f + piece(0, s));
    float acc[1][128];
#pragma unroll
    for (int j = 0; j < 128; j++) acc[0][j] = 0.f;
    float keep = 0.f;
    asm volatile("bar.sync 1, 256;" ::: "memory");  // the consumers (the copy warp has gone its way)
    const long long t0 = clock64();
    int stage = 0;
    for (int it = 0; it < iters; it++) {
        if constexpr (MMA) {
            const uint32_t a_lo = a_lo0 + stage * (kWorkStageBytes / 16), b_lo = b_lo0 + stage * (kWorkStageBytes / 16);
            ptx::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kBK / 16; kk++)
                ptx::Wgmma<256, 0, 0>::run(acc[0], ptx::desc(a_lo + kk * 32 / 16), ptx::desc(b_lo + kk * 32 / 16), 1);
            ptx::wgmma_commit();
        }
        const int segs = segs_of(it), segs_next = it + 1 < iters ? segs_of(it + 1) : 0;
#pragma unroll
        for (int s = 0; s < kSegs; s++) {
            if (s >= segs) continue;
            const float4 a = codagpt::ptx::ld_shared_v4(acc_tile + ((threadIdx.x + 256 * (it * kSegs + s)) * 16) % kWorkAccBytes);
            const uint32_t aw[4] = {__float_as_uint(a.x), __float_as_uint(a.y), __float_as_uint(a.z), __float_as_uint(a.w)};
            const uint32_t fw[4] = {fcur[s].x, fcur[s].y, fcur[s].z, fcur[s].w};
            uint32_t dw[4], gw[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const __nv_bfloat162 av = *reinterpret_cast<const __nv_bfloat162*>(&aw[k]);
                const __nv_bfloat162 fv = *reinterpret_cast<const __nv_bfloat162*>(&fw[k]);
                const coda::GeluValues lo = coda::gelu_values(__low2float(fv)), hi = coda::gelu_values(__high2float(fv));
                const __nv_bfloat162 d = __floats2bfloat162_rn(__low2float(av) * lo.grad, __high2float(av) * hi.grad);
                const __nv_bfloat162 gg = __floats2bfloat162_rn(lo.g, hi.g);
                dw[k] = *reinterpret_cast<const uint32_t*>(&d);
                gw[k] = *reinterpret_cast<const uint32_t*>(&gg);
            }
            const long at = piece(it, s);
            __stcs(df + at, make_uint4(dw[0], dw[1], dw[2], dw[3]));
            __stcs(g + at, make_uint4(gw[0], gw[1], gw[2], gw[3]));
        }
#pragma unroll
        for (int s = 0; s < kSegs; s++)
            if (s < segs_next) fcur[s] = __ldcs(f + piece(it + 1, s));  // for the next k-block
        if constexpr (MMA) ptx::wgmma_wait<1>();
        else keep += __uint_as_float(fcur[0].x);
        if (++stage == kWorkStages) stage = 0;
    }
    finish</*SYNC=*/false>(acc, t0, out, cycles);
    if (keep == -1.f) out[0] = keep;  // (never: keeps the work-only loop's loads)
#endif
}

// Every SM busy doing nothing: a block an SM asleep for `cycles` clocks (of its SM).
__global__ void __launch_bounds__(32) idle_loop(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) __nanosleep(10000);
}

struct Result {
    double one_sm, all_sms;  // flop per clock per SM
    double all_ms, all_mhz;
};

using LoopKernel = void (*)(float*, long long*, int);

// Device buffers of the loop kernels' outputs, for a block per SM.
struct LoopBuffers {
    float* out = nullptr;
    long long* cycles = nullptr;
    LoopBuffers(int sms, int threads) {
        CHECK_CUDA(cudaMalloc(&out, sizeof(float) * sms * threads));
        CHECK_CUDA(cudaMalloc(&cycles, sizeof(long long) * sms));
    }
    ~LoopBuffers() {
        cudaFree(out);
        cudaFree(cycles);
    }
};

// The median block's cycles of the last launch that wrote buf.cycles (a block per SM).
double median_block_cycles(const LoopBuffers& buf, int sms) {
    std::vector<long long> c(sms);
    CHECK_CUDA(cudaMemcpy(c.data(), buf.cycles, sizeof(long long) * sms, cudaMemcpyDeviceToHost));
    std::sort(c.begin(), c.end());
    return (double)c[sms / 2];
}

Result measure(LoopKernel kernel, int threads, double flop_per_iter, int iters, int sms) {
    // kSmemBytes of shared memory a block (the patterns' stages fill it): one block an SM.
    CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    LoopBuffers buf(sms, threads);
    Result r{};
    // One block: one SM, its own clock (no other SM drawing power).
    kernel<<<1, threads, kSmemBytes>>>(buf.out, buf.cycles, iters / 10);  // warm-up
    kernel<<<1, threads, kSmemBytes>>>(buf.out, buf.cycles, iters);
    CHECK_CUDA(cudaDeviceSynchronize());
    long long c1;
    CHECK_CUDA(cudaMemcpy(&c1, buf.cycles, sizeof c1, cudaMemcpyDeviceToHost));
    r.one_sm = flop_per_iter * iters / (double)c1;
    // A block per SM: the median block's cycles, and the wall time by events.
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    kernel<<<sms, threads, kSmemBytes>>>(buf.out, buf.cycles, iters);
    CHECK_CUDA(cudaEventRecord(e0));
    kernel<<<sms, threads, kSmemBytes>>>(buf.out, buf.cycles, iters);
    CHECK_CUDA(cudaEventRecord(e1));
    CHECK_CUDA(cudaEventSynchronize(e1));
    CHECK_CUDA(cudaGetLastError());
    float ms = 0.f;
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    const double med = median_block_cycles(buf, sms);
    r.all_sms = flop_per_iter * iters / med;
    r.all_ms = ms;
    r.all_mhz = med / (ms * 1e3);  // block cycles over the launch's wall time: a lower bound of the clock
    CHECK_CUDA(cudaEventDestroy(e0));
    CHECK_CUDA(cudaEventDestroy(e1));
    return r;
}

// A pattern's row: its kernel, threads a block, flop a k-block and whether it has an energy row
// (the RS patterns, one stage of B and A loaded once or re-read by ldmatrix, are rate probes only).
struct Pattern {
    const char* name;
    const char* engine_use;
    LoopKernel kernel;
    int threads;
    double flop_per_iter;
    bool energy;
};

template <int N, int FM, int WGS>
Pattern ss(const char* name, const char* engine_use) {
    return {name, engine_use, wgmma_loop<N, FM, WGS>, 128 * WGS, 2.0 * WGS * FM * 64.0 * N * kBK, true};
}
template <int FM, bool RELOAD>
Pattern rs(const char* name, const char* engine_use) {
    return {name, engine_use, wgmma_rs_loop<FM, RELOAD>, 128, 2.0 * FM * 64.0 * 128 * kBK, false};
}

// One workload's energy row: the sustained run and the SM clock samples taken during it.
struct EnergyRow {
    bench::Sustained run;
    double mhz = NAN;
};

// launch() back to back for about `seconds` (after one launch to time it), the clock sampled.
template <class F>
EnergyRow sustained_row(F&& launch, double seconds, GpuEnergy& meter) {
    const double est_ms = median_ms(launch, /*runs=*/1, /*warmup=*/1);
    meter.new_sm_clock_samples();  // drop the samples taken before the run
    EnergyRow r;
    r.run = bench::sustained([&](int) { launch(); }, est_ms, seconds, meter);
    const std::vector<double> mhz = meter.new_sm_clock_samples();
    r.mhz = mhz.empty() ? NAN : detail::median_of(mhz);
    if (std::isnan(r.run.j)) throw Error("reading the GPU's energy counter failed");
    return r;
}

struct EnergyOptions {
    double seconds = 0;
    std::string json, command, gpu;
};

void record(const EnergyOptions& o, const std::string& part, const std::string& pattern, const EnergyRow& e,
            nlohmann::json extra) {
    if (o.json.empty()) return;
    nlohmann::json r = {{"kind", "unit_energy"}, {"gpu", o.gpu},     {"part", part},          {"pattern", pattern},
                        {"ms", e.run.ms},        {"w", e.run.w},     {"sm_mhz", e.mhz},       {"calls", e.run.calls},
                        {"seconds", o.seconds}};
    r.update(extra);
    stamp_record(r, o.command);
    append_record(o.json, r);
}

// The --energy table: every SM asleep first (the baseline), then each wgmma pattern, then the
// bulk copies from L2 and from DRAM, then ping-pong's wgmmas and L2 copies together.
void energy_table(const std::vector<Pattern>& patterns, int iters, int sms, const EnergyOptions& o) {
    const std::unique_ptr<GpuEnergy> meter = GpuEnergy::open();
    if (!meter) throw Error("--energy needs NVML's energy counter (libnvidia-ml.so.1)");
    std::printf("\nback to back for ~%.0f s each, power limit %.0f W; above idle: less the idle row's watts times "
                "the run's time\n",
                o.seconds, meter->power_limit_w());
    // Idle: 10 million cycles a launch (5-10 ms at the clocks these GPUs run).
    const EnergyRow idle = sustained_row([&] { idle_loop<<<sms, 32>>>(10000000LL); }, o.seconds, *meter);
    CHECK_CUDA(cudaGetLastError());
    std::printf("%-26s %8s %6s %6s %9s %9s %11s\n", "workload", "ms", "W", "MHz", "rate", "pJ/unit",
                "above idle");
    std::printf("%-26s %8.3f %6.0f %6.0f\n", "idle (nanosleep)", idle.run.ms, idle.run.w, idle.mhz);
    record(o, "idle", "nanosleep", idle, nlohmann::json::object());
    const double idle_w = idle.run.w;
    auto above_idle = [&](const EnergyRow& e, double units) { return (e.run.j - idle_w * e.run.ms * 1e-3) / units * 1e12; };

    // The ping-pong pattern's flop a k-block and price, for the mixed row (its wgmmas).
    double pingpong_flop_per_iter = NAN, pingpong_pj_above = NAN;
    for (const Pattern& p : patterns) {
        if (!p.energy) continue;
        CHECK_CUDA(cudaFuncSetAttribute(p.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
        LoopBuffers buf(sms, p.threads);
        const EnergyRow e =
            sustained_row([&] { p.kernel<<<sms, p.threads, kSmemBytes>>>(buf.out, buf.cycles, iters); }, o.seconds, *meter);
        CHECK_CUDA(cudaGetLastError());
        const double flop = p.flop_per_iter * iters * sms, tflops = flop / (e.run.ms * 1e-3) / 1e12;
        const double pj = e.run.j / flop * 1e12, pj_above = above_idle(e, flop);
        if (p.kernel == wgmma_loop<128, 2, 1>) pingpong_flop_per_iter = p.flop_per_iter, pingpong_pj_above = pj_above;
        std::printf("%-26s %8.3f %6.0f %6.0f %6.0f TF %9.4f %11.4f  pJ/flop\n", p.name, e.run.ms, e.run.w, e.mhz,
                    tflops, pj, pj_above);
        record(o, "wgmma", p.name, e, {{"tflops", tflops}, {"pj_flop", pj}, {"pj_flop_above_idle", pj_above}});
    }

    CHECK_CUDA(cudaFuncSetAttribute(bulk_copy_loop, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    kSlots * kPiece + 128));
    struct Copy {
        const char* name;
        long span, block_stride;
    };
    // L2: all blocks in one 16 MiB span (a third of the H100's 50 MiB L2), each starting at its own
    // 64 KB; DRAM: a 4 GiB span, the blocks spread evenly over it.
    const long kL2Span = 16L << 20, kDramSpan = 4L << 30;
    const Copy l2{"bulk copy from L2", kL2Span, 64L << 10}, dram{"bulk copy from DRAM", kDramSpan,
                                                                  kDramSpan / sms / kPiece * kPiece};
    unsigned char* src = nullptr;
    CHECK_CUDA(cudaMalloc(&src, kDramSpan));
    CHECK_CUDA(cudaMemset(src, 0x5a, kDramSpan));
    const int pieces = 4096;  // 64 MiB a block a launch
    double l2_pj_above = NAN;
    for (const Copy& c : {l2, dram}) {
        const EnergyRow e = sustained_row(
            [&] { bulk_copy_loop<<<sms, 32, kSlots * kPiece + 128>>>(src, c.span, c.block_stride, pieces); }, o.seconds,
            *meter);
        CHECK_CUDA(cudaGetLastError());
        const double bytes = (double)kPiece * pieces * sms, gbs = bytes / (e.run.ms * 1e-3) / 1e9;
        const double pj = e.run.j / bytes * 1e12, pj_above = above_idle(e, bytes);
        if (c.span == kL2Span) l2_pj_above = pj_above;
        std::printf("%-26s %8.3f %6.0f %6.0f %6.0f GB/s %6.2f %11.2f  pJ/byte\n", c.name, e.run.ms, e.run.w, e.mhz, gbs,
                    pj, pj_above);
        record(o, "copy", c.name, e, {{"gbs", gbs}, {"pj_byte", pj}, {"pj_byte_above_idle", pj_above}});
    }

    // Ping-pong's wgmmas with a mainloop's worth of L2 copies beside them, against the sum of the
    // parts' costs above idle (the idle watts over this run's time, plus each part's units).
    CHECK_CUDA(cudaFuncSetAttribute(wgmma_copy_loop, cudaFuncAttributeMaxDynamicSharedMemorySize, kMixSmem));
    {
        LoopBuffers buf(sms, kMixThreads);
        const EnergyRow e = sustained_row(
            [&] {
                wgmma_copy_loop<<<sms, kMixThreads, kMixSmem>>>(buf.out, buf.cycles, iters, src, l2.span, l2.block_stride);
            },
            o.seconds, *meter);
        CHECK_CUDA(cudaGetLastError());
        const double flop = pingpong_flop_per_iter * iters * sms, bytes = 2.0 * kPiece * iters * sms;
        const double tflops = flop / (e.run.ms * 1e-3) / 1e12, gbs = bytes / (e.run.ms * 1e-3) / 1e9;
        const double predicted_j = (idle_w * e.run.ms * 1e-3 + (flop * pingpong_pj_above + bytes * l2_pj_above) * 1e-12);
        std::printf("%-26s %8.3f %6.0f %6.0f %6.0f TF %6.0f GB/s: %.4f J a launch against %.4f from the parts\n",
                    "2 x m64n128 + L2 copies", e.run.ms, e.run.w, e.mhz, tflops, gbs, e.run.j, predicted_j);
        record(o, "wgmma+copy", "2 x m64n128, 1 WG + bulk copy from L2", e,
               {{"tflops", tflops}, {"gbs", gbs}, {"j", e.run.j}, {"j_from_parts", predicted_j}});
    }
    CHECK_CUDA(cudaFree(src));
}

void print_row(const char* name, const char* engine_use, const Result& r) {
    std::printf("%-26s %-34s %8.0f %8.0f %6.0f%% %8.2f %6.0f\n", name, engine_use, r.one_sm, r.all_sms,
                100.0 * r.all_sms / 4096.0, r.all_ms, r.all_mhz);
}

// A row of the work-between-wgmmas table: its kernel instance and the parameters the table reads.
struct WorkVariant {
    using Kernel = void (*)(float*, long long*, int, const uint4*, uint4*, uint4*, const unsigned char*);
    const char* name;
    Kernel kernel;
    int w4;
    bool mma, copy;
};
template <int W4, bool MMA, bool COPY>
WorkVariant work_variant(const char* name) {
    return {name, wgmma_work_loop<W4, MMA, COPY>, W4, MMA, COPY};
}

// The work-between-wgmmas table: each variant on a block per SM, the median block's flop a clock (the
// wgmmas'), the launch's wall time, the segments' DRAM bytes a second, and (x wgmmas) a row's time
// against its group's first row (no segments); the work-only rows give the segments' own time.
void work_table(int iters, int sms) {
    const WorkVariant variants[] = {
        work_variant<0, true, false>("m64n256 x 2 WGs"),
        work_variant<2, true, false>("  + 0.5 seg/k-block"),
        work_variant<3, true, false>("  + 0.75 seg/k-block"),
        work_variant<4, true, false>("  + 1 seg/k-block"),
        work_variant<8, true, false>("  + 2 seg/k-block"),
        work_variant<0, true, true>("m64n256 + L2 copies"),
        work_variant<2, true, true>("  + 0.5 seg/k-block"),
        work_variant<3, true, true>("  + 0.75 seg/k-block"),
        work_variant<4, true, true>("  + 1 seg/k-block"),
        work_variant<2, false, false>("work only, 0.5"),
        work_variant<3, false, false>("work only, 0.75"),
        work_variant<4, false, false>("work only, 1"),
    };
    const size_t bytes = kWorkSpanBytes + (2L << 20);  // + the last pieces' spill past the span
    unsigned char* buf[4];
    for (auto& b : buf) {
        CHECK_CUDA(cudaMalloc(&b, bytes));
        CHECK_CUDA(cudaMemset(b, 0x3c, bytes));
    }
    LoopBuffers lb(sms, kWorkThreads);
    std::printf("\nGeluBackward's epilogue segments (8 elements: 16 B of bf16 acc from shared memory, 16 B of f "
                "in, 2 x 16 B out) between a cooperative 128 x 256 k-block's commit and wait; %d k-blocks\n",
                iters);
    std::printf("%-22s %9s %8s %9s %10s %9s\n", "variant", "flop/clk", "ms", "GB/s", "segs/us/SM", "x wgmmas");
    double base_ms[2] = {NAN, NAN};
    for (const WorkVariant& v : variants) {
        CHECK_CUDA(cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kWorkSmem));
        auto launch = [&] {
            v.kernel<<<sms, kWorkThreads, kWorkSmem>>>(lb.out, lb.cycles, iters, reinterpret_cast<const uint4*>(buf[0]),
                                                   reinterpret_cast<uint4*>(buf[1]), reinterpret_cast<uint4*>(buf[2]),
                                                   buf[3]);
        };
        const double ms = median_ms(launch, /*runs=*/5, /*warmup=*/2);
        CHECK_CUDA(cudaGetLastError());
        const double flop_clk = v.mma ? kWorkFlopPerKBlock * iters / median_block_cycles(lb, sms) : 0.0;
        const double segs = (double)iters * v.w4 / 4.0 * 256;  // a block's
        const double gbs = segs * sms * kSegmentBytes / (ms * 1e-3) / 1e9;
        if (v.mma && v.w4 == 0) base_ms[v.copy] = ms;
        std::printf("%-22s %9.0f %8.3f %9.0f %10.2f", v.name, flop_clk, ms, gbs, segs / (ms * 1e3));
        if (v.mma) std::printf(" %9.3f", ms / base_ms[v.copy]);
        std::printf("\n");
    }
    for (auto& b : buf) CHECK_CUDA(cudaFree(b));
}

int run(int argc, char** argv) {
    int iters = 20000;
    bool work = false;
    EnergyOptions energy;
    for (int i = 1; i < argc; i++) {
        const std::string a = argv[i];
        auto next = [&]() -> std::string {
            if (i + 1 >= argc) throw Error(a + " needs a value");
            return argv[++i];
        };
        if (a == "--iters") iters = (int)bench::number_option(a, next(), 10, /*integer=*/true);
        else if (a == "--energy") energy.seconds = bench::number_option(a, next(), 0);
        else if (a == "--json") energy.json = next();
        else if (a == "--work") work = true;
        else throw Error("unknown argument " + a + " (usage: bench_wgmma [--iters N] [--energy SECONDS] [--json FILE] [--work])");
    }
    if (!energy.json.empty() && energy.seconds <= 0) throw Error("--json records the --energy table: give --energy too");
    if (work && energy.seconds > 0) throw Error("--work prints its own table only: leave out --energy");
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        std::fprintf(stderr, "bench_wgmma: needs a CUDA GPU\n");
        return 77;
    }
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    if (prop.major != 9) throw Error(std::string("needs a Hopper GPU (sm_90), found ") + prop.name);
    energy.gpu = prop.name;
    energy.command = join_command(argc, argv);
    if (!energy.json.empty()) read_records(energy.json);  // a file that is not a JSON array: refused up front
    iters &= ~1;  // the RS loops take k-blocks in pairs
    const int sms = prop.multiProcessorCount;
    const std::vector<Pattern> patterns = {
        ss<128, 2, 1>("2 x m64n128, 1 WG", "ping-pong 128x128 (one consumer)"),
        ss<128, 2, 2>("2 x m64n128, 2 WGs", "cooperative 256x128"),
        ss<128, 1, 1>("1 x m64n128, 1 WG", "ping-pong half tile rows"),
        ss<128, 1, 2>("1 x m64n128, 2 WGs", "cooperative 128x128"),
        ss<256, 1, 1>("1 x m64n256, 1 WG", "(ping-pong 64x256, dropped)"),
        ss<256, 1, 2>("1 x m64n256, 2 WGs", "cooperative 128x256"),
        ss<320, 1, 2>("1 x m64n320, 2 WGs", "cooperative 128x320 (n256 + n64)"),
        ss<64, 2, 1>("2 x m64n64, 1 WG", "(narrow half tiles, one consumer)"),
        rs<2, true>("2 x m64n128 RS, 1 WG", "A by ldmatrix each k-block (not used)"),
        rs<2, false>("2 x m64n128 RS, 1 WG", "A loaded once (not used)"),
    };
    std::printf("%s, %d SMs, %d k-blocks of 64 a warpgroup\n", prop.name, sms, iters);
    if (work) {  // only the work-between-wgmmas table
        work_table(iters, sms);
        return 0;
    }
    std::printf("%-26s %-34s %8s %8s %7s %8s %6s\n", "pattern (a warpgroup)", "where the engine issues it",
                "1 SM", "all SMs", "/peak", "ms", "MHz>=");
    for (const Pattern& p : patterns)
        print_row(p.name, p.engine_use, measure(p.kernel, p.threads, p.flop_per_iter, iters, sms));
    if (energy.seconds > 0) energy_table(patterns, iters, sms, energy);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_wgmma: %s\n", e.what());
        return 1;
    }
}
