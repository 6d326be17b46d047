// Bias gradient: column sums of dout [M, N], without atomics. Blocks own (256-column tile, row chunk)
// tiles; in a block, 8 row groups of 32 lanes x 8 columns walk the chunk's rows in order, the groups
// are added in order through shared memory, and the per-chunk partials go to scratch; a second kernel
// adds the partials of each column in chunk order. The chunking is a function of (M, N) alone, so a
// shape always sums in the same order: bit-identical results run to run.
#include "bias.cuh"

#include <algorithm>
#include <string>

namespace codagpt {

namespace {

constexpr int kColTile = 256, kRowGroups = 8;

// Rows per chunk: about 512 blocks in all whatever the shape, so that the GPU is filled.
int chunk_rows(int M, int N) {
    const int col_tiles = ceil_div(N, kColTile);
    const int chunks = std::max(1, std::min(ceil_div(M, kRowGroups), ceil_div(512, col_tiles)));
    return ceil_div(M, chunks);
}

__global__ void __launch_bounds__(kColTile) bias_backward_partials_kernel(float* partial, const bf16* dout, int M,
                                                                         int N, int rows) {
    __shared__ float s[kRowGroups][kColTile];
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    const int c = blockIdx.x * kColTile + tx * 8;
    const int r0 = blockIdx.y * rows, r1 = min(M, r0 + rows);
    float acc[8] = {};
    if (c < N) {
        for (int row = r0 + ty; row < r1; row += kRowGroups) {
            const Packed128<bf16> d = load128(dout + (long)row * N + c);
#pragma unroll
            for (int j = 0; j < 8; j++) acc[j] += __bfloat162float(d[j]);
        }
    }
#pragma unroll
    for (int j = 0; j < 8; j++) s[ty][tx * 8 + j] = acc[j];
    __syncthreads();
    // thread t now owns column t of the tile: add the row groups in order
    const int t = threadIdx.x, col = blockIdx.x * kColTile + t;
    if (col >= N) return;
    float sum = 0.f;
#pragma unroll
    for (int g = 0; g < kRowGroups; g++) sum += s[g][t];
    partial[(long)blockIdx.y * N + col] = sum;
}

__global__ void bias_backward_reduce_kernel(float* dbias, const float* partial, int chunks, int N) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= N) return;
    float sum = 0.f;
    for (int k = 0; k < chunks; k++) sum += partial[(long)k * N + c];
    dbias[c] += sum;
}

}  // namespace

size_t bias_backward_scratch_floats(int M, int N) {
    if (M <= 0 || N <= 0) return 0;
    return (size_t)ceil_div(M, chunk_rows(M, N)) * N;
}

void bias_backward(float* dbias, float* scratch, const bf16* dout, int M, int N, cudaStream_t stream) {
    if (M < 0 || N <= 0 || N % 8 != 0)
        throw Error("bias_backward: needs N a positive multiple of 8 (16-byte vectors) and M >= 0, got M=" +
                    std::to_string(M) + " N=" + std::to_string(N));
    if (M == 0) return;
    const int rows = chunk_rows(M, N), chunks = ceil_div(M, rows);
    bias_backward_partials_kernel<<<dim3(ceil_div(N, kColTile), chunks), kColTile, 0, stream>>>(scratch, dout, M, N,
                                                                                                 rows);
    CUDA_CHECK_LAUNCH(bias_backward_partials_kernel);
    bias_backward_reduce_kernel<<<ceil_div(N, 256), 256, 0, stream>>>(dbias, scratch, chunks, N);
    CUDA_CHECK_LAUNCH(bias_backward_reduce_kernel);
}

}  // namespace codagpt
