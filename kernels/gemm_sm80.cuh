// The portable mainloop of the CODA GEMM engine: cp.async + ldmatrix + mma.sync m16n8k16 (bf16 in,
// fp32 accumulators), for sm_80 and newer: the A100 path, and the one that runs the passes without
// a GEMM (K = 0) everywhere. gemm.cuh picks between it and the Hopper mainloop.
//
// One block of 4 warps per 128 x 128 output tile; the warps form a 2 x 2 grid of 64 x 64 warp
// tiles (4 x 8 mma fragments, 128 fp32 accumulators a thread). K advances in steps of 32 through
// a 4-stage ring of shared-memory tiles filled by cp.async, so three tiles are in flight while
// the fourth is multiplied. Each operand tile is stored as it lies in global memory:
//   K-major (A row-major, B transposed): 128 rows x 32 k, fragments by ldmatrix;
//   MN-major (A transposed, B row-major): 32 k x 128 columns, fragments by ldmatrix.trans;
// rows padded by 16 bytes so that the 8 rows an ldmatrix phase reads fall on distinct banks.
// Edge tiles: 16-byte chunks outside M x K (N x K) are zero-filled by cp.async (src-size 0), so
// nothing outside the operands is read and the zeros add nothing; the epilogue skips elements
// outside M x N. Blocks walk the tiles in groups of 8 tile rows, column by column, so that a
// group's A rows stay in L2 while B streams through.
#pragma once
#include <stdint.h>

#include <algorithm>

#include "common.cuh"
#include "gemm_emulator.hpp"
#include "gemm_epilogue.cuh"
#include "gemm_types.cuh"
#include "ptx_sm80.cuh"

