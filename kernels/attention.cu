// Causal self-attention: the dispatch between cuDNN's SDPA and our own flash attention, and the
// flash-attention kernels themselves (FlashAttention-2 scheme on mma.sync bf16 tensor cores, sm_80+).
//
// Forward, one block per (query tile of 64, head, batch), 4 warps of 16 queries each: K/V tiles of 64
// keys stream through shared memory (cp.async, double-buffered); scores S = q.k stay in registers,
// an online softmax rescales the running output, and P (bf16) is fed back to the tensor cores as
// the A operand of P.V without leaving registers. lse = scale*max + log(sum exp) per row.
// Backward recomputes P = exp(scale*q.k - lse) and, with D = rowsum(dout * out):
//   dv = P^T dout,  dP = dout v^T,  dS = P * (dP - D),  dq = scale * dS k,  dk = scale * dS^T q.
// Deterministically, without atomics: one kernel per (key tile, head, batch) sums dk, dv over the
// query tiles, another per (query tile, head, batch) sums dq over the key tiles.
#include "attention.cuh"
#ifdef CODAGPT_HAVE_CUDNN
#include "attention_cudnn.cuh"
#endif

#include <cstdint>
#include <string>

namespace codagpt {
namespace {

constexpr int kHS = 64;       // head size the kernels are written for
constexpr int kTile = 64;     // queries / keys per tile
constexpr int kStride = 72;   // shared-memory row stride (bf16): +16 bytes keeps ldmatrix conflict-free
constexpr int kThreads = 128; // 4 warps x 16 rows
constexpr float kLog2e = 1.4426950408889634f;

// ---------------------------------------------------------------- PTX wrappers
__device__ inline uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

// 16-byte global -> shared copy; rows past the end are zero-filled (src-size 0).
__device__ inline void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ inline void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ inline void ldsm_x4(uint32_t (&r)[4], const bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ inline void ldsm_x4_trans(uint32_t (&r)[4], const bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// d += a (16x16, row) * b (16x8, col), bf16 in, fp32 accumulate.
__device__ inline void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ inline uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
}

// Fragment loads from a row-major shared tile X (row stride kStride). Lane l addresses one 16-byte row.
// A operand, rows r0..r0+15, cols c0..c0+15 of X.
__device__ inline void load_a(uint32_t (&a)[4], const bf16* X, int r0, int c0, int lane) {
    ldsm_x4(a, X + (r0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * kStride + c0 + 8 * (lane >> 4));
}
// B operand with B[k][n] = X[n][k] (e.g. keys for q.k): n rows r0..r0+7, k cols c0..c0+31;
// b[0],b[1] is the fragment of k-step c0, b[2],b[3] that of c0+16.
__device__ inline void load_b_rows(uint32_t (&b)[4], const bf16* X, int r0, int c0, int lane) {
    ldsm_x4(b, X + (r0 + (lane & 7)) * kStride + c0 + 8 * (lane >> 3));
}
// B operand with B[k][n] = X[k][n] (e.g. values for P.v): k rows r0..r0+15, n cols c0..c0+15;
// b[0],b[1] is the fragment of n-tile c0, b[2],b[3] that of c0+8.
__device__ inline void load_b_cols(uint32_t (&b)[4], const bf16* X, int r0, int c0, int lane) {
    ldsm_x4_trans(b, X + (r0 + (lane & 7) + 8 * ((lane >> 3) & 1)) * kStride + c0 + 8 * (lane >> 4));
}

// Starts copying rows row0..row0+63 (head slice of 64 values, row stride `stride` elements) of a
// [T, ...] matrix into a shared tile; rows >= T become zeros.
__device__ inline void load_tile_async(bf16* tile, const bf16* src, int row0, int T, long stride) {
    for (int c = threadIdx.x; c < kTile * kHS / 8; c += kThreads) {
        const int r = c >> 3, col = (c & 7) * 8;
        const bool valid = row0 + r < T;
        cp_async16(tile + r * kStride + col, src + (valid ? (long)(row0 + r) * stride + col : 0), valid);
    }
}

// The 16 x 64 score tile of one warp: s[j] holds n-tile j (8 columns): s[j][0..1] row lane/4,
// columns 8j + 2(lane%4) + {0,1}; s[j][2..3] the same for row lane/4 + 8.
// s = A (16 x 64, four k-step fragments) times rows of X (64 x 64) transposed.
__device__ inline void scores(float (&s)[8][4], const uint32_t (&a)[4][4], const bf16* X, int lane) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
        for (int half = 0; half < 2; half++) {
            uint32_t b[4];
            load_b_rows(b, X, 8 * j, 32 * half, lane);
            mma_bf16(s[j], a[2 * half], b[0], b[1]);
            mma_bf16(s[j], a[2 * half + 1], b[2], b[3]);
        }
    }
}

// acc (16 x 64) += P (16 x 64 in score layout, converted to bf16 A fragments) times X (64 x 64).
__device__ inline void accumulate_pv(float (&acc)[8][4], const float (&p)[8][4], const bf16* X, int lane) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        uint32_t a[4];
        a[0] = pack_bf16(p[2 * kk][0], p[2 * kk][1]);
        a[1] = pack_bf16(p[2 * kk][2], p[2 * kk][3]);
        a[2] = pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]);
        a[3] = pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3]);
