#include "coda_kernels.cuh"

#include <algorithm>
#include <type_traits>

#include "coda_programs.cuh"
#include "gemm_epilogue.cuh"  // detail::shfl_xor

namespace codagpt {

namespace {

// A fold block: 32 threads (8 columns each: kFoldVec), or 8 columns of W^T, by 8 slices of k
constexpr int kFoldColThreads = 32, kFoldSplit = 8, kFoldVec = 8;
// A W~ block (fold_weight_kernel): 128 threads along a row, 8 elements each where rows allow
constexpr int kFoldWeightThreads = 128;
constexpr int kThreads = 256;

// A folded weight, W~_kj = bf16(gamma_k W_kj): the one rounding of it, in the fold kernels (whose
// c sums these values) and in the kernel that writes W~ for the GEMM, so the two agree bit for bit.
__device__ __forceinline__ bf16 folded_weight(float gamma_k, float w_kj) { return __float2bfloat16(gamma_k * w_kj); }
// Row finalize kernels: a group of `lanes` threads a row (a warp where a row has more than 16
// partials: the LM head's rows have 393, which with a thread a row took the loss 0.21-0.24 ms;
// fewer lanes where it has fewer: 8 for 350M's residual rows), kRowThreads threads a block.
constexpr int kRowThreads = 128;
int row_lanes(int n_tiles) {
    int lanes = 1;
    while (lanes < n_tiles && lanes < coda::kRowLanes) lanes *= 2;
    return lanes;
}

// Row i's partials (i = -1: none), merged by `lanes` consecutive threads of a warp (a power of two,
// at least the partials a row unless 32) in coda::merge_row's order: the group's first lane
// returns the row's state (the others partial states of the tree). With fewer than 32 lanes the
// merge's lanes from `lanes` on have no partial, and combining an empty state changes nothing (but
// the sign of a zero sum): merge_row's state.
template <class R>
__device__ R merge_row_group(const float* partials, int i, int n_tiles, int lanes) {
    static_assert(coda::kRowLanes == 32, "a lane of the row merge per lane of a warp");
    R mine = i >= 0 ? coda::merge_row_lane<R>(partials, i, threadIdx.x % lanes, n_tiles) : R{};
    for (int m = lanes / 2; m >= 1; m /= 2) mine.combine(coda::detail::shfl_xor(mine, m));
    return mine;
}
// The row of this thread's group (a block's groups take consecutive rows; blocks from
// first_block on), -1 past the last; the group's first thread writes the results.
__device__ int group_row(int rows, int lanes, int first_block = 0) {
    const int i = (blockIdx.x - first_block) * (blockDim.x / lanes) + threadIdx.x / lanes;
    return i < rows ? i : -1;
}
__device__ bool group_writes(int i, int lanes) { return i >= 0 && threadIdx.x % lanes == 0; }

// Row-major W [K, N], N a multiple of 8: thread (tx, ty) folds the 8 columns from
// j0 = 8 (32 blockIdx.x + tx) over k = ty, ty + 8, ... with 16-byte loads, a warp 512 consecutive
// bytes a k (the qkv and fc folds of a 1.5B step, W~ stored too, 0.98 ms; with a thread a column,
// 64 bytes a warp, 1.78); thread t of the block then adds column t's 8 slices in slice order.
__global__ void __launch_bounds__(kFoldColThreads* kFoldSplit)
    fold_layernorm_rows_kernel(float* c, float* c_bwd, float* b_folded, const bf16* w, const float* gamma,
                               const float* beta, const float* b, int K, int N) {
    constexpr int kBlockCols = kFoldColThreads * kFoldVec;
    __shared__ float s_c[kFoldSplit][kBlockCols], s_cb[kFoldSplit][kBlockCols], s_b[kFoldSplit][kBlockCols];
    const int tx = threadIdx.x % kFoldColThreads, ty = threadIdx.x / kFoldColThreads, layer = blockIdx.y;
    const int j0 = blockIdx.x * kBlockCols + tx * kFoldVec;
    const long wofs = (long)layer * K * N;
    gamma += (long)layer * K, beta += (long)layer * K;
    float sum_c[kFoldVec] = {}, sum_cb[kFoldVec] = {}, sum_b[kFoldVec] = {};
    if (j0 < N)
        for (int k = ty; k < K; k += kFoldSplit) {
            const uint4 in = *reinterpret_cast<const uint4*>(w + wofs + (long)k * N + j0);
            const bf16* w_k = reinterpret_cast<const bf16*>(&in);
            const float gamma_k = gamma[k], beta_k = beta[k];
#pragma unroll
            for (int v = 0; v < kFoldVec; v++) {
                const float w_kj = __bfloat162float(w_k[v]);
                sum_c[v] += __bfloat162float(folded_weight(gamma_k, w_kj));  // the W~ the GEMM multiplies by
                sum_cb[v] = fmaf(gamma_k, w_kj, sum_cb[v]);
                sum_b[v] = fmaf(beta_k, w_kj, sum_b[v]);
            }
        }
#pragma unroll
    for (int v = 0; v < kFoldVec; v++) {
        s_c[ty][tx * kFoldVec + v] = sum_c[v];
        s_cb[ty][tx * kFoldVec + v] = sum_cb[v];
        s_b[ty][tx * kFoldVec + v] = sum_b[v];
    }
    __syncthreads();
    const int t = threadIdx.x, j = blockIdx.x * kBlockCols + t;
    if (j < N) {
        float col_c = s_c[0][t], col_cb = s_cb[0][t], col_b = s_b[0][t];
        for (int sl = 1; sl < kFoldSplit; sl++) col_c += s_c[sl][t], col_cb += s_cb[sl][t], col_b += s_b[sl][t];
        c[(long)layer * N + j] = col_c;
        c_bwd[(long)layer * N + j] = col_cb;
        b_folded[(long)layer * N + j] = col_b + (b ? b[(long)layer * N + j] : 0.f);
    }
}

// W stored as W^T [N, K]: warp ty sums column j = 8 * blockIdx.x + ty (a contiguous row of W^T)
// with its lanes over k, then an xor butterfly (a fixed order).
__global__ void __launch_bounds__(32 * kFoldSplit)
    fold_layernorm_transposed_kernel(float* c, float* c_bwd, float* b_folded, const bf16* w, const float* gamma,
                                     const float* beta, const float* b, int K, int N) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, layer = blockIdx.y;
    const int j = blockIdx.x * kFoldSplit + warp;
    if (j >= N) return;
    const long row = (long)layer * K * N + (long)j * K;
    gamma += (long)layer * K, beta += (long)layer * K;
    float sum_c = 0.f, sum_cb = 0.f, sum_b = 0.f;
    for (int k = lane; k < K; k += 32) {
        const float w_kj = __bfloat162float(w[row + k]);
        sum_c += __bfloat162float(folded_weight(gamma[k], w_kj));
        sum_cb = fmaf(gamma[k], w_kj, sum_cb);
        sum_b = fmaf(beta[k], w_kj, sum_b);
    }
    for (int mask = 1; mask < 32; mask *= 2) {
        sum_c += __shfl_xor_sync(0xffffffffu, sum_c, mask);
        sum_cb += __shfl_xor_sync(0xffffffffu, sum_cb, mask);
        sum_b += __shfl_xor_sync(0xffffffffu, sum_b, mask);
    }
    if (lane == 0) {
        c[(long)layer * N + j] = sum_c;
        c_bwd[(long)layer * N + j] = sum_cb;
        b_folded[(long)layer * N + j] = sum_b + (b ? b[(long)layer * N + j] : 0.f);
    }
}

// W~ = diag(gamma) W of one layer, stored as w is: rows x cols, gamma indexing the rows (W [K, N])
// or the columns (W^T [N, K]). Block (x, y) takes the kVec-element vectors of row y (+ gridDim.y
// ...) from x kFoldWeightThreads kVec on: 16-byte loads and stores where kVec is 8.
template <int kVec>
__global__ void __launch_bounds__(kFoldWeightThreads)
    fold_weight_kernel(bf16* w_folded, const bf16* w, const float* gamma, int rows, int cols, bool gamma_of_column) {
    using Vec = std::conditional_t<kVec == 8, uint4, bf16>;
    static_assert(sizeof(Vec) == kVec * sizeof(bf16), "a vector of kVec bf16");
    for (int r = blockIdx.y; r < rows; r += gridDim.y)
        for (int j = (blockIdx.x * kFoldWeightThreads + threadIdx.x) * kVec; j < cols;
             j += gridDim.x * kFoldWeightThreads * kVec) {
            const long at = (long)r * cols + j;
            const Vec in = *reinterpret_cast<const Vec*>(w + at);
            Vec out;
            const bf16* w_r = reinterpret_cast<const bf16*>(&in);
            bf16* folded = reinterpret_cast<bf16*>(&out);
#pragma unroll
            for (int v = 0; v < kVec; v++)
                folded[v] = folded_weight(gamma[gamma_of_column ? j + v : r], __bfloat162float(w_r[v]));
            *reinterpret_cast<Vec*>(w_folded + at) = out;
        }
}

__global__ void widen_kernel(float* dst, const bf16* src, long n) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}

