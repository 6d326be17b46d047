#include "coda_kernels.cuh"

#include <algorithm>
#include "coda_programs.cuh"
#include "gemm_epilogue.cuh"  // detail::shfl_xor, detail::pick

namespace codagpt {

namespace {

constexpr int kFoldCols = 32, kFoldSplit = 8;  // a fold block: 32 columns (or 8), 8 slices of k
constexpr int kThreads = 256;
// Row finalize kernels: a warp a row (a row of the LM head has 393 partials: with a thread a row
// the loss took 0.21-0.24 ms), 4 rows a block.
constexpr int kRowThreads = 128, kRowsPerBlock = kRowThreads / 32;

// Row i's partials, merged by the calling warp in coda::merge_row's order; every lane returns the
// state. Rows are whole warps: a warp past the last row returns before calling this.
template <class R>
__device__ R warp_merge_row(const float* partials, int i, int n_tiles) {
    static_assert(coda::kRowLanes == 32, "a lane of the row merge per lane of a warp");
    const int lane = threadIdx.x % 32;
    R mine = coda::merge_row_lane<R>(partials, i, lane, n_tiles);
    for (int m = coda::kRowLanes / 2; m >= 1; m /= 2) {
        const R other = coda::detail::shfl_xor(mine, m);
        const bool upper = lane & m;
        mine = coda::combine_lanes(coda::detail::pick(upper, other, mine), coda::detail::pick(upper, mine, other));
    }
    return mine;
}
// The row this warp finalizes (a block's warps take consecutive rows), -1 past the last.
__device__ int warp_row(int rows) {
    const int i = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    return i < rows ? i : -1;
}

// Row-major W [K, N]: thread (tx, ty) sums column j = 32 * blockIdx.x + tx over k = ty, ty + 8, ...
// (a warp reads 32 consecutive floats per k); the 8 slices are added in slice order.
__global__ void __launch_bounds__(kFoldCols* kFoldSplit)
    fold_layernorm_rows_kernel(bf16* w_folded, float* c, float* b_folded, const bf16* w, const float* gamma,
                               const float* beta, const float* b, int K, int N) {
    __shared__ float s_c[kFoldSplit][kFoldCols], s_b[kFoldSplit][kFoldCols];
    const int tx = threadIdx.x % kFoldCols, ty = threadIdx.x / kFoldCols, layer = blockIdx.y;
    const int j = blockIdx.x * kFoldCols + tx;
    const long wofs = (long)layer * K * N;
    gamma += (long)layer * K, beta += (long)layer * K;
    float sum_c = 0.f, sum_b = 0.f;
    if (j < N)
        for (int k = ty; k < K; k += kFoldSplit) {
            const float w_kj = __bfloat162float(w[wofs + (long)k * N + j]);
            const bf16 folded = __float2bfloat16(gamma[k] * w_kj);
            w_folded[wofs + (long)k * N + j] = folded;
            sum_c += __bfloat162float(folded);  // c from the bf16 W~ the GEMM multiplies by
            sum_b = fmaf(beta[k], w_kj, sum_b);
        }
    s_c[ty][tx] = sum_c;
    s_b[ty][tx] = sum_b;
    __syncthreads();
    if (ty == 0 && j < N) {
        for (int s = 1; s < kFoldSplit; s++) sum_c += s_c[s][tx], sum_b += s_b[s][tx];
        c[(long)layer * N + j] = sum_c;
        b_folded[(long)layer * N + j] = sum_b + (b ? b[(long)layer * N + j] : 0.f);
    }
}

// W stored as W^T [N, K]: warp ty sums column j = 8 * blockIdx.x + ty (a contiguous row of W^T)
// with its lanes over k, then an xor butterfly (a fixed order).
__global__ void __launch_bounds__(32 * kFoldSplit)
    fold_layernorm_transposed_kernel(bf16* w_folded, float* c, float* b_folded, const bf16* w, const float* gamma,
                                     const float* beta, const float* b, int K, int N) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, layer = blockIdx.y;
    const int j = blockIdx.x * kFoldSplit + warp;
    if (j >= N) return;
    const long row = (long)layer * K * N + (long)j * K;
    gamma += (long)layer * K, beta += (long)layer * K;
    float sum_c = 0.f, sum_b = 0.f;
    for (int k = lane; k < K; k += 32) {
        const float w_kj = __bfloat162float(w[row + k]);
        const bf16 folded = __float2bfloat16(gamma[k] * w_kj);
        w_folded[row + k] = folded;
        sum_c += __bfloat162float(folded);
        sum_b = fmaf(beta[k], w_kj, sum_b);
    }
    for (int mask = 1; mask < 32; mask *= 2) {
        sum_c += __shfl_xor_sync(0xffffffffu, sum_c, mask);
        sum_b += __shfl_xor_sync(0xffffffffu, sum_b, mask);
    }
    if (lane == 0) {
        c[(long)layer * N + j] = sum_c;
        b_folded[(long)layer * N + j] = sum_b + (b ? b[(long)layer * N + j] : 0.f);
    }
}

__global__ void widen_kernel(float* dst, const bf16* src, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}

__global__ void finalize_row_stats_kernel(float* mu, float* rstd, const float* partials, int M, int n_tiles) {
    const int i = warp_row(M);
    if (i < 0) return;
    const coda::RowStats s = coda::row_stats_of(warp_merge_row<coda::Welford>(partials, i, n_tiles));
    if (threadIdx.x % 32 == 0) mu[i] = s.mu, rstd[i] = s.rstd;
}

__global__ void finalize_loss_kernel(float* lse, float* loss, const float* partials, const float* target_logit, int M,
                                  int n_tiles) {
    const int i = warp_row(M);
    if (i < 0) return;
    const coda::TokenLoss t = coda::token_loss_of(warp_merge_row<coda::MaxSumExp>(partials, i, n_tiles), target_logit[i]);
    if (threadIdx.x % 32 == 0) lse[i] = t.lse, loss[i] = t.loss;
}

// Column sums of partials [n_tiles, N] for the block's kColsPerBlock columns from j0, in
// coda::merge_col's order: thread (c, g) merges group g of column j0 + c, then thread (c, 0)
// combines the groups in order. Returns the sum in the threads with g = 0 (0 elsewhere).
constexpr int kColsPerBlock = kThreads / coda::kColGroups;
template <int kArrays>
__device__ void block_col_sums(const float* const (&partials)[kArrays], int j0, int n_tiles, int N,
                               float (&sum)[kArrays]) {
    __shared__ coda::Sum groups[kArrays][coda::kColGroups][kColsPerBlock];
    const int c = threadIdx.x % kColsPerBlock, g = threadIdx.x / kColsPerBlock, j = j0 + c;
#pragma unroll
    for (int a = 0; a < kArrays; a++)
        groups[a][g][c] = j < N ? coda::merge_col_group<coda::Sum>(partials[a], j, g, n_tiles, N) : coda::Sum{};
    __syncthreads();
#pragma unroll
    for (int a = 0; a < kArrays; a++)
        sum[a] = g == 0 ? coda::combine_col_groups<coda::Sum>([&](int h) { return groups[a][h][c]; }).s : 0.f;
}

// Blocks 0 .. row_blocks-1 take the rows (a warp each), the others kColsPerBlock columns each.
__global__ void finalize_fold_gradient_kernel(float* m1, float* m2, float* db, float* v, float* bias_grad,
                                     const float* m1_partials, const float* m2_partials, const float* db_partials,
                                     const float* v_partials, int M, int N, int K, int tiles_n, int tiles_m,
                                     int row_blocks) {
    if ((int)blockIdx.x < row_blocks) {
        const int i = warp_row(M);
        if (i < 0) return;
        const float s1 = warp_merge_row<coda::Sum>(m1_partials, i, tiles_n).s;
        const float s2 = warp_merge_row<coda::Sum>(m2_partials, i, tiles_n).s;
        if (threadIdx.x % 32 == 0) m1[i] = (1.f / K) * s1, m2[i] = (1.f / K) * s2;  // finalize_row_sum's
        return;
    }
    const int j0 = (blockIdx.x - row_blocks) * kColsPerBlock, j = j0 + threadIdx.x;
    float sums[2];
    block_col_sums<2>({db_partials, v_partials}, j0, tiles_m, N, sums);
    if ((int)threadIdx.x >= kColsPerBlock || j >= N) return;
    db[j] = sums[0];
    v[j] = sums[1];
    if (bias_grad) bias_grad[j] += sums[0];
}

__global__ void finalize_ln_grads_kernel(float* dgamma, float* dbeta, const float* dgamma_partials, const float* dbeta_partials,
                                int K, int n_tiles) {
    const int k = warp_row(K);
    if (k < 0) return;
    const float g = warp_merge_row<coda::Sum>(dgamma_partials, k, n_tiles).s;
    const float b = warp_merge_row<coda::Sum>(dbeta_partials, k, n_tiles).s;
    if (threadIdx.x % 32 == 0) dgamma[k] += g, dbeta[k] += b;
}

__global__ void finalize_bias_grad_kernel(float* bias_grad, const float* partials, int N, int n_tiles) {
    const int j0 = blockIdx.x * kColsPerBlock, j = j0 + threadIdx.x;
    float sum[1];
    block_col_sums<1>({partials}, j0, n_tiles, N, sum);
    if ((int)threadIdx.x < kColsPerBlock && j < N) bias_grad[j] += sum[0];
}

}  // namespace