#pragma unroll
        for (int n = 0; n < 8; n += 2) {
            uint32_t b[4];
            load_b_cols(b, X, 16 * kk, 8 * n, lane);
            mma_bf16(acc[n], a, b[0], b[1]);
            mma_bf16(acc[n + 1], a, b[2], b[3]);
        }
    }
}

// Writes a warp's 16 x 64 accumulator (times `mul`) as bf16 rows row0.. of a [T, ...] matrix.
__device__ inline void store_rows(bf16* dst, long stride, const float (&acc)[8][4], int row0, int T, float mul0,
                                  float mul1, int lane) {
    const int r = row0 + (lane >> 2);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int col = 8 * j + 2 * (lane & 3);
        if (r < T)
            *reinterpret_cast<__nv_bfloat162*>(dst + (long)r * stride + col) =
                __floats2bfloat162_rn(acc[j][0] * mul0, acc[j][1] * mul0);
        if (r + 8 < T)
            *reinterpret_cast<__nv_bfloat162*>(dst + (long)(r + 8) * stride + col) =
                __floats2bfloat162_rn(acc[j][2] * mul1, acc[j][3] * mul1);
    }
}

// Causal blocks are uneven (query tile i sees i+1 key tiles): the longest go first.
__device__ inline int reversed_tile() { return gridDim.x - 1 - blockIdx.x; }

// ---------------------------------------------------------------- forward
__global__ void __launch_bounds__(kThreads) flash_forward_kernel(bf16* out, float* lse, const bf16* qkv, int T,
                                                                 int NH) {
    __shared__ __align__(16) bf16 q_s[kTile * kStride];
    __shared__ __align__(16) bf16 k_s[2][kTile * kStride];
    __shared__ __align__(16) bf16 v_s[2][kTile * kStride];
    const int qt = reversed_tile(), h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int C = NH * kHS;
    const long stride = 3L * C;
    const bf16* q_g = qkv + (long)b * T * stride + h * kHS;
    const bf16* k_g = q_g + C;
    const bf16* v_g = q_g + 2 * C;
    const float sl2 = kLog2e / sqrtf((float)kHS);  // scores to base-2 exponent units

    load_tile_async(q_s, q_g, qt * kTile, T, stride);
    load_tile_async(k_s[0], k_g, 0, T, stride);
    load_tile_async(v_s[0], v_g, 0, T, stride);
    cp_async_commit();

    uint32_t qa[4][4];
    float o[8][4] = {};
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // running max (raw score), partial sums
    const int row = qt * kTile + warp * 16 + (lane >> 2);  // this thread's rows: row, row + 8

    for (int kt = 0; kt <= qt; kt++) {
        if (kt < qt) {
            load_tile_async(k_s[(kt + 1) & 1], k_g, (kt + 1) * kTile, T, stride);
            load_tile_async(v_s[(kt + 1) & 1], v_g, (kt + 1) * kTile, T, stride);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        if (kt == 0) {
#pragma unroll
            for (int kk = 0; kk < 4; kk++) load_a(qa[kk], q_s, warp * 16, 16 * kk, lane);
        }
        const bf16* ks = k_s[kt & 1];
        const bf16* vs = v_s[kt & 1];

        float s[8][4];
        scores(s, qa, ks, lane);
        if (kt == qt) {  // diagonal tile: keys after the query are masked (also every key >= T)
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = kt * kTile + 8 * j + 2 * (lane & 3) + (e & 1);
                    if (key > row + 8 * (e >> 1)) s[j][e] = -INFINITY;
                }
        }
        // online softmax: new row max over the quad of lanes sharing the row
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int j = 0; j < 8; j++) {
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
        for (int j = 0; j < 8; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[j][e] = exp2f(fmaf(s[j][e], sl2, -mb[e >> 1]));
                l[e >> 1] += s[j][e];
                o[j][e] *= alpha[e >> 1];
            }
        }
        accumulate_pv(o, s, vs, lane);
        __syncthreads();  // the buffer just read is refilled by the next iteration
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
    store_rows(out + (long)b * T * C + h * kHS, C, o, qt * kTile + warp * 16, T, 1.f / l[0], 1.f / l[1], lane);
    if ((lane & 3) == 0) {
        const float scale = 1.f / sqrtf((float)kHS);
        float* lse_bh = lse + ((long)b * NH + h) * T;
        if (row < T) lse_bh[row] = m[0] * scale + logf(l[0]);
        if (row + 8 < T) lse_bh[row + 8] = m[1] * scale + logf(l[1]);
    }
}

