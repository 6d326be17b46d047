// LayerNorm forward/backward and the residual add.
//
// Row kernels (forward, and the dinp part of backward): one warp per row; each lane loads its
// 16-byte vectors of the row at once (V of them: C <= 256 V, for memory-level parallelism), so the
// row is read from memory once; later passes read the warp's copy in shared memory. Warp sums use the xor butterfly: every lane gets the same, run-to-run identical value.
// dweight/dbias are column sums over rows: blocks own (column tile, row chunk) tiles, sum their rows
// in a fixed order, write partials to scratch, and one thread per column adds the partials in chunk
// order: deterministic without atomics.
#include "layernorm.cuh"

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

namespace codagpt {

namespace {

constexpr float kEps = 1e-5f;

__device__ inline float warp_sum(float v) {
#pragma unroll
    for (int k = 16; k > 0; k >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, k);
    return v;
}

// Rows per block of the row kernels: small blocks free their slots as soon as their few rows are
// done. Each warp stages its row(s) in shared memory after the first pass, so that the later passes
// read it from there instead of keeping it live in registers as fp32 (which cost occupancy).
constexpr int kFwdRows = 4, kBwdRows = 2;

extern __shared__ __align__(16) unsigned char ln_smem[];

template <int V>
__global__ void __launch_bounds__(32 * kFwdRows) layernorm_forward_kernel(bf16* out, float* mean, float* rstd,
                                                                         const bf16* inp, const bf16* weight,
                                                                         const bf16* bias, int N, int C) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int row = blockIdx.x * kFwdRows + warp;
    if (row >= N) return;
    const int CV = C / 8;
    Packed128<bf16>* xs = reinterpret_cast<Packed128<bf16>*>(ln_smem) + (long)warp * CV;
    const bf16* x = inp + (long)row * C;
    Packed128<bf16> xv[V];
#pragma unroll
    for (int k = 0; k < V; k++)
        if (lane + 32 * k < CV) xv[k] = load128cs(x + (lane + 32 * k) * 8);
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int i = lane + 32 * k;
        if (i < CV) {
            xs[i] = xv[k];
#pragma unroll
            for (int j = 0; j < 8; j++) sum += __bfloat162float(xv[k][j]);
        }
    }
    const float m = warp_sum(sum) / C;
    __syncwarp();
    float var = 0.f;
    for (int i = lane; i < CV; i += 32) {
        const Packed128<bf16> v = xs[i];
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float d = __bfloat162float(v[j]) - m;
            var += d * d;
        }
    }
    const float r = rsqrtf(warp_sum(var) / C + kEps);
    bf16* o = out + (long)row * C;
    for (int i = lane; i < CV; i += 32) {
        const Packed128<bf16> v = xs[i], w = load128(weight + i * 8), b = load128(bias + i * 8);
        Packed128<bf16> y;
#pragma unroll
        for (int j = 0; j < 8; j++)
            y[j] = __float2bfloat16((__bfloat162float(v[j]) - m) * r * __bfloat162float(w[j]) + __bfloat162float(b[j]));
        store128(o + i * 8, y);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// dinp += r * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),  dxhat = dout * w
template <int V>
__global__ void __launch_bounds__(32 * kBwdRows) layernorm_backward_dinp_kernel(bf16* dinp, const bf16* dout,
                                                                               const bf16* inp, const bf16* weight,
                                                                               const float* mean, const float* rstd,
                                                                               int N, int C) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int row = blockIdx.x * kBwdRows + warp;
    if (row >= N) return;
    const int CV = C / 8;
    Packed128<bf16>* ds = reinterpret_cast<Packed128<bf16>*>(ln_smem) + (long)warp * 2 * CV;
    Packed128<bf16>* xs = ds + CV;
    const long base = (long)row * C;
    const float m = mean[row], r = rstd[row];
    Packed128<bf16> dv[V], xv[V];
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int i = lane + 32 * k;
        if (i < CV) {
            dv[k] = load128cs(dout + base + i * 8);
            xv[k] = load128cs(inp + base + i * 8);
        }
    }
    float dxhat_sum = 0.f, dxhat_xhat_sum = 0.f;
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int i = lane + 32 * k;
        if (i < CV) {
            ds[i] = dv[k];
            xs[i] = xv[k];
            const Packed128<bf16> w = load128(weight + i * 8);
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float dxhat = __bfloat162float(dv[k][j]) * __bfloat162float(w[j]);
                dxhat_sum += dxhat;
                dxhat_xhat_sum += dxhat * (__bfloat162float(xv[k][j]) - m) * r;
            }
        }
    }
    const float dxhat_mean = warp_sum(dxhat_sum) / C, dxhat_xhat_mean = warp_sum(dxhat_xhat_sum) / C;
    __syncwarp();
    for (int i = lane; i < CV; i += 32) {
        const Packed128<bf16> d = ds[i], x = xs[i], w = load128(weight + i * 8);
        Packed128<bf16> g = load128(dinp + base + i * 8);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float xhat = (__bfloat162float(x[j]) - m) * r;
            const float dxhat = __bfloat162float(d[j]) * __bfloat162float(w[j]);
            g[j] = __float2bfloat16(__bfloat162float(g[j]) + (dxhat - dxhat_mean - xhat * dxhat_xhat_mean) * r);
        }
        store128(dinp + base + i * 8, g);
    }
}