__global__ void finalize_row_stats_kernel(float* mu, float* rstd, const float* partials, int M, int n_tiles, int lanes) {
    const int i = group_row(M, lanes);
    const coda::RowStats s = coda::row_stats_of(merge_row_group<coda::Welford>(partials, i, n_tiles, lanes));
    if (group_writes(i, lanes)) mu[i] = s.mu, rstd[i] = s.rstd;
}

__global__ void finalize_loss_kernel(float* lse, float* loss, const float* partials, const float* target_logit, int M,
                                  int n_tiles, int lanes) {
    const int i = group_row(M, lanes);
    const coda::MaxSumExp z = merge_row_group<coda::MaxSumExp>(partials, i, n_tiles, lanes);
    if (!group_writes(i, lanes)) return;
    const coda::TokenLoss t = coda::token_loss_of(z, target_logit[i]);
    lse[i] = t.lse, loss[i] = t.loss;
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
    coda::Sum total[kArrays] = {};
    if (j < N) coda::merge_col_groups<coda::Sum, kArrays>(partials, j, g, n_tiles, N, total);
#pragma unroll
    for (int a = 0; a < kArrays; a++) groups[a][g][c] = total[a];
    __syncthreads();
#pragma unroll
    for (int a = 0; a < kArrays; a++)
        sum[a] = g == 0 ? coda::combine_col_groups<coda::Sum>([&](int h) { return groups[a][h][c]; }).s : 0.f;
}

