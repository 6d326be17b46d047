// LayerNorm forward/backward and the residual add.
//
// Both LayerNorm kernels give a row to one warp: each lane issues the 16-byte loads of all its
// vectors of the row (pack i = lane + 32 k, k < V) before the first reduction, so the row is in
// flight at once, and keeps them in registers for the later passes (as bf16: 4 registers a pack),
// so that every row is read from memory once. Warp sums use the xor butterfly: every lane gets the
// same, run-to-run identical value.
//
// The backward pass is one pass over dout and inp: the warp that computes a row's dinp also adds the
// row's dout * xhat and dout into its own dweight/dbias accumulators (fp32, in shared memory, each
// entry touched only by the lane that owns its pack). A persistent grid of blocks owns contiguous
// row chunks; at the end each block adds its warps' accumulators in warp order and writes one
// partial row to scratch, and a last kernel adds the partial rows in chunk order: deterministic
// without atomics, and the partials cost 2 x 8C bytes a block, ~1.6% of the traffic at N = 16384.
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

// weight and bias: read by every row, so through the read-only cache.
__device__ inline Packed128<bf16> load128ldg(const bf16* p) {
    Packed128<bf16> r;
    *reinterpret_cast<int4*>(r.v) = __ldg(reinterpret_cast<const int4*>(p));
    return r;
}

__device__ inline void unpack8(float (&v)[8], float4 lo, float4 hi) {
    v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w;
    v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
}

// Hides the row's registers from the optimizer between two passes over it: otherwise it keeps the fp32
// values of the first pass live for the next (twice the registers of the bf16 row) instead of
// converting the bf16 values again.
template <int V>
__device__ inline void opaque(Packed128<bf16> (&v)[V]) {
#pragma unroll
    for (int k = 0; k < V; k++) {
        int4& q = *reinterpret_cast<int4*>(v[k].v);
        asm volatile("" : "+r"(q.x), "+r"(q.y), "+r"(q.z), "+r"(q.w));
    }
}

// Rows (warps) per block of the forward kernel.
constexpr int kFwdRows = 8;

extern __shared__ __align__(16) unsigned char ln_smem[];

// Needs C <= 256 V. Mean and variance in two passes over the registers (no E[x^2] - mean^2).
template <int V>
__global__ void __launch_bounds__(32 * kFwdRows) layernorm_forward_kernel(bf16* out, float* mean, float* rstd,
                                                                         const bf16* inp, const bf16* weight,
                                                                         const bf16* bias, int N, int C) {
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * kFwdRows + threadIdx.x / 32;
    if (row >= N) return;
    const int CV = C / 8;
    const bf16* x = inp + (long)row * C;
    Packed128<bf16> xv[V];
#pragma unroll
    for (int k = 0; k < V; k++)
        if (lane + 32 * k < CV) xv[k] = load128cs(x + (lane + 32 * k) * 8);
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < V; k++)
        if (lane + 32 * k < CV)
#pragma unroll
            for (int j = 0; j < 8; j++) sum += __bfloat162float(xv[k][j]);
    const float m = warp_sum(sum) / C;
    opaque(xv);
    float var = 0.f;
#pragma unroll
    for (int k = 0; k < V; k++)
        if (lane + 32 * k < CV)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float d = __bfloat162float(xv[k][j]) - m;
                var += d * d;
            }
    const float r = rsqrtf(warp_sum(var) / C + kEps);
    opaque(xv);
    bf16* o = out + (long)row * C;
