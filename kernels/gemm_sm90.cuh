// The Hopper (sm_90a) mainloop of the CODA GEMM engine: out[M, N] = program(A[M, K] B[K, N]).
//
// One persistent CTA per SM, 3 warpgroups:
//   warpgroup 0, the producer: one thread issues TMA loads (cp.async.bulk.tensor, 128-byte swizzle,
//     out-of-bounds elements zero-filled by the copy engine) of A and B k-blocks into a ring of
//     shared-memory stages; each stage has a "full" mbarrier (the copy engine's byte count) and an
//     "empty" one (one arrival per consumer warp once its wgmmas that read the stage completed).
//     It gives its registers to the consumers (setmaxnreg.dec) and runs ahead into the next tile
//     while the consumers run this tile's epilogue.
//   warpgroups 1 and 2, the consumers: each owns half of the tile's rows (BM/2) and all BN columns,
//     issues wgmma m64nBNk16 (bf16 in, fp32 accumulators in registers) straight from the stages,
//     keeps one k-block of wgmmas in flight while it waits for the next, and runs the epilogue
//     program on its accumulators.
// Clusters (pp128x128c2, 128x320c2): two CTAs on tiles of adjacent M-tile rows in one column; each
// producer loads its CTA's A and half of the shared B k-block, multicast into both rings (one
// complete_tx a CTA), and a stage's "empty" barrier waits for the reading warps of both CTAs
// (remote arrivals).
// Work units (tiles, or with split-K a tile's K splits) are dealt to CTAs round robin in a grouped
// tile order (up to GROUP_M M-tiles side by side, M fastest), so the CTAs in flight share A rows
// and B columns in L2. Where a group's operands fit in L2 (half_tiles_pay), edge tiles at most half
// inside the matrix (C = 1600 is 12.5 tiles of 128) run half the wgmmas (n BN/2, or only a
// consumer's m64 blocks with rows in the matrix), and the group size is chosen so that they even
// out the CTAs' work (group_m_for). A CTA's units, and so its ring slots and trip counts, follow
// from blockIdx.x:
// values the compiler sees as uniform (a tile id read from memory would make the descriptors and
// loop counts per-thread values; measured: every GEMM 15-25% slower).
// Split-K (Params): where the output has too few tiles to fill the SMs evenly (the weight
// gradients' small outputs, K = B*T), each tile's K is split into work units handed out the same
// way; all but the last split store their accumulators to a global partial buffer, and the last
// one waits for them, adds them in split order and runs the epilogue program once on the sum, so
// partials, row and column statistics and accumulation into an output all work unchanged and the
// result is deterministic. No deadlock: a last split waits only for lower-numbered units, and each
// CTA works through its units in order, so the lowest unfinished unit always progresses (once its
// CTA is resident: a CTA not yet started, its SM busy with another kernel, delays but cannot block).
//
// Operand layouts (gemm_types.cuh), as wgmma sees them:
//   A row-major [M, K]          = K-major: one TMA box {64 k, BM rows}; no transpose bit.
//   A stored transposed [K, M]  = M-major: BM/64 boxes {64 m, 64 k}; transpose bit set.
//   B row-major [K, N]          = N-major: BN/64 boxes {64 n, 64 k}; transpose bit set.
//   B stored transposed [N, K]  = K-major: one box {64 k, BN rows}; no transpose bit.
// A box row is 64 bf16 = 128 bytes = one 128-byte swizzle row, so every stage is made of 8-row,
// 1024-byte swizzle atoms: the wgmma descriptors step 1024 bytes between 8-row groups (SBO) and,
// for MN-major operands, 64 rows * 128 bytes between 64-element atoms along M or N (LBO).
#pragma once
#include <cuda.h>  // CUtensorMap and its enums (types only: the driver entry point is fetched at run time)
#include <cudaTypedefs.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common.cuh"
#include "gemm_emulator.hpp"
#include "gemm_epilogue.cuh"
#include "gemm_types.cuh"
#include "ptx_sm80.cuh"

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CODA_SM90_DEVICE 1
#endif

namespace codagpt::coda::sm90 {

// ---------------------------------------------------------------- tile configurations
// Tile shapes this mainloop is built for. 128x256 and 256x128 do the same work per k-block (128
// fp32 accumulators per consumer thread); which one wastes less on edge tiles and wave tails
// depends on M and N. 128x128 halves the tile for small outputs; 128x320 (160 accumulators, the
// most a consumer's 232 registers hold beside the epilogue's) is the widest.
// Cooperative: the two consumers split one tile's rows and run its epilogue together, the tensor
// cores idle meanwhile. Ping-pong: each consumer owns whole tiles (every other tile of the CTA);
// the producer fills the ring in tile order, so one consumer's mainloop runs while the other
// runs its epilogue, and the epilogue's stores drain behind the other's wgmmas.
// Ping-pong in 2-CTA clusters (pp128x128c2): the two CTAs of a cluster run the tiles of two
// adjacent M-tile rows in the same column side by side, in step, and each loads its own A and half
// of the shared B k-block into both CTAs' rings (TMA multicast): a quarter fewer bytes requested
// a tile than pp128x128, though Nsight Compute counts no fewer L2 bytes (and 12-14% more for
// 128x320c2 than for 128x320: bench/NOTES_gemm_sm90.md, eighteenth and nineteenth sessions).
// Cooperative 128 x 320 (each consumer m64 x n320: a wgmma n256 and an n64, 160 accumulators a
// thread): the tile of cuBLASLt's kernels for the 1.5B shapes, whose widths 1600, 4800 and 6400
// it divides, with about half of ping-pong 128 x 128's L2 bytes a flop; in 2-CTA clusters
// (128x320c2) the two CTAs of adjacent M-tile rows share B, each loading half of it into both
// rings. Edge tiles always run at full cost here (no n160 wgmma). The plan picks 128x320 only
// where K is long (CostModel).
enum class Tile { k128x256, k256x128, k128x128, kPingPong128x128, kPingPong128x128C2, k128x320, k128x320C2 };
constexpr Tile kTiles[] = {Tile::k128x256,           Tile::k256x128, Tile::k128x128,  Tile::kPingPong128x128,
                           Tile::kPingPong128x128C2, Tile::k128x320, Tile::k128x320C2};
constexpr int kNumTiles = 7;
inline const char* tile_name(Tile t) {
    switch (t) {
        case Tile::k128x256: return "128x256";
        case Tile::k256x128: return "256x128";
        case Tile::k128x128: return "128x128";
        case Tile::kPingPong128x128: return "pp128x128";
        case Tile::kPingPong128x128C2: return "pp128x128c2";
        case Tile::k128x320: return "128x320";
        default: return "128x320c2";
    }
}

constexpr int kBK = 64;  // the k-block: K elements a ring stage holds, for every configuration
// How many k-blocks before a tile's mainloop ends its epilogue's tile inputs are prefetched into
// L2 (a few microseconds: about an HBM round trip more), unless CODAGPT_GEMM_PREFETCH_KBLOCKS says.
constexpr int kPrefetchKBlocks = 8;

template <int BM_, int BN_, int STAGES_, bool PINGPONG_, int CLUSTER_ = 1>
struct Config {
    static constexpr int BM = BM_, BN = BN_, BK = kBK, STAGES = STAGES_;
    static constexpr bool PINGPONG = PINGPONG_;
    // CTAs a cluster (along M): each loads BN / CLUSTER rows of the shared B k-block into all of
    // them (N-major B: every CLUSTER-th 64-column box from its rank on).
    static constexpr int CLUSTER = CLUSTER_, B_ROWS_LOADED = BN / CLUSTER;
    // K-major B's TMA box: at most 256 rows (the copy engine's limit), so B_ROWS_LOADED in 1 or 2 boxes.
    static constexpr int B_BOX_ROWS = B_ROWS_LOADED <= 256 ? B_ROWS_LOADED : B_ROWS_LOADED / 2;
    // Edge tiles at most half inside the matrix run wgmmas of n BN/2 (half_tiles_pay), where a
    // wrapper of that width exists (not n160).
    static constexpr bool HALF_TILES = BN / 2 == 64 || BN / 2 == 128;
    static constexpr int WG_ROWS = PINGPONG ? BM : BM / 2;  // rows of one consumer warpgroup
    static constexpr int FM = WG_ROWS / 64;  // m64 wgmmas per k16 step per consumer
    static constexpr int FN = BN / 8;        // n8 accumulator fragments per wgmma row block
    static constexpr int WARPS_M = PINGPONG ? 4 : 8;  // warps running one tile's epilogue, stacked along M
    static constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2;
    static constexpr int GROUP_M = 16;  // M-tiles a group of the tile order, at most (group_m_for)
    static_assert(FM >= 1 && (FM * BN <= 256 || (FM == 1 && BN == 320)) && (BN == 128 || BN == 256 || BN == 320),
                  "wgmma wrappers exist for n128, n256 and n320 (n256 + n64); 160 accumulators per thread at most");
    static_assert(B_ROWS_LOADED % 16 == 0 && B_BOX_ROWS * (B_ROWS_LOADED / B_BOX_ROWS) == B_ROWS_LOADED,
                  "K-major B in whole boxes of whole swizzle atoms");
    static_assert(CLUSTER == 1 || CLUSTER == 2, "clusters of 2 CTAs");
};
using Cfg128x256 = Config<128, 256, 4, false>;
using Cfg256x128 = Config<256, 128, 4, false>;
using Cfg128x128 = Config<128, 128, 6, false>;
using CfgPingPong128x128 = Config<128, 128, 6, true>;
using CfgPingPong128x128C2 = Config<128, 128, 6, true, 2>;
using Cfg128x320 = Config<128, 320, 3, false>;
using Cfg128x320C2 = Config<128, 320, 3, false, 2>;

constexpr int kThreads = 384;        // producer warpgroup + 2 consumer warpgroups
constexpr int kProducerRegs = 40, kConsumerRegs = 232;  // 128*40 + 256*232 <= 64K registers
// Named barriers of the threads running one tile's epilogue (0 is __syncthreads): 1 for both
// consumers (cooperative), 1 + consumer for one (ping-pong).
constexpr int kEpilogueBarrier = 1;
// Ping-pong order: consumer c may start a tile's mainloop once barrier kOrderBarrier + c is
// complete, i.e. once the other consumer has issued its previous tile's wgmmas. Then every ring
// slot before this tile's first is filled, so the stage barriers are at most one phase behind
// and their parity waits cannot mistake an older phase for the awaited one.
constexpr int kOrderBarrier = 3;

template <class Cfg, class P>
using EpilogueOf = TileEpilogue<P, Cfg::FM, Cfg::FN, 64, Cfg::WARPS_M, 1>;

// The ring gets the configuration's stages, fewer where the epilogue's shared memory (its staging
// buffer and parked column states, gemm_epilogue.cuh) leaves no room for them.
template <class Cfg, class P>
struct SmemLayout {
    static constexpr int kEpilogueBytes = (int)EpilogueOf<Cfg, P>::kSmemBytes;  // per concurrent tile
    static constexpr int kLimit = 227 * 1024;