// ---------------------------------------------------------------- backward
// D[b, h, t] = sum_d dout * out over the head's 64 values: 8 threads per (token, head), 16 bytes each.
__global__ void attention_rowdot_kernel(float* D, const bf16* dout, const bf16* out, int B, int T, int NH) {
    const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    const bool valid = idx < (long)B * T * NH * 8;
    float sum = 0.f;
    if (valid) {
        const Packed128<bf16> a = load128cs(dout + idx * 8), o = load128cs(out + idx * 8);
#pragma unroll
        for (int i = 0; i < 8; i++) sum += __bfloat162float(a[i]) * __bfloat162float(o[i]);
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    sum += __shfl_xor_sync(0xffffffffu, sum, 4);
    if (valid && (idx & 7) == 0) {
        const long bth = idx / 8;  // (b * T + t) * NH + h
        const int h = (int)(bth % NH);
        const long bt = bth / NH;
        const long b = bt / T, t = bt % T;
        D[(b * NH + h) * T + t] = sum;
    }
}

// dk, dv of one key tile: every query tile from the diagonal on contributes.
__global__ void __launch_bounds__(kThreads) flash_backward_dkdv_kernel(bf16* dqkv, const bf16* dout,
                                                                       const bf16* qkv, const float* lse,
                                                                       const float* D, int T, int NH) {
    __shared__ __align__(16) bf16 q_s[2][kTile * kStride];
    __shared__ __align__(16) bf16 do_s[2][kTile * kStride];
    __shared__ float lse_s[2][kTile], d_s[2][kTile];
    const int kt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;  // low key tiles see the most queries: first
    const int n_tiles = gridDim.x;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int C = NH * kHS;
    const long stride = 3L * C;
    const bf16* q_g = qkv + (long)b * T * stride + h * kHS;
    const bf16* do_g = dout + (long)b * T * C + h * kHS;
    const float* lse_g = lse + ((long)b * NH + h) * T;
    const float* d_g = D + ((long)b * NH + h) * T;
    const float scale = 1.f / sqrtf((float)kHS), sl2 = scale * kLog2e;

    // this warp's 16 keys as A operands (k and v rows), through the q/dout buffers of stage 1
    load_tile_async(q_s[1], q_g + C, kt * kTile, T, stride);
    load_tile_async(do_s[1], q_g + 2 * C, kt * kTile, T, stride);
    cp_async_commit();
    auto load_query_tile = [&](int qt, int st) {
        load_tile_async(q_s[st], q_g, qt * kTile, T, stride);
        load_tile_async(do_s[st], do_g, qt * kTile, T, C);
        for (int i = threadIdx.x; i < kTile; i += kThreads) {
            const int t = qt * kTile + i;
            lse_s[st][i] = t < T ? lse_g[t] * kLog2e : INFINITY;  // rows >= T: P = 0
            d_s[st][i] = t < T ? d_g[t] : 0.f;
        }
    };
    load_query_tile(kt, 0);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    uint32_t ka[4][4], va[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        load_a(ka[kk], q_s[1], warp * 16, 16 * kk, lane);
        load_a(va[kk], do_s[1], warp * 16, 16 * kk, lane);
    }
    __syncthreads();  // stage 1 is free again

    float dk[8][4] = {}, dv[8][4] = {};
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
        const bf16* qs = q_s[st];
        const bf16* dos = do_s[st];

        float p[8][4], dp[8][4];  // transposed: rows are keys, columns queries
        scores(p, ka, qs, lane);
        scores(dp, va, dos, lane);
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int c = 8 * j + 2 * (lane & 3) + (e & 1);
                const int query = qt * kTile + c;
                float pv = exp2f(fmaf(p[j][e], sl2, -lse_s[st][c]));
                if (query < key + 8 * (e >> 1)) pv = 0.f;
                p[j][e] = pv;
                dp[j][e] = pv * (dp[j][e] - d_s[st][c]);
            }
        accumulate_pv(dv, p, dos, lane);
        accumulate_pv(dk, dp, qs, lane);
        __syncthreads();
    }
    const int row0 = kt * kTile + warp * 16;
    bf16* dk_g = dqkv + (long)b * T * stride + C + h * kHS;
    store_rows(dk_g, stride, dk, row0, T, scale, scale, lane);
    store_rows(dk_g + C, stride, dv, row0, T, 1.f, 1.f, lane);
}