// Blocks 0 .. col_blocks-1 take kColsPerBlock columns each (none where there is no bias gradient),
// the others the rows (`lanes` threads each): the column blocks, with the most work, start first.
__global__ void finalize_fold_gradient_kernel(float* m1, float* m2, float* bias_grad, const float* m1_partials,
                                              const float* m2_partials, const float* db_partials, int M, int N, int K,
                                              int tiles_n, int tiles_m, int col_blocks, int lanes) {
    if ((int)blockIdx.x >= col_blocks) {
        const int i = group_row(M, lanes, col_blocks);
        const float s1 = coda::row_sum_of(merge_row_group<coda::Sum>(m1_partials, i, tiles_n, lanes), 1.f / K);
        const float s2 = coda::row_sum_of(merge_row_group<coda::Sum>(m2_partials, i, tiles_n, lanes), 1.f / K);
        if (group_writes(i, lanes)) m1[i] = s1, m2[i] = s2;
        return;
    }
    const int j0 = blockIdx.x * kColsPerBlock, j = j0 + threadIdx.x;
    float sums[1];
    block_col_sums<1>({db_partials}, j0, tiles_m, N, sums);
    if ((int)threadIdx.x < kColsPerBlock && j < N) bias_grad[j] += sums[0];
}

__global__ void finalize_ln_backward_kernel(float* bias_grad, float* dgamma, float* dbeta, const float* bias_partials,
                                            const float* dgamma_partials, const float* dbeta_partials, int N, int n_tiles) {
    const int j0 = blockIdx.x * kColsPerBlock, j = j0 + threadIdx.x;
    float sums[3];
    block_col_sums<3>({bias_partials, dgamma_partials, dbeta_partials}, j0, n_tiles, N, sums);
    if ((int)threadIdx.x >= kColsPerBlock || j >= N) return;
    if (bias_grad) bias_grad[j] += sums[0];
    dgamma[j] += sums[1], dbeta[j] += sums[2];
}

}  // namespace

