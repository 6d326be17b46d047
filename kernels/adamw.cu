// The optimizer step: the global gradient norm (two-stage, fixed-order reduction), the clip
// factor derived from it on the device, and the AdamW update of fp32 master weights kept as their
// bf16 copy and its low halves (master_weights.cuh). Everything here is elementwise or a
// fixed-shape reduction, hence deterministic.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "adamw.cuh"
#include "master_weights.cuh"

namespace codagpt {

namespace {

// ---------------------------------------------------------------- global norm

// The grid is fixed, not sized to the GPU, so that each element always lands in the same
// partial: the same gradients give the same bits on any run.
constexpr int kNormBlocks = 1024;
constexpr int kNormThreads = 512;

// Sum over the block in a fixed tree order; the result is valid in thread 0.
template <int kThreads>
__device__ double block_sum(double x) {
    __shared__ double warp_sums[kThreads / 32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int offset = 16; offset > 0; offset /= 2) x += __shfl_down_sync(0xffffffffu, x, offset);
    if (lane == 0) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        x = lane < kThreads / 32 ? warp_sums[lane] : 0.0;
        for (int offset = 16; offset > 0; offset /= 2) x += __shfl_down_sync(0xffffffffu, x, offset);
    }
    return x;
}

// Squares are accumulated in double: a float squared is exact in double, and ~3000 terms per
// thread at 1.5B parameters would otherwise cost fp32 digits. The memory stream, not the FP64
// units, bounds the kernel (4 bytes in per 1 DFMA).
__global__ void __launch_bounds__(kNormThreads)
    norm_partial_kernel(float* partial, const float* grads, size_t head, size_t packs, size_t n) {
    const size_t tid = (size_t)blockIdx.x * kNormThreads + threadIdx.x;
    const size_t stride = (size_t)kNormBlocks * kNormThreads;
    const float* body = grads + head;  // 16-byte aligned
    double acc = 0.0;
#pragma unroll 4
    for (size_t k = tid; k < packs; k += stride) {
        const Packed128<float> g = load128cs(body + 4 * k);
        for (int j = 0; j < 4; j++) acc = fma((double)g[j], (double)g[j], acc);
    }
    // the (at most 3 + 3) elements before the first and after the last aligned pack
    const size_t tail = head + 4 * packs;
    if (tid < head) acc = fma((double)grads[tid], (double)grads[tid], acc);
    if (tid < n - tail) acc = fma((double)grads[tail + tid], (double)grads[tail + tid], acc);
    const double s = block_sum<kNormThreads>(acc);
    if (threadIdx.x == 0) partial[blockIdx.x] = (float)s;
}

__global__ void __launch_bounds__(kNormBlocks) norm_final_kernel(float* out, const float* partial) {
    const double s = block_sum<kNormBlocks>((double)partial[threadIdx.x]);
    if (threadIdx.x == 0) out[0] = (float)s;
}

__global__ void sum_in_order_kernel(float* out, const float* partials, int n) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += (double)partials[i];
    out[0] = (float)s;
}

// Exact rounding (not the --use_fast_math approximations) so that the factor equals the CPU's
// float(clip / norm) up to the norm's own rounding.
__global__ void clip_scale_kernel(float* grad_scale, float* norm, const float* norm_squared, float clip) {
    const float nrm = __fsqrt_rn(norm_squared[0]);
    if (norm) norm[0] = nrm;
    grad_scale[0] = clip > 0.0f && nrm > clip ? __fdiv_rn(clip, nrm) : 1.0f;
}

// ---------------------------------------------------------------- AdamW

struct AdamWStep {
    float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, eps, weight_decay;
    float bias1, bias2;  // 1 - beta^t, formed in double on the host as the CPU reference does
};

// g <- g * scale;  m <- b1 m + (1-b1) g;  v <- b2 v + (1-b2) g^2;
// p <- p - lr * (m_hat / (sqrt(v_hat) + eps) + wd * p)      (decoupled weight decay)
// The order of operations is the CPU reference's (optim_cpu.cpp), with exact division and sqrt.
__device__ inline void adamw_element(float& p, float& m, float& v, float g, const AdamWStep& a, float scale) {
    g *= scale;
    m = a.beta1 * m + a.one_minus_beta1 * g;
    v = a.beta2 * v + a.one_minus_beta2 * g * g;
    const float m_hat = __fdiv_rn(m, a.bias1), v_hat = __fdiv_rn(v, a.bias2);
    p -= a.lr * (__fdiv_rn(m_hat, __fsqrt_rn(v_hat) + a.eps) + a.weight_decay * p);
}

// Every buffer is touched exactly once: streaming loads and stores keep them out of L2's way.
template <typename T>
__device__ inline void store128cs(T* p, const Packed128<T>& x) {
    __stcs(reinterpret_cast<int4*>(p), *reinterpret_cast<const int4*>(x.v));
}