#pragma unroll
    for (int k = 0; k < V; k++) {
        const int i = lane + 32 * k;
        if (i < CV) {
            const Packed128<bf16> w = load128ldg(weight + i * 8), b = load128ldg(bias + i * 8);
            Packed128<bf16> y;
#pragma unroll
            for (int j = 0; j < 8; j++)
                y[j] = __float2bfloat16((__bfloat162float(xv[k][j]) - m) * r * __bfloat162float(w[j]) +
                                        __bfloat162float(b[j]));
            store128(o + i * 8, y);
        }
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

// Warps per block of the backward kernel (fewer when their accumulators, 8C bytes a warp, would not
// fit in the block's shared memory): 12 for rows over 1024 channels, whose registers (dout and inp
// of the row plus a dinp batch, 4 a pack) would spill under the cap of 16 warps; measured on the
// H200 at C = 1600 (bench/NOTES_layernorm.md).
template <int V>
constexpr int bwd_max_warps() { return V >= 5 ? 12 : 16; }
// dinp packs loaded together in the second pass.
constexpr int kDinpBatch = 4;

// dinp += r * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)),  dxhat = dout * w, xhat = (x - m) r;
// partial[block][0][c] = sum over the block's rows of dout * xhat, partial[block][1][c] = of dout.
// Block b owns rows [b rows, (b+1) rows) and its warp w the rows w, w + warps, ... of them.
// kRowInRegs: C <= 256 V, the row stays in registers between the passes; otherwise the row is taken
// in slices of 256 V channels and the second pass reads them again (from L2, just read).
// Shared memory: per warp, float4 acc[4][C/8]: [dweight lo, dweight hi, dbias lo, dbias hi] of pack i,
// i.e. entry (t, i) holds channels 8i + 4(t % 2) .. +3 of dweight (t < 2) or dbias (t >= 2). A warp
// reads 32 consecutive float4: no bank conflicts.
template <int V, bool kRowInRegs>
__global__ void __launch_bounds__(32 * bwd_max_warps<V>(), 1)
    layernorm_backward_kernel(bf16* dinp, float* partial, const bf16* dout, const bf16* inp, const bf16* weight,
                              const float* mean, const float* rstd, int N, int C, int rows) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const int CV = C / 8;
    float4* acc = reinterpret_cast<float4*>(ln_smem) + (long)warp * 4 * CV;
    for (int i = lane; i < CV; i += 32)
#pragma unroll
        for (int t = 0; t < 4; t++) acc[t * CV + i] = make_float4(0.f, 0.f, 0.f, 0.f);

    const int r0 = blockIdx.x * rows, r1 = min(N, r0 + rows);
    const int slice_end = kRowInRegs ? 1 : CV;  // pass loops below: one slice when the row fits
#pragma unroll 1
    for (int row = r0 + warp; row < r1; row += warps) {
        const long base = (long)row * C;
        const float m = mean[row], r = rstd[row];
        Packed128<bf16> dv[V], xv[V];
        float dxhat_sum = 0.f, dxhat_xhat_sum = 0.f;
        for (int s = 0; s < slice_end; s += 32 * V) {
#pragma unroll
            for (int k = 0; k < V; k++) {
                const int i = s + lane + 32 * k;
                if (i < CV) {
                    dv[k] = kRowInRegs ? load128cs(dout + base + i * 8) : load128(dout + base + i * 8);
                    xv[k] = kRowInRegs ? load128cs(inp + base + i * 8) : load128(inp + base + i * 8);
                }
            }
#pragma unroll
            for (int k = 0; k < V; k++) {
                const int i = s + lane + 32 * k;
                if (i < CV) {
                    const Packed128<bf16> w = load128ldg(weight + i * 8);
#pragma unroll
                    for (int j = 0; j < 8; j++) {
                        const float dxhat = __bfloat162float(dv[k][j]) * __bfloat162float(w[j]);
                        dxhat_sum += dxhat;
                        dxhat_xhat_sum += dxhat * ((__bfloat162float(xv[k][j]) - m) * r);
                    }
                }
            }
        }
        const float dxhat_mean = warp_sum(dxhat_sum) / C, dxhat_xhat_mean = warp_sum(dxhat_xhat_sum) / C;
        opaque(dv);
        opaque(xv);
        for (int s = 0; s < slice_end; s += 32 * V) {
            if (!kRowInRegs) {
#pragma unroll
                for (int k = 0; k < V; k++) {
                    const int i = s + lane + 32 * k;
                    if (i < CV) {
                        dv[k] = load128(dout + base + i * 8);
                        xv[k] = load128(inp + base + i * 8);
                    }
                }
            }
            // dinp is loaded in batches before any of the batch is stored: the compiler keeps a load
            // after an earlier store to the same array, so one pack at a time would serialise a
            // memory latency per pack.
#pragma unroll
            for (int k0 = 0; k0 < V; k0 += kDinpBatch) {
                Packed128<bf16> gv[kDinpBatch];
#pragma unroll
                for (int b = 0; b < kDinpBatch; b++) {
                    const int k = k0 + b, i = s + lane + 32 * k;
                    if (k < V && i < CV) gv[b] = load128(dinp + base + i * 8);
                }
#pragma unroll
                for (int b = 0; b < kDinpBatch; b++) {
                    const int k = k0 + b, i = s + lane + 32 * k;
                    if (k < V && i < CV) {
                        const Packed128<bf16> w = load128ldg(weight + i * 8);
                        Packed128<bf16> g = gv[b];
                        float dw[8], db[8];  // channels 8i .. 8i+7
                        unpack8(dw, acc[0 * CV + i], acc[1 * CV + i]);
                        unpack8(db, acc[2 * CV + i], acc[3 * CV + i]);
#pragma unroll
                        for (int j = 0; j < 8; j++) {
                            const float d = __bfloat162float(dv[k][j]);
                            const float xhat = (__bfloat162float(xv[k][j]) - m) * r;
                            const float dxhat = d * __bfloat162float(w[j]);
                            g[j] = __float2bfloat16(__bfloat162float(g[j]) +
                                                    (dxhat - dxhat_mean - xhat * dxhat_xhat_mean) * r);
                            dw[j] += d * xhat;
                            db[j] += d;
                        }
                        acc[0 * CV + i] = make_float4(dw[0], dw[1], dw[2], dw[3]);
                        acc[1 * CV + i] = make_float4(dw[4], dw[5], dw[6], dw[7]);
                        acc[2 * CV + i] = make_float4(db[0], db[1], db[2], db[3]);
                        acc[3 * CV + i] = make_float4(db[4], db[5], db[6], db[7]);
                        store128(dinp + base + i * 8, g);
                    }
                }
            }
        }
    }

    // the block's partial row: its warps' accumulators added in warp order
    __syncthreads();
    const float4* all = reinterpret_cast<const float4*>(ln_smem);
    float* p = partial + (long)blockIdx.x * 2 * C;
    for (int e = threadIdx.x; e < 4 * CV; e += blockDim.x) {
        float4 s = all[e];
#pragma unroll 1
        for (int w = 1; w < warps; w++) {
            const float4 a = all[(long)w * 4 * CV + e];
            s.x += a.x;
            s.y += a.y;
            s.z += a.z;
            s.w += a.w;
        }
        const int t = e / CV, i = e % CV;
        float* dst = p + (t / 2) * C + 8 * i + 4 * (t % 2);
        dst[0] = s.x;
        dst[1] = s.y;
        dst[2] = s.z;
        dst[3] = s.w;
    }
}

