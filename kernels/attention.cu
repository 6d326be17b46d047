// Causal self-attention: the dispatch between cuDNN's SDPA and our own flash attention, and the
// flash-attention kernels themselves (FlashAttention-2 scheme on mma.sync bf16 tensor cores, sm_80+).
//
// Head sizes 16, 32, 64 and 128: the head size is a template parameter (Head<HS>), so the products
// over and into the head are unrolled at compile time; the launchers dispatch on it at run time.
// Forward, one block per (query tile of 64, head, batch), 4 warps of 16 queries each: K/V tiles of 64
// keys stream through shared memory (cp.async, double-buffered); scores S = q.k stay in registers,
// an online softmax rescales the running output, and P (bf16) is fed back to the tensor cores as
// the A operand of P.V without leaving registers. lse = scale*max + log(sum exp) per row.
// Backward recomputes P = exp(scale*q.k - lse) and, with D = rowsum(dout * out):
//   dv = P^T dout,  dP = dout v^T,  dS = P * (dP - D),  dq = scale * dS k,  dk = scale * dS^T q.
// Deterministically, without atomics: one kernel per (key tile, head, batch) sums dk, dv over the
// query tiles, another per (query tile, head, batch) sums dq over the key tiles. At HS = 128 their
// A operands (the block's own rows) are read from shared memory per k-step instead of being held in
// registers, and the dk/dv kernel takes a query tile in two passes of 32, to stay within 255 registers.
#include "attention.cuh"
#include "ptx_sm80.cuh"
#ifdef CODAGPT_HAVE_CUDNN
#include "attention_cudnn.cuh"
#endif

#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>