void coda_fold_layernorm(float* c, float* c_bwd, float* b_folded, const bf16* w, bool transposed, const float* gamma,
                         const float* beta, const float* b, int K, int N, int layers, cudaStream_t stream) {
    if (transposed) {
        fold_layernorm_transposed_kernel<<<dim3(ceil_div(N, kFoldSplit), layers), 32 * kFoldSplit, 0, stream>>>(
            c, c_bwd, b_folded, w, gamma, beta, b, K, N);
        CUDA_CHECK_LAUNCH(fold_layernorm_transposed_kernel);
    } else {
        if (N % kFoldVec != 0 || reinterpret_cast<uintptr_t>(w) % 16 != 0)
            throw Error("coda_fold_layernorm: N = " + std::to_string(N) +
                        " must be a multiple of 8 and the weight pointer 16-byte aligned");
        const dim3 grid(ceil_div(N, kFoldColThreads * kFoldVec), layers);
        fold_layernorm_rows_kernel<<<grid, kFoldColThreads * kFoldSplit, 0, stream>>>(c, c_bwd, b_folded, w, gamma,
                                                                                      beta, b, K, N);
        CUDA_CHECK_LAUNCH(fold_layernorm_rows_kernel);
    }
}

void coda_fold_weight(bf16* w_folded, const bf16* w, bool transposed, const float* gamma, int K, int N,
                      cudaStream_t stream) {
    const int rows = transposed ? N : K, cols = transposed ? K : N;
    const bool vectors = cols % 8 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(w_folded) % 16 == 0;
    const int vec = vectors ? 8 : 1;
    const dim3 grid(ceil_div(ceil_div(cols, vec), kFoldWeightThreads), std::min(rows, 65535));
    if (vectors)
        fold_weight_kernel<8><<<grid, kFoldWeightThreads, 0, stream>>>(w_folded, w, gamma, rows, cols, transposed);
    else
        fold_weight_kernel<1><<<grid, kFoldWeightThreads, 0, stream>>>(w_folded, w, gamma, rows, cols, transposed);
    CUDA_CHECK_LAUNCH(fold_weight_kernel);
}

void coda_widen(float* dst, const bf16* src, long n, cudaStream_t stream) {
    widen_kernel<<<std::min(ceil_div(n, kThreads), 1024), kThreads, 0, stream>>>(dst, src, n);
    CUDA_CHECK_LAUNCH(widen_kernel);
}

void coda_row_stats(float* mu, float* rstd, const float* partials, int M, int n_tiles, cudaStream_t stream) {
    const int lanes = row_lanes(n_tiles);
    finalize_row_stats_kernel<<<ceil_div(M, kRowThreads / lanes), kRowThreads, 0, stream>>>(mu, rstd, partials, M, n_tiles,
                                                                                          lanes);
    CUDA_CHECK_LAUNCH(finalize_row_stats_kernel);
}

void coda_token_loss(float* lse, float* loss, const float* partials, const float* target_logit, int M, int n_tiles,
                     cudaStream_t stream) {
    const int lanes = row_lanes(n_tiles);
    finalize_loss_kernel<<<ceil_div(M, kRowThreads / lanes), kRowThreads, 0, stream>>>(lse, loss, partials, target_logit, M,
                                                                                     n_tiles, lanes);
    CUDA_CHECK_LAUNCH(finalize_loss_kernel);
}

void coda_fold_gradient_finalize(float* m1, float* m2, float* bias_grad, const float* m1_partials,
                                 const float* m2_partials, const float* db_partials, int M, int N, int K, int tiles_n,
                                 int tiles_m, cudaStream_t stream) {
    const int col_blocks = bias_grad ? ceil_div(N, kColsPerBlock) : 0, lanes = row_lanes(tiles_n);
    finalize_fold_gradient_kernel<<<col_blocks + ceil_div(M, kThreads / lanes), kThreads, 0, stream>>>(
        m1, m2, bias_grad, m1_partials, m2_partials, db_partials, M, N, K, tiles_n, tiles_m, col_blocks, lanes);
    CUDA_CHECK_LAUNCH(finalize_fold_gradient_kernel);
}

void coda_ln_backward_finalize(float* bias_grad, float* dgamma, float* dbeta, const float* bias_partials,
                               const float* dgamma_partials, const float* dbeta_partials, int N, int n_tiles,
                               cudaStream_t stream) {
    finalize_ln_backward_kernel<<<ceil_div(N, kColsPerBlock), kThreads, 0, stream>>>(
        bias_grad, dgamma, dbeta, bias_partials, dgamma_partials, dbeta_partials, N, n_tiles);
    CUDA_CHECK_LAUNCH(finalize_ln_backward_kernel);
}

}  // namespace codagpt