void coda_fold_layernorm(bf16* w_folded, float* c, float* b_folded, const bf16* w, bool transposed,
                         const float* gamma, const float* beta, const float* b, int K, int N, int layers,
                         cudaStream_t stream) {
    if (transposed) {
        fold_layernorm_transposed_kernel<<<dim3(ceil_div(N, kFoldSplit), layers), 32 * kFoldSplit, 0, stream>>>(
            w_folded, c, b_folded, w, gamma, beta, b, K, N);
        CUDA_CHECK_LAUNCH(fold_layernorm_transposed_kernel);
    } else {
        fold_layernorm_rows_kernel<<<dim3(ceil_div(N, kFoldCols), layers), kFoldCols * kFoldSplit, 0, stream>>>(
            w_folded, c, b_folded, w, gamma, beta, b, K, N);
        CUDA_CHECK_LAUNCH(fold_layernorm_rows_kernel);
    }
}

void coda_widen(float* dst, const bf16* src, long n, cudaStream_t stream) {
    widen_kernel<<<std::min(ceil_div(n, kThreads), 1024), kThreads, 0, stream>>>(dst, src, n);
    CUDA_CHECK_LAUNCH(widen_kernel);
}

void coda_row_stats(float* mu, float* rstd, const float* partials, int M, int n_tiles, cudaStream_t stream) {
    finalize_row_stats_kernel<<<ceil_div(M, kRowsPerBlock), kRowThreads, 0, stream>>>(mu, rstd, partials, M, n_tiles);
    CUDA_CHECK_LAUNCH(finalize_row_stats_kernel);
}