namespace codagpt {
namespace {

constexpr int kTile = 64;     // queries / keys per tile
constexpr int kThreads = 128; // 4 warps x 16 rows
constexpr float kLog2e = 1.4426950408889634f;
constexpr size_t kStaticSharedMax = 48 * 1024;  // beyond this a block's shared memory must be dynamic

// Everything that depends on the head size, fixed at compile time so that register arrays are
// indexed by constants only (fully unrolled loops, nothing in local memory).
template <int HS>
struct Head {
    static_assert(HS % 16 == 0 && HS >= 16 && HS <= 128, "head size: a multiple of 16, at most 128");
    static constexpr int kStride = HS + 8;  // shared-memory row stride (bf16): +16 bytes keeps ldmatrix conflict-free
    static constexpr int kSteps = HS / 16;  // k-steps of the products over the head (q.k, dout.v)
    static constexpr int kCols = HS / 8;    // n-tiles of the products into the head (P.v, dS.k, dS^T.q)
    // HS = 128: the backward's accumulators (dk and dv, 2 x 64 registers) leave no room for the warp's
    // A operands in registers; they stay in shared memory and are loaded per k-step.
    static constexpr bool kAInShared = HS > 64;
    // Query columns of the dk/dv kernel's scores per pass: at HS = 128 half the tile at a time, so that
    // P and dS (2 x 32 registers at 64 columns) fit beside dk and dv.
    static constexpr int kPassCols = HS > 64 ? 32 : kTile;
    static constexpr int kPassUnroll = HS > 64 ? 1 : kTile / kPassCols;  // passes one after the other
};

// ---------------------------------------------------------------- PTX wrappers
using ptx::cp_async16, ptx::cp_async_commit, ptx::cp_async_wait, ptx::ldmatrix_x4, ptx::mma_bf16;

__device__ inline uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// Fragment loads from a row-major shared tile X (row stride S). Lane l addresses one 16-byte row.
// A operand, rows r0..r0+15, cols c0..c0+15 of X.
template <int S>
__device__ inline void load_a(uint32_t (&a)[4], const bf16* X, int r0, int c0, int lane) {
    ldmatrix_x4<false>(a, X + (r0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * S + c0 + 8 * (lane >> 4));
}
// B operand with B[k][n] = X[n][k] (e.g. keys for q.k): n rows r0..r0+7, k cols c0..c0+31;
// b[0],b[1] is the fragment of k-step c0, b[2],b[3] that of c0+16.
template <int S>
__device__ inline void load_b_rows(uint32_t (&b)[4], const bf16* X, int r0, int c0, int lane) {
    ldmatrix_x4<false>(b, X + (r0 + (lane & 7)) * S + c0 + 8 * (lane >> 3));
}
// The same for a single k-step (HS = 16): n rows r0..r0+15, k cols c0..c0+15;
// b[0],b[1] is the fragment of n-tile r0, b[2],b[3] that of r0+8.
template <int S>
__device__ inline void load_b_rows_pair(uint32_t (&b)[4], const bf16* X, int r0, int c0, int lane) {
    ldmatrix_x4<false>(b, X + (r0 + (lane & 7) + 8 * (lane >> 4)) * S + c0 + 8 * ((lane >> 3) & 1));
}
// B operand with B[k][n] = X[k][n] (e.g. values for P.v): k rows r0..r0+15, n cols c0..c0+15;
// b[0],b[1] is the fragment of n-tile c0, b[2],b[3] that of c0+8.
template <int S>
__device__ inline void load_b_cols(uint32_t (&b)[4], const bf16* X, int r0, int c0, int lane) {
    ldmatrix_x4<true>(b, X + (r0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * S + c0 + 8 * (lane >> 4));
}

// Starts copying rows row0..row0+63 (head slice of HS values, row stride `stride` elements) of a
// [T, ...] matrix into a shared tile; rows >= T become zeros.
template <int HS>
__device__ inline void load_tile_async(bf16* tile, const bf16* src, int row0, int T, long stride) {
    constexpr int kChunks = HS / 8;  // 16-byte chunks per row, a power of 2
    constexpr int kShift = kChunks == 2 ? 1 : kChunks == 4 ? 2 : kChunks == 8 ? 3 : 4;
    static_assert(kChunks == 1 << kShift, "head size: 16, 32, 64 or 128");
    for (int c = threadIdx.x; c < kTile * kChunks; c += kThreads) {
        const int r = c >> kShift, col = (c & (kChunks - 1)) * 8;
        const bool valid = row0 + r < T;
        cp_async16(tile + r * Head<HS>::kStride + col, src + (valid ? (long)(row0 + r) * stride + col : 0), valid);
    }
}

// A operand of a warp's 16 rows times the head (HS/16 k-step fragments): in registers ...
template <int KS>
struct RegA {
    uint32_t f[KS][4];
};
// ... or left in shared memory (rows row0..row0+15 of a tile), loaded one k-step pair at a time.
struct SharedA {
    const bf16* tile;
    int row0;
};

// The 16 x 8NT score tile of one warp: s[j] holds n-tile j (8 columns): s[j][0..1] row lane/4,
// columns 8j + 2(lane%4) + {0,1}; s[j][2..3] the same for row lane/4 + 8.
// s = A (16 x HS) times rows x0..x0+8NT-1 of X (rows of HS values) transposed.
template <int HS, int NT>
__device__ inline void scores(float (&s)[NT][4], const RegA<HS / 16>& a, const bf16* X, int x0, int lane) {
    constexpr int S = Head<HS>::kStride, KS = HS / 16;
    if constexpr (KS % 2 == 0) {
#pragma unroll
        for (int j = 0; j < NT; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
            for (int half = 0; half < KS / 2; half++) {
                uint32_t b[4];
                load_b_rows<S>(b, X, x0 + 8 * j, 32 * half, lane);
                mma_bf16(s[j], a.f[2 * half], b[0], b[1]);
                mma_bf16(s[j], a.f[2 * half + 1], b[2], b[3]);
            }
        }
    } else {  // one k-step: each ldmatrix serves two n-tiles
        static_assert(KS == 1 && NT % 2 == 0, "odd k-step count other than 1");
#pragma unroll
        for (int j = 0; j < NT; j += 2) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
            s[j + 1][0] = s[j + 1][1] = s[j + 1][2] = s[j + 1][3] = 0.f;
            uint32_t b[4];
            load_b_rows_pair<S>(b, X, x0 + 8 * j, 0, lane);
            mma_bf16(s[j], a.f[0], b[0], b[1]);
            mma_bf16(s[j + 1], a.f[0], b[2], b[3]);
        }
    }
}
template <int HS, int NT>
__device__ inline void scores(float (&s)[NT][4], SharedA a, const bf16* X, int x0, int lane) {
    constexpr int S = Head<HS>::kStride, KS = HS / 16;
    static_assert(KS % 2 == 0, "shared A operands are for even k-step counts");
#pragma unroll
    for (int j = 0; j < NT; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int half = 0; half < KS / 2; half++) {
        uint32_t a0[4], a1[4];
        load_a<S>(a0, a.tile, a.row0, 32 * half, lane);
        load_a<S>(a1, a.tile, a.row0, 32 * half + 16, lane);
#pragma unroll
        for (int j = 0; j < NT; j++) {
            uint32_t b[4];
            load_b_rows<S>(b, X, x0 + 8 * j, 32 * half, lane);
            mma_bf16(s[j], a0, b[0], b[1]);
            mma_bf16(s[j], a1, b[2], b[3]);
        }
    }
}

// acc (16 x HS) += P (16 x 8NP in score layout, converted to bf16 A fragments) times rows x0..x0+8NP-1
// of X (rows of HS values).
template <int HS, int NP>
__device__ inline void accumulate_pv(float (&acc)[HS / 8][4], const float (&p)[NP][4], const bf16* X, int x0,
                                     int lane) {
    constexpr int S = Head<HS>::kStride;
#pragma unroll
    for (int kk = 0; kk < NP / 2; kk++) {
        uint32_t a[4];
        a[0] = pack_bf16(p[2 * kk][0], p[2 * kk][1]);
        a[1] = pack_bf16(p[2 * kk][2], p[2 * kk][3]);
        a[2] = pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]);
        a[3] = pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3]);
#pragma unroll
        for (int n = 0; n < HS / 8; n += 2) {
            uint32_t b[4];
            load_b_cols<S>(b, X, x0 + 16 * kk, 8 * n, lane);
            mma_bf16(acc[n], a, b[0], b[1]);
            mma_bf16(acc[n + 1], a, b[2], b[3]);
        }
    }
}