// Column tiles of 256 channels (32 lanes x 8), 8 row groups per block; row chunks of `rows` rows.
constexpr int kColTile = 256, kRowGroups = 8;

// Row chunks for the column-sum partials: about 512 blocks in all, whatever the shape, so that the
// GPU is filled; a function of (N, C) only, so the summation order is fixed for a shape.
int row_chunk_rows(int N, int C) {
    const int col_tiles = ceil_div(C, kColTile);
    const int chunks = std::max(1, std::min(ceil_div(N, kRowGroups), ceil_div(512, col_tiles)));
    return ceil_div(N, chunks);
}

// partial[chunk][0][c] = sum over the chunk's rows of dout * xhat, partial[chunk][1][c] = of dout.
__global__ void __launch_bounds__(kColTile) layernorm_backward_partials_kernel(float* partial, const bf16* dout,
                                                                              const bf16* inp, const float* mean,
                                                                              const float* rstd, int N, int C,
                                                                              int rows) {
    __shared__ float s_dw[kRowGroups][kColTile], s_db[kRowGroups][kColTile];
    const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
    const int c = blockIdx.x * kColTile + tx * 8;
    const int r0 = blockIdx.y * rows, r1 = min(N, r0 + rows);
    float dw[8] = {}, db[8] = {};
    if (c < C) {
        for (int row = r0 + ty; row < r1; row += kRowGroups) {
            const long off = (long)row * C + c;
            const Packed128<bf16> d = load128(dout + off), x = load128(inp + off);
            const float m = mean[row], r = rstd[row];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float dj = __bfloat162float(d[j]);
                dw[j] += dj * ((__bfloat162float(x[j]) - m) * r);
                db[j] += dj;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < 8; j++) {
        s_dw[ty][tx * 8 + j] = dw[j];
        s_db[ty][tx * 8 + j] = db[j];
    }
    __syncthreads();
    // thread t now owns column t of the tile: add the row groups in order
    const int t = threadIdx.x, col = blockIdx.x * kColTile + t;
    if (col >= C) return;
    float sw = 0.f, sb = 0.f;
#pragma unroll
    for (int g = 0; g < kRowGroups; g++) {
        sw += s_dw[g][t];
        sb += s_db[g][t];
    }
    float* p = partial + (long)blockIdx.y * 2 * C;
    p[col] = sw;
    p[C + col] = sb;
}

__global__ void layernorm_backward_reduce_kernel(float* dweight, float* dbias, const float* partial, int chunks,
                                                 int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float sw = 0.f, sb = 0.f;
    for (int k = 0; k < chunks; k++) {
        sw += partial[(long)k * 2 * C + c];
        sb += partial[(long)k * 2 * C + C + c];
    }
    dweight[c] += sw;
    dbias[c] += sb;
}

__global__ void residual_forward_kernel(bf16* out, const bf16* a, const bf16* b, long n) {
    const long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i + 8 <= n) {
        const Packed128<bf16> x = load128cs(a + i), y = load128cs(b + i);
        Packed128<bf16> o;
#pragma unroll
        for (int j = 0; j < 8; j++) o[j] = __float2bfloat16(__bfloat162float(x[j]) + __bfloat162float(y[j]));
        store128(out + i, o);
    } else {
        for (long k = i; k < n; k++) out[k] = __float2bfloat16(__bfloat162float(a[k]) + __bfloat162float(b[k]));
    }
}