    struct Offsets {
        int b, bars, epilogue, bytes, launch_bytes;
    };
    static constexpr Offsets offsets(int stages) {
        Offsets o{};
        o.b = stages * Cfg::A_BYTES;
        o.bars = o.b + stages * Cfg::B_BYTES;  // full[stages], empty[stages]
        o.epilogue = (o.bars + 2 * stages * 8 + 127) / 128 * 128;
        o.bytes = o.epilogue + (Cfg::PINGPONG ? 2 : 1) * kEpilogueBytes;
        o.launch_bytes = o.bytes + 1024;  // room to align the base to a swizzle atom
        return o;
    }
    static constexpr int stages_that_fit() {
        int s = Cfg::STAGES;
        while (s > 2 && offsets(s).launch_bytes > kLimit) s--;
        return s;
    }
    static constexpr int kStages = stages_that_fit();
    static constexpr Offsets kAt = offsets(kStages);
    static constexpr int a = 0, b = kAt.b, bars = kAt.bars, epilogue = kAt.epilogue, bytes = kAt.bytes,
                         launch_bytes = kAt.launch_bytes;
    static_assert(launch_bytes <= kLimit, "shared memory of the tile configuration");
};

struct Params {
    CUtensorMap tma_a, tma_b;
    int M, N, K;
    int tiles_m, tiles_n, k_blocks;
    // Split-K: work unit u is split u % splits of tile u / splits, k-blocks [split * split_k_blocks,
    // + split_k_blocks) (the last split: to k_blocks). Splits < splits - 1 store their accumulators
    // in partials (slot tile * (splits - 1) + split, BM * BN floats in the threads' fragment order)
    // and count up flags[tile]; the last split waits for them, adds them in split order and runs the
    // epilogue, then zeroes the flag. Deterministic: the same sums in the same order every run.
    int splits, split_k_blocks;
    int* flags;
    float4* partials;
    int prefetch_k_blocks;  // the epilogue's tile inputs are prefetched this many k-blocks before the end (0: not)
    int group_m;  // M-tiles a group of the tile order (tile_coord; group_m_for)
    int half_tiles;  // 1: edge tiles at most half inside the matrix run half the wgmmas (half_tiles_pay)
};

// An edge tile starting at `start` of an output `extent` long is a half tile when at most half of
// its `tile` rows or columns are in the output: the mainloop runs half the wgmmas there.
__host__ __device__ inline bool half_edge(int extent, int start, int tile) { return extent - start <= tile / 2; }

// Grouped tile order: tile t -> (tm, tn) with group_m M-tiles per group, M fastest in a group.
struct TileCoord {
    int m, n;
};
__host__ __device__ inline TileCoord tile_coord(int t, int tiles_m, int tiles_n, int group_m) {
    const int per_group = group_m * tiles_n;
    const int first_m = (t / per_group) * group_m;
    const int rows = min(group_m, tiles_m - first_m);
    const int local = t % per_group;
    return {first_m + local % rows, local / rows};
}

#ifdef CODA_SM90_DEVICE
// ---------------------------------------------------------------- PTX wrappers (sm_90a only)
namespace ptx {

using codagpt::ptx::smem_addr;

__device__ inline void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}
__device__ inline void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ inline void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` has completed. A fresh barrier counts its previous
// phase (parity 1) as completed, so the producer's first pass over the empty barriers falls through.
__device__ inline void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}

__device__ inline void red_release_add(int* p, int v) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ inline int ld_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ inline void tma_load_2d(uint32_t dst, const CUtensorMap* map, int inner, int outer, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(
            dst),
        "l"(map), "r"(inner), "r"(outer), "r"(bar)
        : "memory");
}

// The same, in every CTA of the cluster that `mask` names: the data and the complete_tx land at
// the same shared offsets there.
__device__ inline void tma_load_2d_multicast(uint32_t dst, const CUtensorMap* map, int inner, int outer, uint32_t bar,
                                             uint16_t mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(dst),
        "l"(map), "r"(inner), "r"(outer), "r"(bar), "h"(mask)
        : "memory");
}
// Arrives on the mbarrier at shared address `bar` of CTA `rank` of the cluster (this one included).
__device__ inline void mbar_arrive_cluster(uint32_t bar, uint32_t rank) {
    asm volatile(
        "{\n .reg .b32 remote;\n mapa.shared::cluster.u32 remote, %0, %1;\n"
        " mbarrier.arrive.shared::cluster.b64 _, [remote];\n}" ::"r"(bar),
        "r"(rank)
        : "memory");
}
// Every thread of the cluster that has not exited: once all have arrived.
__device__ inline void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\n barrier.cluster.wait.acquire;" ::: "memory");
}

__device__ inline void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
__device__ inline void named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ inline void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ inline void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads of an accumulator across wgmma_wait.
__device__ inline void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }

template <int Regs>
__device__ inline void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Regs));
}
template <int Regs>
__device__ inline void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Regs));
}

// wgmma shared-memory descriptor of a 128-byte-swizzled operand, as this mainloop lays them out:
// start address (bits 0-13), LBO = 8192 (bits 16-29) and SBO = 1024 bytes (bits 32-45), all in
// 16-byte units, layout type 1 (128B swizzle) in bits 62-63. The high word is a constant; the low
// word of an address + a 16-byte-multiple offset is the base's low word + offset / 16 (shared
// addresses stay below 256 KB: no carry out of bits 0-13), so the mainloop adds offsets to
// precomputed low words (one integer add a descriptor) instead of re-encoding addresses.
constexpr uint32_t kDescHi = (1024 >> 4) | (1u << 30);
__device__ inline uint32_t desc_lo(uint32_t addr) { return ((addr & 0x3FFFF) >> 4) | (8192 >> 4) << 16; }
__device__ inline uint64_t desc(uint32_t lo) { return (uint64_t)kDescHi << 32 | lo; }

// d[64 x N] (+)= A[64 x 16] B[16 x N], both from shared memory; accumulate=false overwrites d.
// TA / TB: the transpose bits (1 = M-major A, N-major B). d holds N/2 floats a thread, 4 for each
// n8 block in column order: the first N/4 of an n(2N) accumulator are its first N/2 columns, so a
// half tile's wgmma of n(BN/2) runs on the front half of the full tile's accumulators.
template <int N, int TA, int TB>
struct Wgmma;

template <int TA, int TB>
struct Wgmma<64, TA, TB> {
    __device__ static void run(float (&d)[32], uint64_t a, uint64_t b, int accumulate) {
        asm volatile(
            "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
            "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
            "%32, %33, p, 1, 1, %35, %36;\n}"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
              "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
              "+f"(d[30]), "+f"(d[31])
            : "l"(a), "l"(b), "r"(accumulate), "n"(TA), "n"(TB));
    }
};

template <int TA, int TB>
struct Wgmma<128, TA, TB> {
    __device__ static void run(float (&d)[64], uint64_t a, uint64_t b, int accumulate) {
        asm volatile(
            "{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
            "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
            "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
            "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
            "%64, %65, p, 1, 1, %67, %68;\n}"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
              "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
              "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
              "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
              "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
              "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
              "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "l"(a), "l"(b), "r"(accumulate), "n"(TA), "n"(TB));
    }
};

template <int TA, int TB>
struct Wgmma<256, TA, TB> {
    __device__ static void run(float (&d)[128], uint64_t a, uint64_t b, int accumulate) {
        asm volatile(
            "{\n .reg .pred p;\n setp.ne.b32 p, %130, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
            "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
            "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
            "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
            "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
            "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
            "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
            "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
            "%128, %129, p, 1, 1, %131, %132;\n}"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
              "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
              "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
              "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
              "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
              "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
              "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
              "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
              "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]),
              "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]),
              "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]),
              "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]),
              "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]),
              "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]),
              "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
              "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
            : "l"(a), "l"(b), "r"(accumulate), "n"(TA), "n"(TB));
    }
};

// n320 as an n256 and an n64 wgmma: B's columns 256 ... are 32768 bytes on in either layout
// (N-major: 4 atoms of 64 columns x 64 k-rows; K-major: 256 rows of 128 bytes).
template <int TA, int TB>
struct Wgmma<320, TA, TB> {
    __device__ static void run(float (&d)[160], uint64_t a, uint64_t b, int accumulate) {
        Wgmma<256, TA, TB>::run(reinterpret_cast<float(&)[128]>(d[0]), a, b, accumulate);
        Wgmma<64, TA, TB>::run(reinterpret_cast<float(&)[32]>(d[128]), a, b + (32768 >> 4), accumulate);
    }
};

}  // namespace ptx
#endif  // CODA_SM90_DEVICE

// The barrier of the threads running one tile's epilogue, handed to the driver.
template <int THREADS>
struct EpilogueSync {
    int id;
    __device__ void operator()() const { asm volatile("bar.sync %0, %1;" ::"r"(id), "n"(THREADS) : "memory"); }
};

#ifdef CODA_SM90_DEVICE
// Split-K (Params::splits > 1), once a unit's accumulators are complete: a split before the last
// stores them as a partial and counts up the tile's flag (false: no epilogue); the last split waits
// for the others, adds their partials in split order (true: run the epilogue on the sum).
template <class Cfg, class Acc, class Sync>
__device__ bool reduce_splits(const Params& params, Acc& acc, int tile, int split, const Sync& sync) {
    constexpr int kThreadsPerTile = Cfg::WARPS_M * 32, kUnitFloat4s = Cfg::BM * Cfg::BN / 4;
    const int tid = Cfg::PINGPONG ? threadIdx.x % 128 : threadIdx.x - 128;
    float4* const part = params.partials + (long)tile * (params.splits - 1) * kUnitFloat4s + tid;
    if (split < params.splits - 1) {
        float4* const out = part + (long)split * kUnitFloat4s;
#pragma unroll
        for (int fm = 0; fm < Cfg::FM; fm++)
#pragma unroll
            for (int fn = 0; fn < Cfg::FN; fn++)
                __stcg(out + (fm * Cfg::FN + fn) * kThreadsPerTile,
                       make_float4(acc[fm][fn][0], acc[fm][fn][1], acc[fm][fn][2], acc[fm][fn][3]));
        __threadfence();
        sync();
        if (tid == 0) ptx::red_release_add(params.flags + tile, 1);
        return false;
    }
    if (tid == 0) {
        while (ptx::ld_acquire(params.flags + tile) < params.splits - 1) __nanosleep(64);
        params.flags[tile] = 0;  // every split of this launch has arrived: ready for the next launch
    }
    sync();
    for (int s = 0; s < params.splits - 1; s++)
#pragma unroll
        for (int fm = 0; fm < Cfg::FM; fm++)
#pragma unroll
            for (int fn = 0; fn < Cfg::FN; fn++) {
                const float4 p = __ldcg(part + (long)s * kUnitFloat4s + (fm * Cfg::FN + fn) * kThreadsPerTile);
                acc[fm][fn][0] += p.x, acc[fm][fn][1] += p.y, acc[fm][fn][2] += p.z, acc[fm][fn][3] += p.w;
            }
    return true;
}
#endif

// ---------------------------------------------------------------- the kernel
template <class Cfg, bool A_MMAJOR, bool B_NMAJOR, class P>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_kernel(const __grid_constant__ Params params, const __grid_constant__ P program) {
#ifdef CODA_SM90_DEVICE
    using Smem = SmemLayout<Cfg, P>;
    extern __shared__ uint8_t smem_raw[];
    // 128-byte swizzle atoms must start at 1024-byte boundaries (the swizzle is a function of the address).
    // Aligned as a shared address (a generic one would be converted again in every k-block).
    const uint32_t smem_base = (ptx::smem_addr(smem_raw) + 1023u) & ~1023u;
    uint8_t* smem = smem_raw + (smem_base - ptx::smem_addr(smem_raw));
    const uint32_t smem_a = smem_base + Smem::a, smem_b = smem_base + Smem::b;
    const uint32_t full_bar = smem_base + Smem::bars, empty_bar = full_bar + 8 * Smem::kStages;

    // Clusters (Cfg::CLUSTER CTAs along M) take the work units in turn; a unit is a column of
    // CLUSTER M-tiles, this CTA's the one of its rank (past the last M-tile where tiles_m is odd:
    // then the CTA still loads its half of B and takes the k-blocks through its ring, but loads no A
    // and runs no wgmma or epilogue).
    constexpr int kCluster = Cfg::CLUSTER;
    const int rank = kCluster > 1 ? (int)blockIdx.x % kCluster : 0;
    const int cluster = blockIdx.x / kCluster, clusters = gridDim.x / kCluster;
    const int tiles_mc = (params.tiles_m + kCluster - 1) / kCluster;
    const int units = tiles_mc * params.tiles_n * params.splits;
    auto unit_k_blocks = [&](int u) {
        const int begin = u % params.splits * params.split_k_blocks;
        return min(params.k_blocks - begin, params.split_k_blocks);
    };
    auto unit_tile = [&](int u) {
        TileCoord c = tile_coord(u / params.splits, tiles_mc, params.tiles_n, params.group_m);
        c.m = c.m * kCluster + rank;
        return c;
    };
    auto in_matrix = [&](const TileCoord& c) { return kCluster == 1 || c.m < params.tiles_m; };
    if (threadIdx.x == 0) {
        for (int s = 0; s < Smem::kStages; s++) {
            ptx::mbar_init(full_bar + 8 * s, 1);  // the producer's expect_tx
            // one arrival per warp reading the stage, in every CTA the stage's B comes from
            ptx::mbar_init(empty_bar + 8 * s, Cfg::WARPS_M * kCluster);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    if constexpr (kCluster > 1) ptx::cluster_sync();  // no multicast or remote arrival before the barriers exist
    else __syncthreads();
    // A stage read: its barrier gets one arrival from this warp in each CTA of the cluster.
    auto release_stage = [&](int stage, int lane) {
        if constexpr (kCluster == 1) {
            if (lane == 0) ptx::mbar_arrive(empty_bar + 8 * stage);
        } else {
            if (lane < kCluster) ptx::mbar_arrive_cluster(empty_bar + 8 * stage, lane);
        }
    };

    // Broadcast from lane 0, so that the compiler knows it is the same in every lane of a warp:
    // then so are the consumer's ring slots, phases and wgmma descriptors derived from it, which
    // it keeps in uniform registers instead of per-thread ones copied into uniform ones for each wgmma.
    const int warpgroup = __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);
    if (warpgroup == 0) {
        // ------------------------------------------------ producer
        ptx::setmaxnreg_dec<kProducerRegs>();
        if (threadIdx.x == 0) {
            int stage = 0;
            uint32_t phase = 0;
            for (int u = cluster; u < units; u += clusters) {
                const TileCoord tc = unit_tile(u);
                const bool inside = in_matrix(tc);
                const int m0 = tc.m * Cfg::BM, n0 = tc.n * Cfg::BN;
                const int kb_begin = u % params.splits * params.split_k_blocks, kb_end = kb_begin + unit_k_blocks(u);
                for (int kb = kb_begin; kb < kb_end; kb++) {
                    const int k0 = kb * Cfg::BK;
                    const uint32_t full = full_bar + 8 * stage;
                    ptx::mbar_wait(empty_bar + 8 * stage, phase ^ 1);
                    ptx::mbar_expect_tx(full, (inside ? Cfg::A_BYTES : 0) + Cfg::B_BYTES);
                    const uint32_t a = smem_a + stage * Cfg::A_BYTES, b = smem_b + stage * Cfg::B_BYTES;
                    if (inside) {
                        if constexpr (A_MMAJOR) {
#pragma unroll
                            for (int c = 0; c < Cfg::BM / 64; c++)
                                ptx::tma_load_2d(a + c * 8192, &params.tma_a, m0 + 64 * c, k0, full);
                        } else {
                            ptx::tma_load_2d(a, &params.tma_a, k0, m0, full);
                        }
                    }
                    if constexpr (kCluster > 1) {
                        // This CTA's share of the k-block, into every CTA of the cluster: N-major, the
                        // 64-column boxes c = rank, rank + CLUSTER, ...; K-major, B_ROWS_LOADED rows.
                        constexpr uint16_t kAll = (1u << kCluster) - 1;
                        if constexpr (B_NMAJOR) {
#pragma unroll
                            for (int c = 0; c < Cfg::BN / 64; c++)
                                if (c % kCluster == rank)
                                    ptx::tma_load_2d_multicast(b + c * 8192, &params.tma_b, n0 + 64 * c, k0, full, kAll);
                        } else {
                            const int row0 = rank * Cfg::B_ROWS_LOADED;
#pragma unroll
                            for (int r = row0; r < row0 + Cfg::B_ROWS_LOADED; r += Cfg::B_BOX_ROWS)
                                ptx::tma_load_2d_multicast(b + r * 128, &params.tma_b, k0, n0 + r, full, kAll);
                        }
                    } else if constexpr (B_NMAJOR) {
#pragma unroll
                        for (int c = 0; c < Cfg::BN / 64; c++)
                            ptx::tma_load_2d(b + c * 8192, &params.tma_b, n0 + 64 * c, k0, full);
                    } else {
#pragma unroll
                        for (int r = 0; r < Cfg::BN; r += Cfg::B_BOX_ROWS)
                            ptx::tma_load_2d(b + r * 128, &params.tma_b, k0, n0 + r, full);
                    }
                    if (++stage == Smem::kStages) {
                        stage = 0;
                        phase ^= 1;
                    }
                }
            }
        }
        if constexpr (kCluster == 1) return;
    } else {
        // ------------------------------------------------ consumers
        ptx::setmaxnreg_inc<kConsumerRegs>();
        const int consumer = warpgroup - 1;  // which half of the tile's rows, or (ping-pong) which tiles
        const int warp = __shfl_sync(0xffffffffu, (int)threadIdx.x / 32 % 4, 0), lane = threadIdx.x % 32;
        // acc[fm][fn][4]: wgmma's m64nN accumulator, fragment (fm, fn) of this warp at rows
        // warp_row0 + fm*64 + {g, g+8}, columns fn*8 + 2t + {0, 1} (lane = 4g + t).
        float acc[Cfg::FM][Cfg::FN][4];

        // Descriptor bases of this consumer's rows of A and of B, for stage 0 and k16 step 0.
        // K-major: rows at 128 bytes, k16 steps 32 bytes along the swizzled row.
        // MN-major: 64-element atoms of 64 k-rows (8192 bytes), k16 steps 16 rows = 2048 bytes.
        constexpr uint32_t kAStep = A_MMAJOR ? 2048 : 32, kBStep = B_NMAJOR ? 2048 : 32;
        const uint32_t a_row0 = Cfg::PINGPONG ? 0 : consumer * Cfg::WG_ROWS;
        const uint32_t a_base = smem_a + (A_MMAJOR ? a_row0 / 64 * 8192 : a_row0 * 128);
        constexpr uint32_t kAFmStride = A_MMAJOR ? 8192 : 64 * 128;
        const uint32_t a_desc0 = ptx::desc_lo(a_base), b_desc0 = ptx::desc_lo(smem_b);
        using Epilogue = EpilogueOf<Cfg, P>;
        const EpilogueSync<Cfg::WARPS_M * 32> sync{kEpilogueBarrier + (Cfg::PINGPONG ? consumer : 0)};
        uint8_t* epilogue_smem = smem + Smem::epilogue + (Cfg::PINGPONG ? consumer * Smem::kEpilogueBytes : 0);
        const int warp_m = Cfg::PINGPONG ? warp : consumer * 4 + warp;

        // The CTA's i-th unit is cluster + i * clusters (without clusters: blockIdx.x + i * gridDim.x);
        // its k-blocks are the next ring slots from `slot` (the k-blocks of the CTA's units before
        // it), in the order the producer fills them.
        const int first = Cfg::PINGPONG ? consumer : 0, step = Cfg::PINGPONG ? 2 : 1;
        int slot = Cfg::PINGPONG && consumer == 1 ? unit_k_blocks(cluster) : 0;
        for (int i = first, u = cluster + first * clusters; u < units; i += step, u += step * clusters) {
            const int tile = u / params.splits, split = u % params.splits, k_blocks = unit_k_blocks(u);
            const TileCoord tc = unit_tile(u);
            const bool inside = in_matrix(tc);
            // Fresh accumulators each tile (the first wgmma overwrites them anyway): so the compiler
            // sees the previous tile's die in its epilogue instead of living on into this mainloop.
#pragma unroll
            for (int fm = 0; fm < Cfg::FM; fm++)
#pragma unroll
                for (int fn = 0; fn < Cfg::FN; fn++)
#pragma unroll
                    for (int q = 0; q < 4; q++) acc[fm][fn][q] = 0.f;
            int stage = slot % Smem::kStages;
            uint32_t phase = (uint32_t)(slot / Smem::kStages) & 1;
            int prev_stage = -1;
            // The unit that runs the epilogue asks L2 for the tiles its program loads a few k-blocks
            // before the mainloop ends.
            const bool epilogue = inside && (params.splits == 1 || split == params.splits - 1);
            const int prefetch_kb =
                epilogue && params.prefetch_k_blocks > 0 ? max(0, k_blocks - params.prefetch_k_blocks) : -1;
            // The k-loop on kFmUsed of the consumer's m64 blocks (those with rows in the matrix),
            // with wgmmas of n BN/2 where the tile's columns in the matrix fit in half (narrow): the
            // wgmmas left out would only multiply the copy engine's zeros; their accumulators stay 0.
            auto mainloop = [&](auto fm_used, auto narrow) {
                constexpr int kFmUsed = decltype(fm_used)::value, kN = decltype(narrow)::value ? Cfg::BN / 2 : Cfg::BN;
                using Mma = ptx::Wgmma<kN, A_MMAJOR ? 1 : 0, B_NMAJOR ? 1 : 0>;
                for (int kb = 0; kb < k_blocks; kb++) {
                    ptx::mbar_wait(full_bar + 8 * stage, phase);
                    ptx::wgmma_fence();
                    const uint32_t a_lo = a_desc0 + stage * (Cfg::A_BYTES / 16), b_lo = b_desc0 + stage * (Cfg::B_BYTES / 16);
#pragma unroll
                    for (int kk = 0; kk < Cfg::BK / 16; kk++) {
                        const uint64_t b_desc = ptx::desc(b_lo + kk * kBStep / 16);
#pragma unroll
                        for (int fm = 0; fm < kFmUsed; fm++) {
                            const uint64_t a_desc = ptx::desc(a_lo + (fm * kAFmStride + kk * kAStep) / 16);
                            Mma::run(reinterpret_cast<float(&)[kN / 2]>(acc[fm]), a_desc, b_desc, kb > 0 || kk > 0);
                        }
                    }
                    ptx::wgmma_commit();
                    // The previous k-block's wgmmas are done once at most this one is in flight:
                    // its stage goes back to the producer.
                    ptx::wgmma_wait<1>();
                    if (prev_stage >= 0) release_stage(prev_stage, lane);
                    if (kb == prefetch_kb)
                        Epilogue::prefetch(program, tc.m, tc.n, params.M, params.N, a_row0, a_row0 + Cfg::WG_ROWS,
                                           threadIdx.x % 128, 128);
                    prev_stage = stage;
                    if (++stage == Smem::kStages) {
                        stage = 0;
                        phase ^= 1;
                    }
                }
                // Ends the wgmmas' pipeline in the variant itself: where the variants join, the
                // accumulators are final (else ptxas serializes every wgmma, C7515).
                if (Cfg::PINGPONG && u + clusters < units) ptx::named_barrier_arrive(kOrderBarrier + 1 - consumer, 256);
                ptx::wgmma_wait<0>();
                release_stage(prev_stage, lane);
#pragma unroll
                for (int fm = 0; fm < Cfg::FM; fm++)
#pragma unroll
                    for (int fn = 0; fn < Cfg::FN; fn++)
#pragma unroll
                        for (int q = 0; q < 4; q++) ptx::fence_operand(acc[fm][fn][q]);
            };
            auto mainloop_cols = [&](auto fm_used) {
                if constexpr (Cfg::HALF_TILES) {
                    if (half_edge(params.N, tc.n * Cfg::BN, Cfg::BN) && params.half_tiles) {
                        mainloop(fm_used, std::true_type{});
                        return;
                    }
                }
                mainloop(fm_used, std::false_type{});
            };
            // Of this consumer's rows, those in the matrix (without half tiles: all, or none past the last M-tile).
            const int rows = !inside ? 0 : params.half_tiles ? params.M - tc.m * Cfg::BM - (int)a_row0 : Cfg::WG_ROWS;
            if (Cfg::PINGPONG && i > 0) ptx::named_barrier_sync(kOrderBarrier + consumer, 256);
            if (rows > (Cfg::FM - 1) * 64) {
                mainloop_cols(std::integral_constant<int, Cfg::FM>{});
            } else if (rows <= 0) {  // a cooperative tile's second consumer below the matrix, or a cluster's CTA past it
                if constexpr (!Cfg::PINGPONG || kCluster > 1) mainloop_cols(std::integral_constant<int, 0>{});
            } else {
                if constexpr (Cfg::FM == 2) mainloop_cols(std::integral_constant<int, 1>{});
            }

            slot += k_blocks + (Cfg::PINGPONG ? unit_k_blocks(u + clusters) : 0);  // ping-pong: and the other's next

            if (inside && (params.splits == 1 || reduce_splits<Cfg>(params, acc, tile, split, sync)))
                Epilogue::run(program, acc, tc.m * Cfg::BM + a_row0 + warp * 16, tc.n * Cfg::BN, warp_m, 0, tc.m,
                              tc.n, params.tiles_m, params.tiles_n, params.M, params.N, epilogue_smem, sync);
        }
    }
    // No CTA leaves while another may still arrive on its barriers.
    if constexpr (kCluster > 1) ptx::cluster_sync();
#endif  // CODA_SM90_DEVICE
}

// ---------------------------------------------------------------- host side
namespace detail {

// Writes 1 where the code that runs was compiled for sm_90a (a build without it runs sm_80 code here).
static __global__ void probe_kernel(int* has_sm90a) {
#ifdef CODA_SM90_DEVICE
    *has_sm90a = 1;
#else
    *has_sm90a = 0;
#endif
}

// A switch for measuring the L2 prefetch against none in one binary, read once per process:
// CODAGPT_GEMM_PREFETCH_KBLOCKS=N prefetches the epilogue's tile inputs N k-blocks before a tile's
// mainloop ends (0: never; default kPrefetchKBlocks). The passes without a GEMM (gemm_sm80.cuh)
// prefetch their tile whatever it says.
inline int prefetch_k_blocks() {
    static const int n = [] {
        const char* v = std::getenv("CODAGPT_GEMM_PREFETCH_KBLOCKS");
        return v ? std::max(0, std::atoi(v)) : kPrefetchKBlocks;
    }();
    return n;
}

struct DeviceInfo {
    bool sm90a = false;
    int sms = 0;
    long l2_bytes = 0;
    double dram_bytes_per_s = 0;  // peak: 2 transfers a memory clock over the bus (0: not reported)
};
// Per process, for the current device at first use (the trainer uses one device per process).
inline const DeviceInfo& device_info() {
    static const DeviceInfo info = [] {
        DeviceInfo d;
        int dev = 0, major = 0, minor = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev));
        int l2 = 0;
        CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
        d.l2_bytes = l2;
        int mem_khz = 0, bus_bits = 0;
        if (cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev) == cudaSuccess)
            d.dram_bytes_per_s = 2.0 * mem_khz * 1e3 * bus_bits / 8;
        (void)cudaGetLastError();  // an attribute this platform does not report is no error of ours
        if (major == 9 && minor == 0) {
            int* flag = nullptr;
            int host = 0;
            CUDA_CHECK(cudaMalloc(&flag, sizeof(int)));
            probe_kernel<<<1, 1>>>(flag);
            CUDA_CHECK_LAUNCH(probe_kernel);
            CUDA_CHECK(cudaMemcpy(&host, flag, sizeof(int), cudaMemcpyDeviceToHost));
            CUDA_CHECK(cudaFree(flag));
            d.sm90a = host == 1;
        }
        return d;
    }();
    return info;
}

// Split-K's tile flags and partials (Params), shared by the launches on one stream (they never
// overlap), per device, grown to the largest launch so far. The flags are zeroed here, on the
// stream, when (re)allocated; each launch leaves them zero again. Not for CUDA graphs replayed on
// another stream than they were captured on.
struct Workspace {
    int* flags = nullptr;
    float4* partials = nullptr;
    long flag_count = 0, partial_float4s = 0;
};
inline const Workspace& workspace(cudaStream_t stream, long flag_count, long partial_float4s) {
    static std::mutex mutex;
    static std::map<std::pair<int, cudaStream_t>, Workspace> all;
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    std::lock_guard<std::mutex> lock(mutex);
    Workspace& w = all[{dev, stream}];
    if (flag_count > w.flag_count || partial_float4s > w.partial_float4s) {
        CUDA_CHECK(cudaStreamSynchronize(stream));  // earlier launches may still use the old buffers
        CUDA_CHECK(cudaFree(w.flags));
        CUDA_CHECK(cudaFree(w.partials));
        w.flag_count = std::max(w.flag_count, flag_count);
        w.partial_float4s = std::max(w.partial_float4s, partial_float4s);
        CUDA_CHECK(cudaMalloc(&w.flags, w.flag_count * sizeof(int)));
        CUDA_CHECK(cudaMalloc(&w.partials, w.partial_float4s * sizeof(float4)));
        CUDA_CHECK(cudaMemsetAsync(w.flags, 0, w.flag_count * sizeof(int), stream));
    }
    return w;
}

inline PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
    static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult status{};
        CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &status));
        if (status != cudaDriverEntryPointSuccess || p == nullptr)
            throw Error("sm90 GEMM: the driver has no cuTensorMapEncodeTiled");
        return (PFN_cuTensorMapEncodeTiled_v12000)p;
    }();
    return fn;
}

// A bf16 matrix of `outer` rows of `inner` contiguous elements (leading dimension ld), read in
// boxes of 64 x box_outer with 128-byte swizzle; out-of-bounds elements read as zero.
inline CUtensorMap tensor_map(const char* name, const bf16* p, long inner, long outer, long ld, int box_outer) {
    CUtensorMap map;
    const cuuint64_t dims[2] = {(cuuint64_t)inner, (cuuint64_t)outer};
    const cuuint64_t strides[1] = {(cuuint64_t)ld * 2};
    const cuuint32_t box[2] = {64, (cuuint32_t)box_outer}, elem_strides[2] = {1, 1};
    const CUresult r = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void*)p, dims, strides, box,
                                      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        throw Error(std::string("sm90 GEMM: cuTensorMapEncodeTiled failed for operand ") + name + " (error " +
                    std::to_string((int)r) + ")");
    return map;
}

// Checks one operand of extent rows x cols (logical) against the engine's requirements.
inline void check_operand(const char* name, const DeviceOperand& op, long rows, long cols) {
    const long inner = op.layout.transposed ? rows : cols;
    if (op.p == nullptr) throw Error(std::string("sm90 GEMM: operand ") + name + " is null");
    if ((uintptr_t)op.p % 16 != 0)
        throw Error(std::string("sm90 GEMM: operand ") + name + " is not 16-byte aligned");
    if (op.layout.ld % 8 != 0 || op.layout.ld < inner)
        throw Error(std::string("sm90 GEMM: operand ") + name + " has leading dimension " +
                    std::to_string(op.layout.ld) + " (needs a multiple of 8, at least " + std::to_string(inner) + ")");
}

// Calls f(ConfigOf<Cfg>{}) with the configuration of tile t: its geometry below and its launch
// (gemm_with_plan) come from the one Config.
template <class Cfg>
struct ConfigOf {
    using type = Cfg;
};
template <class F>
decltype(auto) with_config(Tile t, F&& f) {
    switch (t) {
        case Tile::k128x256: return f(ConfigOf<Cfg128x256>{});
        case Tile::k256x128: return f(ConfigOf<Cfg256x128>{});
        case Tile::k128x128: return f(ConfigOf<Cfg128x128>{});
        case Tile::kPingPong128x128: return f(ConfigOf<CfgPingPong128x128>{});
        case Tile::kPingPong128x128C2: return f(ConfigOf<CfgPingPong128x128C2>{});
        case Tile::k128x320: return f(ConfigOf<Cfg128x320>{});
        default: return f(ConfigOf<Cfg128x320C2>{});
    }
}
inline int tile_m(Tile t) {
    return with_config(t, [](auto c) { return decltype(c)::type::BM; });
}
inline int tile_n(Tile t) {
    return with_config(t, [](auto c) { return decltype(c)::type::BN; });
}
inline int tile_cluster(Tile t) {
    return with_config(t, [](auto c) { return decltype(c)::type::CLUSTER; });
}
// Its tile and the epilogue's lane split (TileShape's defaults: gemm_epilogue.cuh's segments).
inline TileShape tile_shape_of(Tile t) {
    TileShape s;
    s.bm = tile_m(t);
    s.bn = tile_n(t);
    return s;
}

// How gemm() runs a problem: the tile configuration and the split-K factor; and what the plan's
// cost model estimates it costs (choose_plan's units: only comparable between plans of one card).
struct Plan {
    Tile tile = Tile::k128x256;
    int splits = 1;
    double cost = 0.0;
};
constexpr int kMaxSplits = 8;
constexpr int kMinSplitKBlocks = 16;  // a split's least k-blocks (of 64)
// What splitting adds to a unit (storing or reading back partials, the last split's wait), in
// k-blocks of mainloop: fitted to bench_gemm on the H200 (dbf23ba, 1.5B and 350M dW shapes split 2
// to 6 ways: 29 to 109, most near 50), so that K is split only where the unsplit tiles fill the SMs
// badly (73b0618: 1.5B proj dW 0.207 -> 0.180 ms, 350M proj dW 0.095 -> 0.061, qkv dW 0.182 -> 0.168).
constexpr double kSplitCostKBlocks = 48;

// The plan's cost model: a configuration's relative cost an output element a k-block, and the
// epilogue a tile runs with the tensor cores idle, in k-blocks of mainloop (ping-pong hides its
// epilogue behind the other consumer's mainloop; the cooperative tiles do not). Fitted per card to
// bench_gemm --sweep (every tile configuration of every shape, K unsplit).
struct CostModel {
    const char* card;                      // the card it was fitted on (CODAGPT_GEMM_COSTS's name)
    double pingpong, coop128, coop, wide;  // pp128x128; 128x128; 128x256 and 256x128; 128x320
    double coop_epilogue, wide_epilogue;   // k-blocks: the cooperative tiles', the 128 x 320 tile's
    double per_element(Tile t) const {
        switch (t) {
            case Tile::kPingPong128x128:
            case Tile::kPingPong128x128C2: return pingpong;
            case Tile::k128x128: return coop128;
            case Tile::k128x320:
            case Tile::k128x320C2: return wide;
            default: return coop;
        }
    }
    double epilogue(Tile t) const {
        if (t == Tile::kPingPong128x128 || t == Tile::kPingPong128x128C2) return 0.0;
        return t == Tile::k128x320 || t == Tile::k128x320C2 ? wide_epilogue : coop_epilogue;
    }
};
// The H200 (4.8 TB/s of HBM), every program: the 128 x 320 tile is cheaper a k-block than
// ping-pong's (about half the L2 bytes a flop, a fifth fewer operand bytes from shared memory), but
// its epilogue, 2.5 times ping-pong's tile, is not hidden. It wins where K is long and its 320
// columns divide N (the 1.5B LM head's dX and dW, 3.91 and 4.03 ms against 4.34 and 4.26), and
// loses where K = 1600 (qkv, fc and fcproj forward by 10-18%).
constexpr CostModel kH200Costs{"h200", 0.85, 1.15, 1.0, 0.8, 0.0, 25.0};
// The H100 (3.35 TB/s), plain GEMMs (bench_gemm --sweep of dab81cc, three sweeps of the 35 shapes,
// bench/results/h100_gemm_sweep_dab81cc/): with 30% less bandwidth the tiles with fewer L2
// bytes a flop win more shapes: 128 x 320 the 1.5B outputs 1600 wide and long reductions, 128 x 256
// the 350M dW and long-K shapes; ping-pong keeps the short-K, wide-N ones. The H200's model picks
// tiles 8% slower than each shape's best there (geomean), this one 0.5-0.9% (in sample).
constexpr CostModel kH100PlainCosts{"h100", 1.11, 1.15, 1.0, 0.944, 2.0, 5.0};
// HBM bandwidth between the two cards': the H100's plain-GEMM model below it, the H200's above.
constexpr double kScarceBandwidth = 4.0e12;
// The model a plan uses: programs with an epilogue beyond the store (plain = false) keep the
// H200's on every card: on an H100 too it gives each program its fastest tile, or one within 5%
// (bench_gemm --energy 0.5 --sweep of the 1.5B and 350M programs, forty-eighth session).
inline const CostModel& cost_model(double dram_bytes_per_s, bool plain) {
    return plain && dram_bytes_per_s > 0 && dram_bytes_per_s < kScarceBandwidth ? kH100PlainCosts : kH200Costs;
}
// This device's model, read once per process: CODAGPT_GEMM_COSTS=h100 or h200 makes plain GEMMs use
// that card's model on any card (to compare the two in one run); programs keep the H200's.
inline const CostModel& plan_costs(const DeviceInfo& d, bool plain) {
    static const CostModel& plain_model = [&]() -> const CostModel& {
        const char* v = std::getenv("CODAGPT_GEMM_COSTS");
        if (!v || !*v) return cost_model(d.dram_bytes_per_s, true);
        std::string cards;
        for (const CostModel* m : {&kH100PlainCosts, &kH200Costs}) {
            if (std::string(v) == m->card) return *m;
            cards += (cards.empty() ? "" : ", ") + std::string(m->card);
        }
        throw Error(std::string("CODAGPT_GEMM_COSTS=") + v + ": not a fitted card (" + cards + ")");
    }();
    return plain ? plain_model : cost_model(d.dram_bytes_per_s, false);
}
// A program that declares the wide tile (wide_tile_pays) has its epilogue term left out only from
// this many k-blocks on: the 1.5B ResidualForward gained on the wide tile at K = 6400 (100 k-blocks,
// 25.34 -> 23.92 ms a traced step) and lost at K = 1600 (25, 8.51 -> 8.74); 50 lies between.
constexpr int kWideProgramMinKBlocks = 50;

inline int split_k_blocks(int k_blocks, int splits) { return (k_blocks + splits - 1) / splits; }
// K's k-blocks split `splits` ways (1 to kMaxSplits) leave no split empty.
inline bool splits_fit(int k_blocks, int splits) {
    return splits >= 1 && splits <= kMaxSplits && (splits - 1) * split_k_blocks(k_blocks, splits) < k_blocks;
}

// A switch for measuring tile configurations inside the trainer, read once per process:
// CODAGPT_GEMM_TILE=128x256 (or any other tile_name: pp128x128, pp128x128c2, ...) makes every GEMM of the
// engine use that configuration, the split-K factor still chosen for it. Null when unset.
inline std::optional<Tile> forced_tile() {
    static const std::optional<Tile> forced = []() -> std::optional<Tile> {
        const char* v = std::getenv("CODAGPT_GEMM_TILE");
        if (!v || !*v) return std::nullopt;
        std::string names;
        for (Tile t : kTiles) {
            if (tile_name(t) == std::string(v)) return t;
            names += (names.empty() ? "" : ", ") + std::string(tile_name(t));
        }
        throw Error(std::string("CODAGPT_GEMM_TILE=") + v + ": not a tile configuration (" + names + ")");
    }();
    return forced;
}

// wide_program: the program declares that the 128 x 320 tile pays for it (wide_tile_pays): where
// K is long (kWideProgramMinKBlocks) its epilogue costs as much on ping-pong as unhidden on the
// wide tile, so the wide tile's epilogue term is left out of its cost.
// wide_refused: the program declares that it must not run on the 128 x 320 tile (wide_tile_refused).
inline Plan choose_plan(const GemmProblem& prob, int sms, bool wide_program = false, bool wide_refused = false,
                        const CostModel& costs = kH200Costs) {
    // Estimated time ~ (work units per CTA) * tile area * cost per element of the configuration
    // * (k-blocks per unit, plus the partial's cost when split, plus its unhidden epilogue).
    // Splitting K pays where the tiles are too few to fill the SMs evenly (the weight gradients'
    // small outputs with K = B*T).
    const int k_blocks = n_tiles(prob.K, kBK);
    const std::optional<Tile> forced = forced_tile();
    const bool wide_hidden = wide_program && k_blocks >= kWideProgramMinKBlocks;
    Plan best;
    double best_cost = 1e300;
    for (Tile t : kTiles) {
        if (forced && t != *forced) continue;
        // Clusters: measured only where asked for (CODAGPT_GEMM_TILE, bench_gemm --sweep), as they
        // ran no faster than pp128x128 on the 1.5B shapes, sustained or not, nor in the 1.5B step.
        if (!forced && tile_cluster(t) > 1) continue;
        if (!forced && wide_refused && tile_n(t) == 320) continue;
        const int max_splits = tile_cluster(t) > 1 ? 1 : kMaxSplits;  // clusters do not split K
        for (int s = 1; s <= max_splits; s++) {
            const int per_split = split_k_blocks(k_blocks, s);
            if (s > 1 && (per_split < kMinSplitKBlocks || !splits_fit(k_blocks, s))) break;
            const long units = (long)n_tiles(prob.M, tile_m(t)) * n_tiles(prob.N, tile_n(t)) * s;
            // Ping-pong needs two units per CTA to keep both consumers busy (measured: 1024x1024x16384
            // runs 0.115 ms ping-pong, 0.100 ms cooperative 128x128).
            if (!forced && t == Tile::kPingPong128x128 && units < 2l * sms) continue;
            const long per_cta = (units + sms - 1) / sms;
            const double epilogue = wide_hidden && tile_n(t) == 320 ? 0.0 : costs.epilogue(t);
            const double cost = (double)per_cta * tile_m(t) * tile_n(t) * costs.per_element(t) *
                                (per_split + (s > 1 ? kSplitCostKBlocks : 0.0) + epilogue);
            if (cost < best_cost) {
                best = {t, s, cost};
                best_cost = cost;
            }
        }
    }
    return best;
}

// An output's tiles, and whether its last tile row / column is a half tile (half_edge).
struct TileGrid {
    int tiles_m, tiles_n;
    bool half_m, half_n;
    static TileGrid of(int M, int N, int bm, int bn) {
        const int tm = n_tiles(M, bm), tn = n_tiles(N, bn);
        return {tm, tn, half_edge(M, (tm - 1) * bm, bm), half_edge(N, (tn - 1) * bn, bn)};
    }
    // Tile (m, n)'s work in full tiles: 1, 1/2 on a half edge, 1/4 in a half corner.
    double work(int m, int n) const {
        return (half_m && m == tiles_m - 1 ? 0.5 : 1.0) * (half_n && n == tiles_n - 1 ? 0.5 : 1.0);
    }
};

// The work of the busiest CTA, in full tiles, when the units (each tile split `splits` ways) in the
// tile order of group_m are dealt round robin to `grid` CTAs.
inline double busiest_cta_work(const TileGrid& g, int splits, int grid, int group_m) {
    std::vector<double> work(grid, 0.0);
    const long units = (long)g.tiles_m * g.tiles_n * splits;
    for (long u = 0; u < units; u++) {
        const TileCoord c = tile_coord((int)(u / splits), g.tiles_m, g.tiles_n, group_m);
        work[u % grid] += g.work(c.m, c.n);
    }
    return *std::max_element(work.begin(), work.end());
}

// The group size of the tile order: max_group M-tiles, or where the output has half tiles, the
// largest size from max_group / 2 to max_group that leaves the busiest CTA the least work. 1.5B's
// 16384 x 1600 outputs in 128 x 128 tiles on 132 SMs: 12 (12.5 tiles' work a CTA), not 16 (13: the
// groups' half tiles fall on the same CTAs). Dealing all half tiles after the full ones balances
// as well, but by then their A rows have left L2: on the H200, 16384 x 1600 x 6400 took 0.503 ms
// that way against 0.489 with full-cost edge tiles (bench/NOTES_gemm_sm90.md, twelfth session).
// Once per shape and process.
inline int group_m_for(const TileGrid& g, int splits, int grid, int max_group) {
    if (!g.half_m && !g.half_n) return max_group;
    static std::mutex mutex;
    static std::map<std::array<int, 7>, int> chosen;
    const std::array<int, 7> key{g.tiles_m, g.tiles_n, g.half_m, g.half_n, splits, grid, max_group};
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = chosen.find(key); it != chosen.end()) return it->second;
    int best = max_group;
    double least = busiest_cta_work(g, splits, grid, max_group);
    for (int group = max_group - 1; group >= max_group / 2; group--) {
        const double w = busiest_cta_work(g, splits, grid, group);
        if (w < least) best = group, least = w;
    }
    return chosen[key] = best;
}

// Half tiles (cheaper edge tiles) pay where one group's operands, the A rows of group_m M-tiles
// and all of B, fit in L2. Where they do not, the CTAs in flight share A and B k-blocks in L2 only
// while they run through K in step, and a half tile takes its CTA out of step: on the H200 both
// 16384 x 1600 x 50304 (LM head dX) and 1600 x 6400 x 16384 (fc dW) ran 8% slower with them, while
// the 1.5B forward and dX shapes with K <= 6400 (a group's operands 15-47 MB) gained 0.5-4%
// (bench/NOTES_gemm_sm90.md, twelfth session).
inline bool half_tiles_pay(const GemmProblem& prob, int bm, int group_m, long l2_bytes) {
    const long rows = std::min<long>(prob.M, (long)group_m * bm);
    return (rows + prob.N) * (long)prob.K * 2 <= l2_bytes;
}

template <class Cfg, bool A_MMAJOR, bool B_NMAJOR, class P>
void launch(const P& program, const GemmProblem& prob, int splits, cudaStream_t stream) {
    using Smem = SmemLayout<Cfg, P>;
    auto kernel = gemm_kernel<Cfg, A_MMAJOR, B_NMAJOR, P>;
    static const bool configured = [&] {
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Smem::launch_bytes));
        return true;
    }();
    (void)configured;
    Params params;
    params.M = prob.M;
    params.N = prob.N;
    params.K = prob.K;
    params.tiles_m = n_tiles(prob.M, Cfg::BM);
    params.tiles_n = n_tiles(prob.N, Cfg::BN);
    params.k_blocks = n_tiles(prob.K, Cfg::BK);
    params.splits = splits;
    params.split_k_blocks = split_k_blocks(params.k_blocks, splits);
    params.prefetch_k_blocks = prefetch_k_blocks();
    const long tiles = (long)params.tiles_m * params.tiles_n;
    if (splits > 1) {
        const Workspace& w = workspace(stream, tiles, tiles * (splits - 1) * Cfg::BM * Cfg::BN / 4);
        params.flags = w.flags;
        params.partials = w.partials;
    } else {
        params.flags = nullptr;
        params.partials = nullptr;
    }
    // A: K-major [M rows of K] in one box of BM rows, or M-major [K rows of M] in 64x64 boxes.
    params.tma_a = A_MMAJOR ? tensor_map("A", prob.a.p, prob.M, prob.K, prob.a.layout.ld, 64)
                            : tensor_map("A", prob.a.p, prob.K, prob.M, prob.a.layout.ld, Cfg::BM);
    params.tma_b = B_NMAJOR ? tensor_map("B", prob.b.p, prob.N, prob.K, prob.b.layout.ld, 64)
                            : tensor_map("B", prob.b.p, prob.K, prob.N, prob.b.layout.ld, Cfg::B_BOX_ROWS);
    if constexpr (Cfg::CLUSTER == 1) {
        const int grid = (int)std::min<long>(tiles * splits, device_info().sms);
        params.half_tiles = Cfg::HALF_TILES && half_tiles_pay(prob, Cfg::BM, Cfg::GROUP_M, device_info().l2_bytes);
        params.group_m = params.half_tiles
                             ? group_m_for(TileGrid::of(prob.M, prob.N, Cfg::BM, Cfg::BN), splits, grid, Cfg::GROUP_M)
                             : Cfg::GROUP_M;
        kernel<<<grid, kThreads, Smem::launch_bytes, stream>>>(params, program);
        CUDA_CHECK_LAUNCH(gemm_kernel);
    } else {
        // As many clusters as fit at once (or as there are units: columns of CLUSTER M-tiles), K
        // unsplit, full-cost edge tiles; the group of the tile order counts clusters' M-tile rows.
        if (splits != 1) throw Error("sm90 GEMM: tile configurations in clusters do not split K");
        cudaLaunchConfig_t config{};
        cudaLaunchAttribute attribute[1];
        attribute[0].id = cudaLaunchAttributeClusterDimension;
        attribute[0].val.clusterDim.x = Cfg::CLUSTER;
        attribute[0].val.clusterDim.y = 1;
        attribute[0].val.clusterDim.z = 1;
        config.blockDim = dim3(kThreads);
        config.dynamicSmemBytes = Smem::launch_bytes;
        config.stream = stream;
        config.attrs = attribute;
        config.numAttrs = 1;
        static const int max_clusters = [&] {
            cudaLaunchConfig_t probe = config;
            probe.gridDim = dim3(device_info().sms / Cfg::CLUSTER * Cfg::CLUSTER);
            int n = 0;
            CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &probe));
            if (n < 1) throw Error("sm90 GEMM: no cluster of the tile configuration fits on this GPU");
            return n;
        }();
        const long units = (long)n_tiles(params.tiles_m, Cfg::CLUSTER) * params.tiles_n;
        config.gridDim = dim3((unsigned)(Cfg::CLUSTER * std::min<long>(units, max_clusters)));
        params.half_tiles = 0;
        params.group_m = Cfg::GROUP_M / Cfg::CLUSTER;
        CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, params, program));  // reports launch errors too
    }
}

template <class Cfg, class P>
void launch_layouts(const P& program, const GemmProblem& prob, int splits, cudaStream_t stream) {
    const bool a_mmajor = prob.a.layout.transposed, b_nmajor = !prob.b.layout.transposed;
    if (a_mmajor) {
        if (b_nmajor) launch<Cfg, true, true>(program, prob, splits, stream);
        else launch<Cfg, true, false>(program, prob, splits, stream);
    } else {
        if (b_nmajor) launch<Cfg, false, true>(program, prob, splits, stream);
        else launch<Cfg, false, false>(program, prob, splits, stream);
    }
}

// gemm() with the plan given (the benchmark and the tests compare them). splits: 1 to kMaxSplits,
// each split at least one k-block.
template <class P>
void gemm_with_plan(const P& program, const GemmProblem& prob, Plan plan, cudaStream_t stream) {
    static_assert(!is_pass<P>, "a pass program has no GEMM to run on the Hopper mainloop");
    if (prob.M <= 0 || prob.N <= 0 || prob.K <= 0)
        throw Error("sm90 GEMM: empty problem M=" + std::to_string(prob.M) + " N=" + std::to_string(prob.N) +
                    " K=" + std::to_string(prob.K));
    const int k_blocks = n_tiles(prob.K, kBK);
    if (!splits_fit(k_blocks, plan.splits))
        throw Error("sm90 GEMM: " + std::to_string(plan.splits) + " K splits of " + std::to_string(k_blocks) +
                    " k-blocks (needs 1 to " + std::to_string(kMaxSplits) + ", none empty)");
    check_operand("A", prob.a, prob.M, prob.K);
    check_operand("B", prob.b, prob.K, prob.N);
    with_config(plan.tile, [&](auto c) { launch_layouts<typename decltype(c)::type>(program, prob, plan.splits, stream); });
}

}  // namespace detail

// ---------------------------------------------------------------- the mainloop's interface
// True on a compute capability 9.0 device when this binary carries sm_90a code for it.
inline bool available() {
    const detail::DeviceInfo& d = detail::device_info();
    return d.sm90a;
}

// The plan gemm() runs program type P on `prob` with (P = void: the plan of a plain GEMM by shape).
template <class P = void>
detail::Plan plan(const GemmProblem& prob) {
    const detail::DeviceInfo& d = detail::device_info();
    return detail::choose_plan(prob, d.sms, wide_tile_pays<P>, wide_tile_refused<P>,
                               detail::plan_costs(d, std::is_void_v<P> || plain_gemm<P>));
}
// The tile shape and lane split gemm() uses for P on `prob` (callers size partials buffers from it).
template <class P = void>
TileShape tile_shape(const GemmProblem& prob) {
    return detail::tile_shape_of(plan<P>(prob).tile);
}

template <class P>
void gemm(const P& program, const GemmProblem& prob, cudaStream_t stream) {
    detail::gemm_with_plan(program, prob, plan<P>(prob), stream);
}

}  // namespace codagpt::coda::sm90