// Writes a warp's 16 x 8NA accumulator (times `mul`) as bf16 rows row0.. of a [T, ...] matrix.
template <int NA>
__device__ inline void store_rows(bf16* dst, long stride, const float (&acc)[NA][4], int row0, int T, float mul0,
                                  float mul1, int lane) {
    const int r = row0 + (lane >> 2);
#pragma unroll
    for (int j = 0; j < NA; j++) {
        const int col = 8 * j + 2 * (lane & 3);
        if (r < T)
            *reinterpret_cast<__nv_bfloat162*>(dst + (long)r * stride + col) =
                __floats2bfloat162_rn(acc[j][0] * mul0, acc[j][1] * mul0);
        if (r + 8 < T)
            *reinterpret_cast<__nv_bfloat162*>(dst + (long)(r + 8) * stride + col) =
                __floats2bfloat162_rn(acc[j][2] * mul1, acc[j][3] * mul1);
    }
}

// A block's shared memory: static up to 48 KiB (every HS <= 64), dynamic beyond (the launcher raises
// the kernel's limit, see launch_shared).
template <class Shared>
__device__ inline Shared& shared_storage() {
    if constexpr (sizeof(Shared) <= kStaticSharedMax) {
        __shared__ Shared s;
        return s;
    } else {
        extern __shared__ __align__(16) unsigned char dynamic_shared[];
        return *reinterpret_cast<Shared*>(dynamic_shared);
    }
}

// Causal blocks are uneven (query tile i sees i+1 key tiles): the longest go first.
__device__ inline int reversed_tile() { return gridDim.x - 1 - blockIdx.x; }

// ---------------------------------------------------------------- forward
template <int HS>
struct alignas(16) ForwardShared {
    bf16 q[kTile * Head<HS>::kStride];
    bf16 k[2][kTile * Head<HS>::kStride];
    bf16 v[2][kTile * Head<HS>::kStride];
};