void check_row_shape(int N, int C, const char* fn) {
    if (N < 0 || C <= 0 || C % 8 != 0 || C > 4096)
        throw Error(std::string(fn) + ": needs C a multiple of 8 in 8..4096 and N >= 0, got N=" + std::to_string(N) +
                    " C=" + std::to_string(C));
}

// Runs f(std::integral_constant<int, V>) with the smallest instantiated V that covers C (C <= 256 V).
template <typename Fn>
void dispatch_vectors(int C, Fn&& f) {
    const int need = ceil_div(C, 256);
    switch (need) {
        case 1: return f(std::integral_constant<int, 1>{});
        case 2: return f(std::integral_constant<int, 2>{});
        case 3: return f(std::integral_constant<int, 3>{});
        case 4: return f(std::integral_constant<int, 4>{});
        case 5: return f(std::integral_constant<int, 5>{});
        case 6: return f(std::integral_constant<int, 6>{});
        case 7: return f(std::integral_constant<int, 7>{});
        case 8: return f(std::integral_constant<int, 8>{});
        case 9: case 10: case 11: case 12: return f(std::integral_constant<int, 12>{});
        default: return f(std::integral_constant<int, 16>{});
    }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* weight, const bf16* bias,
                       int N, int C, cudaStream_t stream) {
    check_row_shape(N, C, "layernorm_forward");
    if (N == 0) return;
    const size_t smem = (size_t)kFwdRows * C * sizeof(bf16);  // <= 32 KiB for C <= 4096
    dispatch_vectors(C, [&](auto v) {
        layernorm_forward_kernel<decltype(v)::value>
            <<<ceil_div(N, kFwdRows), 32 * kFwdRows, smem, stream>>>(out, mean, rstd, inp, weight, bias, N, C);
        CUDA_CHECK_LAUNCH(layernorm_forward_kernel);
    });
}

size_t layernorm_backward_scratch_floats(int N, int C) {
    if (N <= 0 || C <= 0) return 0;
    return (size_t)ceil_div(N, row_chunk_rows(N, C)) * 2 * C;
}

void layernorm_backward(bf16* dinp, float* dweight, float* dbias, float* scratch, const bf16* dout, const bf16* inp,
                        const bf16* weight, const float* mean, const float* rstd, int N, int C, cudaStream_t stream) {
    check_row_shape(N, C, "layernorm_backward");
    if (N == 0) return;
    const size_t smem = (size_t)kBwdRows * 2 * C * sizeof(bf16);  // <= 32 KiB for C <= 4096
    dispatch_vectors(C, [&](auto v) {
        layernorm_backward_dinp_kernel<decltype(v)::value>
            <<<ceil_div(N, kBwdRows), 32 * kBwdRows, smem, stream>>>(dinp, dout, inp, weight, mean, rstd, N, C);
        CUDA_CHECK_LAUNCH(layernorm_backward_dinp_kernel);
    });
    const int rows = row_chunk_rows(N, C), chunks = ceil_div(N, rows);
    const dim3 grid(ceil_div(C, kColTile), chunks);
    layernorm_backward_partials_kernel<<<grid, kColTile, 0, stream>>>(scratch, dout, inp, mean, rstd, N, C, rows);
    CUDA_CHECK_LAUNCH(layernorm_backward_partials_kernel);
    layernorm_backward_reduce_kernel<<<ceil_div(C, 256), 256, 0, stream>>>(dweight, dbias, scratch, chunks, C);
    CUDA_CHECK_LAUNCH(layernorm_backward_reduce_kernel);
}

void residual_forward(bf16* out, const bf16* a, const bf16* b, long n, cudaStream_t stream) {
    if (!aligned16(out) || !aligned16(a) || !aligned16(b))
        throw Error("residual_forward: pointers must be 16-byte aligned");
    if (n <= 0) return;
    residual_forward_kernel<<<ceil_div(ceil_div(n, 8), 256), 256, 0, stream>>>(out, a, b, n);
    CUDA_CHECK_LAUNCH(residual_forward_kernel);
}

}  // namespace codagpt