// dweight[c] += sum_k partial[k][0][c], dbias[c] += sum_k partial[k][1][c], k in a fixed order: the
// partial rows are read as rows of 2C; in a block of 32 columns, warp y adds the chunks k = y mod 16
// in order, then the 16 warp sums are added in warp order.
constexpr int kReduceCols = 32, kReduceSplit = 16;

__global__ void __launch_bounds__(kReduceCols * kReduceSplit)
    layernorm_backward_reduce_kernel(float* dweight, float* dbias, const float* partial, int chunks, int C) {
    __shared__ float s[kReduceSplit][kReduceCols + 1];
    const int tx = threadIdx.x % kReduceCols, ty = threadIdx.x / kReduceCols;
    const int c = blockIdx.x * kReduceCols + tx;  // column of the 2C-wide partial row
    float sum = 0.f;
    if (c < 2 * C) {
#pragma unroll 4
        for (int k = ty; k < chunks; k += kReduceSplit) sum += partial[(long)k * 2 * C + c];
    }
    s[ty][tx] = sum;
    __syncthreads();
    if (ty != 0 || c >= 2 * C) return;
    float total = 0.f;
#pragma unroll
    for (int y = 0; y < kReduceSplit; y++) total += s[y][tx];
    if (c < C)
        dweight[c] += total;
    else
        dbias[c - C] += total;
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

using BackwardKernel = void (*)(bf16*, float*, const bf16*, const bf16*, const bf16*, const float*, const float*, int,
                                int, int);

// A backward kernel and its most warps a block.
struct BackwardKernelInfo {
    BackwardKernel kernel;
    int max_warps;
};
template <int V, bool kRowInRegs>
BackwardKernelInfo backward_kernel() {
    return {layernorm_backward_kernel<V, kRowInRegs>, bwd_max_warps<V>()};
}

// Rows up to 2048 channels stay in registers; wider ones go in slices of 1024 channels.
BackwardKernelInfo backward_kernel_for(int C) {
    switch (ceil_div(C, 256)) {
        case 1: return backward_kernel<1, true>();
        case 2: return backward_kernel<2, true>();
        case 3: return backward_kernel<3, true>();
        case 4: return backward_kernel<4, true>();
        case 5: return backward_kernel<5, true>();
        case 6: return backward_kernel<6, true>();
        case 7: return backward_kernel<7, true>();
        case 8: return backward_kernel<8, true>();
        default: return backward_kernel<4, false>();
    }
}

// The backward launch for a shape on the current device: as many blocks as fit on the GPU at once
// (but at least a row per warp), each owning `rows` consecutive rows; `chunks` blocks in all, one
// partial row each. A function of (N, C, device) only, so the summation order is fixed for a shape.
struct BackwardPlan {
    BackwardKernel kernel;
    int warps, rows, chunks;
    size_t smem;
};

BackwardPlan backward_plan(int N, int C) {
    BackwardPlan plan;
    const BackwardKernelInfo info = backward_kernel_for(C);
    plan.kernel = info.kernel;
    int dev = 0, sms = 0, smem_optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    const size_t warp_bytes = (size_t)C * 8;  // float4 acc[4][C/8]
    plan.warps = (int)std::max<size_t>(1, std::min<size_t>(info.max_warps, (size_t)smem_optin / warp_bytes));
    plan.smem = plan.warps * warp_bytes;
    CUDA_CHECK(cudaFuncSetAttribute(plan.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)plan.smem));
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, plan.kernel, 32 * plan.warps, plan.smem));
    const int blocks = std::max(1, std::min(sms * std::max(per_sm, 1), ceil_div(N, plan.warps)));
    plan.rows = ceil_div(N, blocks);
    plan.chunks = ceil_div(N, plan.rows);  // <= blocks; every block has at least one row
    return plan;
}

}  // namespace