template <int HS>
__global__ void __launch_bounds__(kThreads) flash_forward_kernel(bf16* out, float* lse, const bf16* qkv, int T,
                                                                 int NH) {
    using H = Head<HS>;
    ForwardShared<HS>& sh = shared_storage<ForwardShared<HS>>();
    const int qt = reversed_tile(), h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int C = NH * HS;
    const long stride = 3L * C;
    const bf16* q_g = qkv + (long)b * T * stride + h * HS;
    const bf16* k_g = q_g + C;
    const bf16* v_g = q_g + 2 * C;
    const float sl2 = kLog2e / sqrtf((float)HS);  // scores to base-2 exponent units

    load_tile_async<HS>(sh.q, q_g, qt * kTile, T, stride);
    load_tile_async<HS>(sh.k[0], k_g, 0, T, stride);
    load_tile_async<HS>(sh.v[0], v_g, 0, T, stride);
    cp_async_commit();

    RegA<H::kSteps> qa;
    float o[H::kCols][4] = {};
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // running max (raw score), partial sums
    const int row = qt * kTile + warp * 16 + (lane >> 2);  // this thread's rows: row, row + 8

    for (int kt = 0; kt <= qt; kt++) {
        if (kt < qt) {
            load_tile_async<HS>(sh.k[(kt + 1) & 1], k_g, (kt + 1) * kTile, T, stride);
            load_tile_async<HS>(sh.v[(kt + 1) & 1], v_g, (kt + 1) * kTile, T, stride);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (kt == 0) {
#pragma unroll
            for (int kk = 0; kk < H::kSteps; kk++) load_a<H::kStride>(qa.f[kk], sh.q, warp * 16, 16 * kk, lane);
        }
        const bf16* ks = sh.k[kt & 1];
        const bf16* vs = sh.v[kt & 1];

        float s[kTile / 8][4];
        scores<HS>(s, qa, ks, 0, lane);
        if (kt == qt) {  // diagonal tile: keys after the query are masked (also every key >= T)
#pragma unroll
            for (int j = 0; j < kTile / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = kt * kTile + 8 * j + 2 * (lane & 3) + (e & 1);
                    if (key > row + 8 * (e >> 1)) s[j][e] = -INFINITY;
                }
        }
        // online softmax: new row max over the quad of lanes sharing the row
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int j = 0; j < kTile / 8; j++) {
            mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
        }
        const float alpha[2] = {exp2f((m[0] - mx[0]) * sl2), exp2f((m[1] - mx[1]) * sl2)};
        const float mb[2] = {mx[0] * sl2, mx[1] * sl2};
        m[0] = mx[0];
        m[1] = mx[1];
        l[0] *= alpha[0];
        l[1] *= alpha[1];
#pragma unroll
        for (int j = 0; j < kTile / 8; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[j][e] = exp2f(fmaf(s[j][e], sl2, -mb[e >> 1]));
                l[e >> 1] += s[j][e];
                if constexpr (H::kCols == kTile / 8) o[j][e] *= alpha[e >> 1];  // HS = 64: one loop
            }
        }
        if constexpr (H::kCols != kTile / 8) {
#pragma unroll
            for (int j = 0; j < H::kCols; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) o[j][e] *= alpha[e >> 1];
        }
        accumulate_pv<HS>(o, s, vs, 0, lane);
        __syncthreads();  // the buffer just read is refilled by the next iteration
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
    store_rows(out + (long)b * T * C + h * HS, C, o, qt * kTile + warp * 16, T, 1.f / l[0], 1.f / l[1], lane);
    if ((lane & 3) == 0) {
        const float scale = 1.f / sqrtf((float)HS);
        float* lse_bh = lse + ((long)b * NH + h) * T;
        if (row < T) lse_bh[row] = m[0] * scale + logf(l[0]);
        if (row + 8 < T) lse_bh[row + 8] = m[1] * scale + logf(l[1]);
    }
}