// One thread per 8 elements: one 16-byte access to each 16-bit buffer (the weights' halves), two
// to each fp32 one. All loads are issued before any store (the buffers might alias as far as the
// compiler knows, so the order is spelled out). All pointers 16-byte aligned.
__global__ void adamw_vec_kernel(uint16_t* __restrict__ hi, uint16_t* __restrict__ lo,
                                 const float* __restrict__ grads, float* __restrict__ m, float* __restrict__ v,
                                 size_t packs, AdamWStep a, const float* __restrict__ grad_scale) {
    const size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= packs) return;
    const size_t i = 8 * k;
    Packed128<uint16_t> h = load128cs(hi + i), l = load128cs(lo + i);
    Packed128<float> mm[2], vv[2], g[2];
    for (int s = 0; s < 2; s++) {
        mm[s] = load128cs(m + i + 4 * s);
        vv[s] = load128cs(v + i + 4 * s);
        g[s] = load128cs(grads + i + 4 * s);
    }
    const float scale = *grad_scale;
    for (int s = 0; s < 2; s++)
        for (int j = 0; j < 4; j++) {
            const int e = 4 * s + j;
            float p = master_join(h[e], l[e]);
            adamw_element(p, mm[s][j], vv[s][j], g[s][j], a, scale);
            h[e] = master_hi(p);
            l[e] = master_lo(p);
        }
    for (int s = 0; s < 2; s++) {
        store128cs(m + i + 4 * s, mm[s]);
        store128cs(v + i + 4 * s, vv[s]);
    }
    store128cs(hi + i, h);
    store128cs(lo + i, l);
}

// Elements [begin, begin + count): the unaligned ends of a tensor, or all of it when the buffers
// do not share an alignment.
__global__ void adamw_scalar_kernel(uint16_t* hi, uint16_t* lo, const float* grads, float* m, float* v, size_t begin,
                                    size_t count, AdamWStep a, const float* grad_scale) {
    const float scale = *grad_scale;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < count; k += (size_t)gridDim.x * blockDim.x) {
        const size_t i = begin + k;
        float p = master_join(hi[i], lo[i]), mm = m[i], vv = v[i];
        adamw_element(p, mm, vv, grads[i], a, scale);
        m[i] = mm;
        v[i] = vv;
        hi[i] = master_hi(p);
        lo[i] = master_lo(p);
    }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

size_t global_norm_scratch_floats() { return kNormBlocks; }

void global_norm_squared(float* out, float* scratch, const float* grads, size_t n, cudaStream_t stream) {
    // elements before the first 16-byte boundary (grads is at least 4-byte aligned)
    size_t head = (16 - reinterpret_cast<uintptr_t>(grads) % 16) % 16 / 4;
    if (head > n) head = n;
    const size_t packs = (n - head) / 4;
    norm_partial_kernel<<<kNormBlocks, kNormThreads, 0, stream>>>(scratch, grads, head, packs, n);
    CUDA_CHECK_LAUNCH(norm_partial_kernel);
    norm_final_kernel<<<1, kNormBlocks, 0, stream>>>(out, scratch);
    CUDA_CHECK_LAUNCH(norm_final_kernel);
}

void sum_in_order(float* out, const float* partials, int n, cudaStream_t stream) {
    sum_in_order_kernel<<<1, 1, 0, stream>>>(out, partials, n);
    CUDA_CHECK_LAUNCH(sum_in_order_kernel);
}

void clip_scale(float* grad_scale, float* norm, const float* norm_squared, float clip, cudaStream_t stream) {
    clip_scale_kernel<<<1, 1, 0, stream>>>(grad_scale, norm, norm_squared, clip);
    CUDA_CHECK_LAUNCH(clip_scale_kernel);
}

void adamw_update(bf16* params, uint16_t* master_lo, const float* grads, float* m, float* v, size_t n,
                  const AdamWArgs& args, const float* grad_scale, cudaStream_t stream) {
    if (args.t < 1) throw Error("adamw_update: step t must be >= 1 (got " + std::to_string(args.t) + ")");
    if (n == 0) return;
    AdamWStep a;
    a.lr = args.lr;
    a.beta1 = args.beta1;
    a.beta2 = args.beta2;
    a.one_minus_beta1 = 1.0f - args.beta1;
    a.one_minus_beta2 = 1.0f - args.beta2;
    a.eps = args.eps;
    a.weight_decay = args.weight_decay;
    a.bias1 = float(1.0 - std::pow(double(args.beta1), double(args.t)));
    a.bias2 = float(1.0 - std::pow(double(args.beta2), double(args.t)));

    constexpr int kThreads = 256;
    uint16_t* const hi = reinterpret_cast<uint16_t*>(params);  // the masters' bf16 halves
    auto scalar = [&](size_t begin, size_t count) {
        if (count == 0) return;
        const int blocks = (int)std::min<size_t>((count + kThreads - 1) / kThreads, 1u << 20);
        adamw_scalar_kernel<<<blocks, kThreads, 0, stream>>>(hi, master_lo, grads, m, v, begin, count, a, grad_scale);
        CUDA_CHECK_LAUNCH(adamw_scalar_kernel);
    };
    // Vectorize from the first element where params (8 bf16 = 16 bytes) is aligned, if the other
    // buffers are aligned there too (true whenever all five share a 16-byte-aligned base).
    size_t head = (16 - reinterpret_cast<uintptr_t>(params) % 16) % 16 / 2;
    const bool vec = reinterpret_cast<uintptr_t>(params) % 2 == 0 && head < n && aligned16(master_lo + head) &&
                     aligned16(grads + head) && aligned16(m + head) && aligned16(v + head);
    if (!vec) {
        scalar(0, n);
        return;
    }
    const size_t packs = (n - head) / 8;
    if (packs > 0) {
        adamw_vec_kernel<<<ceil_div((long)packs, kThreads), kThreads, 0, stream>>>(
            hi + head, master_lo + head, grads + head, m + head, v + head, packs, a, grad_scale);
        CUDA_CHECK_LAUNCH(adamw_vec_kernel);
    }
    scalar(0, head);
    scalar(head + 8 * packs, n - head - 8 * packs);
}

}  // namespace codagpt