namespace codagpt::coda::sm80 {

constexpr int kBM = 128, kBN = 128, kBK = 32;  // block tile
constexpr int kStages = 4;
constexpr int kWarpsM = 2, kWarpsN = 2, kThreads = 32 * kWarpsM * kWarpsN;
constexpr int kFM = kBM / kWarpsM / 16, kFN = kBN / kWarpsN / 8;  // mma fragments of a warp tile
constexpr int kGroupRows = 8;                                     // tile rows of a raster group
// Blocks an SM a pass without a GEMM is compiled for: 5 caps it at 102 registers (QkvGradient and
// CrossEntropyGradient use 96, ptxas -v, sm_90a), and 5 blocks fit beside each other in shared
// memory with two loaded tiles (38 KB a block). More blocks, more copies in flight beside segments.
constexpr int kPassBlocksPerSM = 5;

// One stage of one operand's shared tile (kBM == kBN, so A and B tiles have the same shapes).
template <bool KMAJOR>
struct OperandTile {
    static constexpr int kRows = KMAJOR ? kBM : kBK;
    static constexpr int kStride = (KMAJOR ? kBK : kBM) + 8;  // +16 bytes: conflict-free ldmatrix
    static constexpr int kElems = kRows * kStride;
    static constexpr int kChunksPerRow = (KMAJOR ? kBK : kBM) / 8;
};
template <bool A_KMAJOR, bool B_KMAJOR>
constexpr size_t kRingBytes = (size_t)kStages * (OperandTile<A_KMAJOR>::kElems + OperandTile<B_KMAJOR>::kElems) * sizeof(bf16);

using ptx::cp_async16, ptx::cp_async_commit, ptx::cp_async_wait, ptx::ldmatrix_x4, ptx::mma_bf16;

// ---------------------------------------------------------------- tiles
// Copies the operand's rows r0..r0+127 (of R) x k0..k0+31 (of K) into a stage tile; element (r, k)
// of the operand lives at p[r*ld + k] (K-major) or p[k*ld + r] (MN-major).
template <bool KMAJOR>
__device__ inline void load_tile(bf16* tile, const bf16* p, long ld, int r0, int k0, int R, int K, int tid) {
    using Tile = OperandTile<KMAJOR>;
#pragma unroll
    for (int c = tid; c < Tile::kRows * Tile::kChunksPerRow; c += kThreads) {
        const int row = c / Tile::kChunksPerRow, col = c % Tile::kChunksPerRow * 8;
        const int r = KMAJOR ? r0 + row : r0 + col, k = KMAJOR ? k0 + col : k0 + row;
        const bool valid = r < R && k < K;  // R and K are multiples of 8: a chunk is all in or all out
        const bf16* src = valid ? p + (KMAJOR ? (long)r * ld + k : (long)k * ld + r) : p;
        cp_async16(tile + row * Tile::kStride + col, src, valid);
    }
}

// The A fragment of rows m0..m0+15, k0..k0+15 (matrices: rows +0/+8 at k +0, then at k +8).
template <bool KMAJOR>
__device__ inline void load_a(uint32_t (&a)[4], const bf16* tile, int m0, int k0, int lane) {
    constexpr int S = OperandTile<KMAJOR>::kStride;
    const int row8 = 8 * ((lane >> 3) & 1), k8 = 8 * (lane >> 4);
    if constexpr (KMAJOR) ldmatrix_x4<false>(a, tile + (m0 + (lane & 7) + row8) * S + k0 + k8);
    else ldmatrix_x4<true>(a, tile + (k0 + (lane & 7) + k8) * S + m0 + row8);
}
// The B fragments of columns n0..n0+15, k0..k0+15: b[0], b[1] for the n8 tile n0, b[2], b[3] for
// n0 + 8 (matrices: k +0/+8 at n +0, then at n +8).
template <bool KMAJOR>
__device__ inline void load_b(uint32_t (&b)[4], const bf16* tile, int n0, int k0, int lane) {
    constexpr int S = OperandTile<KMAJOR>::kStride;
    const int k8 = 8 * ((lane >> 3) & 1), col8 = 8 * (lane >> 4);
    if constexpr (KMAJOR) ldmatrix_x4<false>(b, tile + (n0 + (lane & 7) + col8) * S + k0 + k8);
    else ldmatrix_x4<true>(b, tile + (k0 + (lane & 7) + k8) * S + n0 + col8);
}

struct BlockSync {
    __device__ void operator()() const { __syncthreads(); }
};

// ---------------------------------------------------------------- the kernel
// kPass: a pass without a GEMM (K = 0), the epilogue on accumulators that are zero at compile
// time: the compiler keeps no registers for them and the block needs only the epilogue's shared
// memory (its copies of the tiles it reads, a chunk at a time), so a memory-bound pass runs with
// many blocks per SM instead of a GEMM tile's two.
template <class P, bool A_KMAJOR, bool B_KMAJOR, bool kPass = false>
__global__ void __launch_bounds__(kThreads, kPass ? kPassBlocksPerSM : 1) gemm_kernel(const P program, const GemmProblem prob) {
    using ATile = OperandTile<A_KMAJOR>;
    using BTile = OperandTile<B_KMAJOR>;
    using Epilogue = TileEpilogue<P, kFM, kFN, 16, kWarpsM, kWarpsN, kPass>;
    extern __shared__ __align__(16) unsigned char smem[];
    bf16* a_ring = reinterpret_cast<bf16*>(smem);
    bf16* b_ring = a_ring + kStages * ATile::kElems;

    const int M = prob.M, N = prob.N, K = prob.K;
    const int tiles_m = (M + kBM - 1) / kBM, tiles_n = (N + kBN - 1) / kBN;
    const int group_tiles = kGroupRows * tiles_n, first_m = blockIdx.x / group_tiles * kGroupRows;
    const int group_rows = min(tiles_m - first_m, kGroupRows), in_group = blockIdx.x % group_tiles;
    const int tile_m = first_m + in_group % group_rows, tile_n = in_group / group_rows;
    const int m0 = tile_m * kBM, n0 = tile_n * kBN;

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int warp_m = warp / kWarpsN, warp_n = warp % kWarpsN;
    if constexpr (kPass) {
        // The epilogue copies the tiles the pass reads into shared memory, a chunk at a time, all
        // of a chunk in flight at once (one segment read ahead a thread kept the pass at ~2.4 TB/s,
        // bench/NOTES_gemm_sm90.md).
        const float zero[kFM][kFN][4] = {};
        Epilogue::run(program, zero, m0 + warp_m * kFM * 16, n0 + warp_n * kFN * 8, warp_m, warp_n, tile_m, tile_n,
                      tiles_m, tiles_n, M, N, smem, BlockSync{});
        return;
    }
    const int k_tiles = (K + kBK - 1) / kBK;

    auto load_stage = [&](int stage, int kt) {
        load_tile<A_KMAJOR>(a_ring + stage * ATile::kElems, prob.a.p, prob.a.layout.ld, m0, kt * kBK, M, K, tid);
        load_tile<B_KMAJOR>(b_ring + stage * BTile::kElems, prob.b.p, prob.b.layout.ld, n0, kt * kBK, N, K, tid);
    };
#pragma unroll
    for (int s = 0; s < kStages - 1; s++) {
        if (s < k_tiles) load_stage(s, s);
        cp_async_commit();  // empty groups too, so that the wait below counts stages
    }

    float acc[kFM][kFN][4] = {};
    for (int kt = 0; kt < k_tiles; kt++) {
        cp_async_wait<kStages - 2>();  // tile kt has landed (this thread's copies) ...
        __syncthreads();               // ... everyone's; and stage (kt - 1) % kStages is read by all
        const int next = kt + kStages - 1;
        if (next < k_tiles) load_stage(next % kStages, next);
        cp_async_commit();

        const bf16* a_tile = a_ring + (kt % kStages) * ATile::kElems;
        const bf16* b_tile = b_ring + (kt % kStages) * BTile::kElems;
#pragma unroll
        for (int kk = 0; kk < kBK; kk += 16) {
            uint32_t a[kFM][4], b[kFN / 2][4];
#pragma unroll
            for (int fm = 0; fm < kFM; fm++) load_a<A_KMAJOR>(a[fm], a_tile, warp_m * kFM * 16 + fm * 16, kk, lane);
#pragma unroll
            for (int fn = 0; fn < kFN / 2; fn++) load_b<B_KMAJOR>(b[fn], b_tile, warp_n * kFN * 8 + fn * 16, kk, lane);
#pragma unroll
            for (int fm = 0; fm < kFM; fm++)
#pragma unroll
                for (int fn = 0; fn < kFN; fn++) mma_bf16(acc[fm][fn], a[fm], b[fn / 2][2 * (fn % 2)], b[fn / 2][2 * (fn % 2) + 1]);
        }
    }
    // The ring is idle from here on: the epilogue's cross-warp combine reuses it.
    cp_async_wait<0>();
    __syncthreads();
    Epilogue::run(program, acc, m0 + warp_m * kFM * 16, n0 + warp_n * kFN * 8, warp_m, warp_n, tile_m, tile_n,
                  tiles_m, tiles_n, M, N, smem, BlockSync{});
}

// ---------------------------------------------------------------- host side
inline TileShape tile_shape(const GemmProblem&) { return TileShape{kBM, kBN}; }  // the default lane split
// What gemm() costs, for comparing cuts of one GEMM (gemm.cuh, gemm_plan_cost): its tiles' elements
// times their k-steps, all of them (how its blocks fill the SMs in waves is not modelled).
inline double plan_cost(const GemmProblem& prob) {
    return (double)n_tiles(prob.M, kBM) * n_tiles(prob.N, kBN) * kBM * kBN * n_tiles(prob.K, kBK);
}

template <class P, bool A_KMAJOR, bool B_KMAJOR, bool kPass = false>
void launch(const P& program, const GemmProblem& prob, cudaStream_t stream) {
    using Epilogue = TileEpilogue<P, kFM, kFN, 16, kWarpsM, kWarpsN, kPass>;
    const size_t smem = kPass ? Epilogue::pass_smem_bytes(tile_loads(program))
                              : std::max(kRingBytes<A_KMAJOR, B_KMAJOR>, Epilogue::kSmemBytes);
    auto kernel = gemm_kernel<P, A_KMAJOR, B_KMAJOR, kPass>;
    // Per call rather than once: the attribute is per device, and the call costs about a microsecond.
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const long blocks = (long)n_tiles(prob.M, kBM) * n_tiles(prob.N, kBN);
    kernel<<<(unsigned)blocks, kThreads, smem, stream>>>(program, prob);
    CUDA_CHECK_LAUNCH(sm80::gemm_kernel);
}

// out = program(0): the epilogue on acc = 0 over an M x N output, for a validated problem with K = 0.
template <class P>
void pass(const P& program, const GemmProblem& prob, cudaStream_t stream) {
    launch<P, true, true, true>(program, prob, stream);
}

// out = program(A B) for a validated problem (gemm.cuh checks it); K = 0 runs the epilogue on acc = 0.
template <class P>
void gemm(const P& program, const GemmProblem& prob, cudaStream_t stream) {
    static_assert(!is_pass<P>, "a pass program has no GEMM: pass()");
    if (prob.K == 0) return pass(program, prob, stream);
    const bool a_kmajor = !prob.a.layout.transposed, b_kmajor = prob.b.layout.transposed;
    if (a_kmajor && b_kmajor) launch<P, true, true>(program, prob, stream);
    else if (a_kmajor) launch<P, true, false>(program, prob, stream);
    else if (b_kmajor) launch<P, false, true>(program, prob, stream);
    else launch<P, false, false>(program, prob, stream);
}

}  // namespace codagpt::coda::sm80