// ---------------------------------------------------------------- backward
// D[b, h, t] = sum_d dout * out over the head's HS values: HS/8 threads per (token, head), 16 bytes each.
template <int HS>
__global__ void attention_rowdot_kernel(float* D, const bf16* dout, const bf16* out, int B, int T, int NH) {
    constexpr int kGroup = HS / 8;
    const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    const bool valid = idx < (long)B * T * NH * kGroup;
    float sum = 0.f;
    if (valid) {
        const Packed128<bf16> a = load128cs(dout + idx * 8), o = load128cs(out + idx * 8);
#pragma unroll
        for (int i = 0; i < 8; i++) sum += __bfloat162float(a[i]) * __bfloat162float(o[i]);
    }
#pragma unroll
    for (int lanes = 1; lanes < kGroup; lanes *= 2) sum += __shfl_xor_sync(0xffffffffu, sum, lanes);
    if (valid && (idx & (kGroup - 1)) == 0) {
        const long bth = idx / kGroup;  // (b * T + t) * NH + h
        const int h = (int)(bth % NH);
        const long bt = bth / NH;
        const long b = bt / T, t = bt % T;
        D[(b * NH + h) * T + t] = sum;
    }
}

// Double-buffered tiles x, y of the backward kernels (dk/dv: queries and dout; dq: keys and values);
// stage 2, where A operands stay in shared memory, holds the block's own rows (dk/dv: keys and values;
// dq: queries and dout). Where they go to registers, they pass through stage 1 first.
template <int HS>
struct alignas(16) BackwardShared {
    static constexpr int kStages = Head<HS>::kAInShared ? 3 : 2;
    bf16 x[kStages][kTile * Head<HS>::kStride];
    bf16 y[kStages][kTile * Head<HS>::kStride];
};
template <int HS>
struct alignas(16) BackwardDkDvShared : BackwardShared<HS> {
    float lse[2][kTile], d[2][kTile];
};

// The warp's A operands from rows row0.. of shared tiles a_x, a_y (loaded and waited for).
template <int HS>
using BackwardA = std::conditional_t<Head<HS>::kAInShared, SharedA, RegA<HS / 16>>;
template <int HS>
__device__ inline BackwardA<HS> backward_a(const bf16* tile, int row0, int lane) {
    if constexpr (Head<HS>::kAInShared) {
        return SharedA{tile, row0};
    } else {
        RegA<HS / 16> a;
#pragma unroll
        for (int kk = 0; kk < HS / 16; kk++) load_a<Head<HS>::kStride>(a.f[kk], tile, row0, 16 * kk, lane);
        return a;
    }
}