void coda_token_loss(float* lse, float* loss, const float* partials, const float* target_logit, int M, int n_tiles,
                     cudaStream_t stream) {
    finalize_loss_kernel<<<ceil_div(M, kRowsPerBlock), kRowThreads, 0, stream>>>(lse, loss, partials, target_logit, M, n_tiles);
    CUDA_CHECK_LAUNCH(finalize_loss_kernel);
}

void coda_fold_gradient_finalize(float* m1, float* m2, float* db, float* v, float* bias_grad, const float* m1_partials,
                                 const float* m2_partials, const float* db_partials, const float* v_partials, int M,
                                 int N, int K, int tiles_n, int tiles_m, cudaStream_t stream) {
    const int row_blocks = ceil_div(M, kThreads / 32);
    finalize_fold_gradient_kernel<<<row_blocks + ceil_div(N, kColsPerBlock), kThreads, 0, stream>>>(
        m1, m2, db, v, bias_grad, m1_partials, m2_partials, db_partials, v_partials, M, N, K, tiles_n, tiles_m,
        row_blocks);
    CUDA_CHECK_LAUNCH(finalize_fold_gradient_kernel);
}

void coda_accumulate_ln_grads(float* dgamma, float* dbeta, const float* dgamma_partials, const float* dbeta_partials,
                              int K, int n_tiles, cudaStream_t stream) {
    finalize_ln_grads_kernel<<<ceil_div(K, kRowsPerBlock), kRowThreads, 0, stream>>>(dgamma, dbeta, dgamma_partials, dbeta_partials, K,
                                                                     n_tiles);
    CUDA_CHECK_LAUNCH(finalize_ln_grads_kernel);
}

void coda_accumulate_bias_grad(float* bias_grad, const float* partials, int N, int n_tiles, cudaStream_t stream) {
    finalize_bias_grad_kernel<<<ceil_div(N, kColsPerBlock), kThreads, 0, stream>>>(bias_grad, partials, N, n_tiles);
    CUDA_CHECK_LAUNCH(finalize_bias_grad_kernel);
}

}  // namespace codagpt