void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* weight, const bf16* bias,
                       int N, int C, cudaStream_t stream) {
    check_row_shape(N, C, "layernorm_forward");
    if (N == 0) return;
    dispatch_vectors(C, [&](auto v) {
        layernorm_forward_kernel<decltype(v)::value>
            <<<ceil_div(N, kFwdRows), 32 * kFwdRows, 0, stream>>>(out, mean, rstd, inp, weight, bias, N, C);
        CUDA_CHECK_LAUNCH(layernorm_forward_kernel);
    });
}

// Sized for the current device (the block count depends on its multiprocessors).
size_t layernorm_backward_scratch_floats(int N, int C) {
    if (N <= 0 || C <= 0) return 0;
    return (size_t)backward_plan(N, C).chunks * 2 * C;
}

void layernorm_backward(bf16* dinp, float* dweight, float* dbias, float* scratch, const bf16* dout, const bf16* inp,
                        const bf16* weight, const float* mean, const float* rstd, int N, int C, cudaStream_t stream) {
    check_row_shape(N, C, "layernorm_backward");
    if (N == 0) return;
    const BackwardPlan plan = backward_plan(N, C);
    plan.kernel<<<plan.chunks, 32 * plan.warps, plan.smem, stream>>>(dinp, scratch, dout, inp, weight, mean, rstd, N,
                                                                      C, plan.rows);
    CUDA_CHECK_LAUNCH(layernorm_backward_kernel);
    layernorm_backward_reduce_kernel<<<ceil_div(2L * C, kReduceCols), kReduceCols * kReduceSplit, 0, stream>>>(
        dweight, dbias, scratch, plan.chunks, C);
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