// dk, dv of one key tile: every query tile from the diagonal on contributes.
template <int HS>
__global__ void __launch_bounds__(kThreads) flash_backward_dkdv_kernel(bf16* dqkv, const bf16* dout,
                                                                       const bf16* qkv, const float* lse,
                                                                       const float* D, int T, int NH) {
    using H = Head<HS>;
    BackwardDkDvShared<HS>& sh = shared_storage<BackwardDkDvShared<HS>>();
    const int kt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;  // low key tiles see the most queries: first
    const int n_tiles = gridDim.x;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int C = NH * HS;
    const long stride = 3L * C;
    const bf16* q_g = qkv + (long)b * T * stride + h * HS;
    const bf16* do_g = dout + (long)b * T * C + h * HS;
    const float* lse_g = lse + ((long)b * NH + h) * T;
    const float* d_g = D + ((long)b * NH + h) * T;
    const float scale = 1.f / sqrtf((float)HS), sl2 = scale * kLog2e;

    // this block's keys and values (the warp's 16 rows are its A operands)
    const int a_st = BackwardShared<HS>::kStages - 1;
    load_tile_async<HS>(sh.x[a_st], q_g + C, kt * kTile, T, stride);
    load_tile_async<HS>(sh.y[a_st], q_g + 2 * C, kt * kTile, T, stride);
    cp_async_commit();
    auto load_query_tile = [&](int qt, int st) {
        load_tile_async<HS>(sh.x[st], q_g, qt * kTile, T, stride);
        load_tile_async<HS>(sh.y[st], do_g, qt * kTile, T, C);
        for (int i = threadIdx.x; i < kTile; i += kThreads) {
            const int t = qt * kTile + i;
            sh.lse[st][i] = t < T ? lse_g[t] * kLog2e : INFINITY;  // rows >= T: P = 0
            sh.d[st][i] = t < T ? d_g[t] : 0.f;
        }
    };
    load_query_tile(kt, 0);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const BackwardA<HS> ka = backward_a<HS>(sh.x[a_st], warp * 16, lane);
    const BackwardA<HS> va = backward_a<HS>(sh.y[a_st], warp * 16, lane);
    if constexpr (!H::kAInShared) __syncthreads();  // stage 1 is free again

    float dk[H::kCols][4] = {}, dv[H::kCols][4] = {};
    const int key = kt * kTile + warp * 16 + (lane >> 2);  // this thread's keys: key, key + 8
    for (int qt = kt; qt < n_tiles; qt++) {
        const int st = (qt - kt) & 1;
        if (qt + 1 < n_tiles) {
            load_query_tile(qt + 1, st ^ 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16* qs = sh.x[st];
        const bf16* dos = sh.y[st];

#pragma unroll(H::kPassUnroll)
        for (int c0 = 0; c0 < kTile; c0 += H::kPassCols) {  // queries c0.. of the tile
            float p[H::kPassCols / 8][4], dp[H::kPassCols / 8][4];  // transposed: rows are keys, columns queries
            scores<HS>(p, ka, qs, c0, lane);
            scores<HS>(dp, va, dos, c0, lane);
#pragma unroll
            for (int j = 0; j < H::kPassCols / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int c = c0 + 8 * j + 2 * (lane & 3) + (e & 1);
                    const int query = qt * kTile + c;
                    float pv = exp2f(fmaf(p[j][e], sl2, -sh.lse[st][c]));
                    if (query < key + 8 * (e >> 1)) pv = 0.f;
                    p[j][e] = pv;
                    dp[j][e] = pv * (dp[j][e] - sh.d[st][c]);
                }
            accumulate_pv<HS>(dv, p, dos, c0, lane);
            accumulate_pv<HS>(dk, dp, qs, c0, lane);
        }
        __syncthreads();
    }
    const int row0 = kt * kTile + warp * 16;
    bf16* dk_g = dqkv + (long)b * T * stride + C + h * HS;
    store_rows(dk_g, stride, dk, row0, T, scale, scale, lane);
    store_rows(dk_g + C, stride, dv, row0, T, 1.f, 1.f, lane);
}

// dq of one query tile: every key tile up to the diagonal contributes.
template <int HS>
__global__ void __launch_bounds__(kThreads) flash_backward_dq_kernel(bf16* dqkv, const bf16* dout,
                                                                     const bf16* qkv, const float* lse,
                                                                     const float* D, int T, int NH) {
    using H = Head<HS>;
    BackwardShared<HS>& sh = shared_storage<BackwardShared<HS>>();
    const int qt = reversed_tile(), h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int C = NH * HS;
    const long stride = 3L * C;
    const bf16* q_g = qkv + (long)b * T * stride + h * HS;
    const bf16* k_g = q_g + C;
    const bf16* v_g = q_g + 2 * C;
    const bf16* do_g = dout + (long)b * T * C + h * HS;
    const float scale = 1.f / sqrtf((float)HS), sl2 = scale * kLog2e;

    // this block's queries and their dout rows (the warp's 16 rows are its A operands)
    const int a_st = BackwardShared<HS>::kStages - 1;
    load_tile_async<HS>(sh.x[a_st], q_g, qt * kTile, T, stride);
    load_tile_async<HS>(sh.y[a_st], do_g, qt * kTile, T, C);
    cp_async_commit();
    load_tile_async<HS>(sh.x[0], k_g, 0, T, stride);
    load_tile_async<HS>(sh.y[0], v_g, 0, T, stride);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const BackwardA<HS> qa = backward_a<HS>(sh.x[a_st], warp * 16, lane);
    const BackwardA<HS> doa = backward_a<HS>(sh.y[a_st], warp * 16, lane);
    if constexpr (!H::kAInShared) __syncthreads();  // stage 1 is free again

    const int row = qt * kTile + warp * 16 + (lane >> 2);
    const float* lse_bh = lse + ((long)b * NH + h) * T;
    const float* d_bh = D + ((long)b * NH + h) * T;
    float lse2[2], drow[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = row + 8 * i;
        lse2[i] = r < T ? lse_bh[r] * kLog2e : 0.f;
        drow[i] = r < T ? d_bh[r] : 0.f;
    }

    float dq[H::kCols][4] = {};
    for (int kt = 0; kt <= qt; kt++) {
        if (kt < qt) {
            load_tile_async<HS>(sh.x[(kt + 1) & 1], k_g, (kt + 1) * kTile, T, stride);
            load_tile_async<HS>(sh.y[(kt + 1) & 1], v_g, (kt + 1) * kTile, T, stride);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16* ks = sh.x[kt & 1];
        const bf16* vs = sh.y[kt & 1];

        float p[kTile / 8][4], dp[kTile / 8][4];
        scores<HS>(p, qa, ks, 0, lane);
        scores<HS>(dp, doa, vs, 0, lane);
#pragma unroll
        for (int j = 0; j < kTile / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = kt * kTile + 8 * j + 2 * (lane & 3) + (e & 1);
                float pv = exp2f(fmaf(p[j][e], sl2, -lse2[e >> 1]));
                if (key > row + 8 * (e >> 1)) pv = 0.f;
                dp[j][e] = pv * (dp[j][e] - drow[e >> 1]);
            }
        accumulate_pv<HS>(dq, dp, ks, 0, lane);
        __syncthreads();
    }
    store_rows(dqkv + (long)b * T * stride + h * HS, stride, dq, qt * kTile + warp * 16, T, scale, scale, lane);
}

// Dynamic shared memory of a launch: 0 where the kernel's tiles are static; else the kernel's limit is
// raised to the size of its tiles (a per-device attribute, cheap to set at every launch).
template <class Shared, class Kernel>
size_t launch_shared(Kernel* kernel) {
    if constexpr (sizeof(Shared) <= kStaticSharedMax) {
        (void)kernel;
        return 0;
    } else {
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sizeof(Shared)));
        return sizeof(Shared);
    }
}

template <int HS>
void flash_forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, cudaStream_t stream) {
    const dim3 grid(ceil_div(T, kTile), NH, B);
    const size_t smem = launch_shared<ForwardShared<HS>>(flash_forward_kernel<HS>);
    flash_forward_kernel<HS><<<grid, kThreads, smem, stream>>>(out, lse, qkv, T, NH);
    CUDA_CHECK_LAUNCH(flash_forward_kernel);
}