// dq of one query tile: every key tile up to the diagonal contributes.
__global__ void __launch_bounds__(kThreads) flash_backward_dq_kernel(bf16* dqkv, const bf16* dout,
                                                                     const bf16* qkv, const float* lse,
                                                                     const float* D, int T, int NH) {
    __shared__ __align__(16) bf16 k_s[2][kTile * kStride];
    __shared__ __align__(16) bf16 v_s[2][kTile * kStride];
    const int qt = reversed_tile(), h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int C = NH * kHS;
    const long stride = 3L * C;
    const bf16* q_g = qkv + (long)b * T * stride + h * kHS;
    const bf16* k_g = q_g + C;
    const bf16* v_g = q_g + 2 * C;
    const bf16* do_g = dout + (long)b * T * C + h * kHS;
    const float scale = 1.f / sqrtf((float)kHS), sl2 = scale * kLog2e;

    // this warp's 16 queries and their dout rows as A operands, through the buffers of stage 1
    load_tile_async(k_s[1], q_g, qt * kTile, T, stride);
    load_tile_async(v_s[1], do_g, qt * kTile, T, C);
    cp_async_commit();
    load_tile_async(k_s[0], k_g, 0, T, stride);
    load_tile_async(v_s[0], v_g, 0, T, stride);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    uint32_t qa[4][4], doa[4][4];
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        load_a(qa[kk], k_s[1], warp * 16, 16 * kk, lane);
        load_a(doa[kk], v_s[1], warp * 16, 16 * kk, lane);
    }
    __syncthreads();

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

    float dq[8][4] = {};
    for (int kt = 0; kt <= qt; kt++) {
        if (kt < qt) {
            load_tile_async(k_s[(kt + 1) & 1], k_g, (kt + 1) * kTile, T, stride);
            load_tile_async(v_s[(kt + 1) & 1], v_g, (kt + 1) * kTile, T, stride);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16* ks = k_s[kt & 1];
        const bf16* vs = v_s[kt & 1];

        float p[8][4], dp[8][4];
        scores(p, qa, ks, lane);
        scores(dp, doa, vs, lane);
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int key = kt * kTile + 8 * j + 2 * (lane & 3) + (e & 1);
                float pv = exp2f(fmaf(p[j][e], sl2, -lse2[e >> 1]));
                if (key > row + 8 * (e >> 1)) pv = 0.f;
                dp[j][e] = pv * (dp[j][e] - drow[e >> 1]);
            }
        accumulate_pv(dq, dp, ks, lane);
        __syncthreads();
    }
    store_rows(dqkv + (long)b * T * stride + h * kHS, stride, dq, qt * kTile + warp * 16, T, scale, scale, lane);
}

void check_shape(int B, int T, int NH, int HS) {
    if (HS != kHS)
        throw Error("attention: head size " + std::to_string(HS) + " is not supported (the kernels need HS = 64)");
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

Attention::Attention(bool prefer_cudnn) : impl_(new Impl) {
#ifdef CODAGPT_HAVE_CUDNN
    if (prefer_cudnn && CudnnAttention::available()) impl_->cudnn = new CudnnAttention();
#else
    (void)prefer_cudnn;
#endif
}

Attention::~Attention() {
#ifdef CODAGPT_HAVE_CUDNN
    delete impl_->cudnn;
#endif
    cudaFree(impl_->rowdot);
    delete impl_;
}

const char* Attention::backend() const {
#ifdef CODAGPT_HAVE_CUDNN
    if (impl_->cudnn) return "cudnn";
#endif
    return "flash";
}

void Attention::reserve(int B, int T, int NH, int HS) {
    check_shape(B, T, NH, HS);
#ifdef CODAGPT_HAVE_CUDNN
    if (impl_->cudnn) {
        impl_->cudnn->reserve(B, T, NH, HS);
        return;
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
    const dim3 grid(ceil_div(T, kTile), NH, B);
    flash_forward_kernel<<<grid, kThreads, 0, stream>>>(out, lse, qkv, T, NH);
    CUDA_CHECK_LAUNCH(flash_forward_kernel);
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
    const long groups = (long)B * T * NH * 8;
    attention_rowdot_kernel<<<ceil_div(groups, 256), 256, 0, stream>>>(impl_->rowdot, dout, out, B, T, NH);
    CUDA_CHECK_LAUNCH(attention_rowdot_kernel);
    const dim3 grid(ceil_div(T, kTile), NH, B);
    flash_backward_dkdv_kernel<<<grid, kThreads, 0, stream>>>(dqkv, dout, qkv, lse, impl_->rowdot, T, NH);
    CUDA_CHECK_LAUNCH(flash_backward_dkdv_kernel);
    flash_backward_dq_kernel<<<grid, kThreads, 0, stream>>>(dqkv, dout, qkv, lse, impl_->rowdot, T, NH);
    CUDA_CHECK_LAUNCH(flash_backward_dq_kernel);
}

}  // namespace codagpt