template <int HS>
void flash_backward(bf16* dqkv, float* rowdot, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse,
                    int B, int T, int NH, cudaStream_t stream) {
    const long groups = (long)B * T * NH * (HS / 8);
    attention_rowdot_kernel<HS><<<ceil_div(groups, 256), 256, 0, stream>>>(rowdot, dout, out, B, T, NH);
    CUDA_CHECK_LAUNCH(attention_rowdot_kernel);
    const dim3 grid(ceil_div(T, kTile), NH, B);
    const size_t smem_kv = launch_shared<BackwardDkDvShared<HS>>(flash_backward_dkdv_kernel<HS>);
    flash_backward_dkdv_kernel<HS><<<grid, kThreads, smem_kv, stream>>>(dqkv, dout, qkv, lse, rowdot, T, NH);
    CUDA_CHECK_LAUNCH(flash_backward_dkdv_kernel);
    const size_t smem_q = launch_shared<BackwardShared<HS>>(flash_backward_dq_kernel<HS>);
    flash_backward_dq_kernel<HS><<<grid, kThreads, smem_q, stream>>>(dqkv, dout, qkv, lse, rowdot, T, NH);
    CUDA_CHECK_LAUNCH(flash_backward_dq_kernel);
}

// Calls f(std::integral_constant<int, HS>) for the head sizes the kernels are compiled for.
template <class F>
void with_head_size(int HS, F&& f) {
    switch (HS) {
        case 16: return f(std::integral_constant<int, 16>{});
        case 32: return f(std::integral_constant<int, 32>{});
        case 64: return f(std::integral_constant<int, 64>{});
        case 128: return f(std::integral_constant<int, 128>{});
        default:
            throw Error("attention: head size " + std::to_string(HS) +
                        " is not supported (the kernels handle HS = 16, 32, 64, 128)");
    }
}

void check_shape(int B, int T, int NH, int HS) {
    with_head_size(HS, [](auto) {});
    if (B <= 0 || T <= 0 || NH <= 0)
        throw Error("attention: bad shape B=" + std::to_string(B) + " T=" + std::to_string(T) +
                    " NH=" + std::to_string(NH));
}

}  // namespace

// ---------------------------------------------------------------- dispatch
struct Attention::Impl {
#ifdef CODAGPT_HAVE_CUDNN
    CudnnAttention* cudnn = nullptr;
#endif
    float* rowdot = nullptr;  // D [B, NH, T] of the flash backward
    size_t rowdot_n = 0;
};

Attention::Attention(bool prefer_cudnn, bool deterministic) : impl_(new Impl) {
#ifdef CODAGPT_HAVE_CUDNN
    if (prefer_cudnn && CudnnAttention::available()) {
        try {
            impl_->cudnn = new CudnnAttention(deterministic);
        } catch (const Error& e) {
            std::fprintf(stderr, "attention: cuDNN unusable (%s); using the own flash kernels\n", e.what());
        }
    }
#else
    (void)prefer_cudnn;
    (void)deterministic;
#endif
}

Attention::~Attention() {
#ifdef CODAGPT_HAVE_CUDNN
    delete impl_->cudnn;
#endif
    cudaFree(impl_->rowdot);
    delete impl_;
}

bool Attention::uses_cudnn() const {
#ifdef CODAGPT_HAVE_CUDNN
    return impl_->cudnn != nullptr;
#else
    return false;
#endif
}

const char* Attention::backend() const {
#ifdef CODAGPT_HAVE_CUDNN
    if (impl_->cudnn) return impl_->cudnn->deterministic() ? "cudnn" : "cudnn (atomic dQ)";
#endif
    return "flash";
}

void Attention::reserve(int B, int T, int NH, int HS) {
    check_shape(B, T, NH, HS);
#ifdef CODAGPT_HAVE_CUDNN
    if (impl_->cudnn) {
        // Training must not break on cuDNN: a shape it cannot plan falls back to the own kernels for good.
        try {
            impl_->cudnn->reserve(B, T, NH, HS);
            return;
        } catch (const Error& e) {
            std::fprintf(stderr, "attention: no cuDNN SDPA plan for B=%d T=%d NH=%d HS=%d, falling back to flash: %s\n",
                         B, T, NH, HS, e.what());
            delete impl_->cudnn;
            impl_->cudnn = nullptr;
        }
    }
#endif
    const size_t n = (size_t)B * NH * T;
    if (n > impl_->rowdot_n) {
        CUDA_CHECK(cudaFree(impl_->rowdot));
        impl_->rowdot = nullptr;
        CUDA_CHECK(cudaMalloc(&impl_->rowdot, n * sizeof(float)));
        impl_->rowdot_n = n;
    }
}

void Attention::forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int HS, cudaStream_t stream) {
    reserve(B, T, NH, HS);
#ifdef CODAGPT_HAVE_CUDNN
    if (impl_->cudnn) {
        impl_->cudnn->forward(out, lse, qkv, B, T, NH, HS, stream);
        return;
    }
#endif
    with_head_size(HS, [&](auto hs) { flash_forward<decltype(hs)::value>(out, lse, qkv, B, T, NH, stream); });
}

void Attention::backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse, int B,
                         int T, int NH, int HS, cudaStream_t stream) {
    reserve(B, T, NH, HS);
#ifdef CODAGPT_HAVE_CUDNN
    if (impl_->cudnn) {
        impl_->cudnn->backward(dqkv, dout, qkv, out, lse, B, T, NH, HS, stream);
        return;
    }
#endif
    with_head_size(HS, [&](auto hs) {
        flash_backward<decltype(hs)::value>(dqkv, impl_->rowdot, dout, qkv, out, lse, B, T, NH, stream);
    });
}

}  // namespace codagpt
