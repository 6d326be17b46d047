// Decoding kernels. Attention: one block per (query row, head); the row's scores live in shared
// memory (at most pos0 + n floats), so the two softmax passes and the weighted sum of values read
// each cached key and value once. LM head: one warp per vocabulary row, a matrix-vector product
// that streams wte once (decoding one row is bound by reading the weights, not by arithmetic).
#include "decode.cuh"

#include <cstdint>
#include <string>

namespace codagpt {

namespace {

constexpr int kAttnThreads = 256;
constexpr int kLogitsWarps = 8;

__device__ inline float warp_sum(float v) {
#pragma unroll
    for (int k = 16; k > 0; k >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, k);
    return v;
}
__device__ inline float warp_max(float v) {
#pragma unroll
    for (int k = 16; k > 0; k >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, k));
    return v;
}

// Sum or max over the block, the same value returned to every thread (fixed order: deterministic).
template <bool kMax>
__device__ float block_reduce(float v, float* scratch /* [32] */) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = kMax ? warp_max(v) : warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous reduction
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : (kMax ? -INFINITY : 0.f);
    return kMax ? warp_max(v) : warp_sum(v);
}

// Shared memory: q [HS], scores [pos0 + n], per-group partial outputs [groups * HS], scratch [32].
__global__ void __launch_bounds__(kAttnThreads) decode_attention_kernel(bf16* out, const bf16* q, int q_stride,
                                                                        const bf16* k_cache, const bf16* v_cache,
                                                                        int pos0, int n, int NH, int HS, float scale) {
    extern __shared__ float smem[];
    const int r = blockIdx.x, h = blockIdx.y, C = NH * HS;
    const int len = pos0 + r + 1;  // keys 0 .. pos0 + r
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    float* qs = smem;
    float* s = qs + HS;
    float* part = s + pos0 + n;
    float* scratch = part + (blockDim.x / HS) * HS;

    for (int d = threadIdx.x; d < HS; d += blockDim.x) qs[d] = __bfloat162float(q[(long)r * q_stride + h * HS + d]);
    __syncthreads();
    // Scores: a warp per key, lanes across the head's channels (contiguous: coalesced).
    for (int t = warp; t < len; t += warps) {
        const bf16* k = k_cache + (long)t * C + h * HS;
        float dot = 0.f;
        for (int d = lane; d < HS; d += 32) dot += qs[d] * __bfloat162float(k[d]);
        dot = warp_sum(dot);
        if (lane == 0) s[t] = dot * scale;
    }
    __syncthreads();
    float m = -INFINITY;
    for (int t = threadIdx.x; t < len; t += blockDim.x) m = fmaxf(m, s[t]);
    m = block_reduce<true>(m, scratch);
    float sum = 0.f;
    for (int t = threadIdx.x; t < len; t += blockDim.x) {
        const float e = expf(s[t] - m);
        s[t] = e;
        sum += e;
    }
    sum = block_reduce<false>(sum, scratch);  // its __syncthreads also publishes the exponentials
    // Weighted values: thread (g, d) adds keys t = g, g + groups, ... for channel d; then the groups
    // are added in order.
    const int groups = blockDim.x / HS, g = threadIdx.x / HS, d = threadIdx.x % HS;
    if (g < groups) {
        float acc = 0.f;
        for (int t = g; t < len; t += groups) acc += s[t] * __bfloat162float(v_cache[(long)t * C + h * HS + d]);
        part[g * HS + d] = acc;
    }
    __syncthreads();
    if (threadIdx.x < HS) {
        float o = 0.f;
        for (int j = 0; j < groups; j++) o += part[j * HS + threadIdx.x];
        out[(long)r * C + h * HS + threadIdx.x] = __float2bfloat16(o / sum);
    }
}

__global__ void __launch_bounds__(32 * kLogitsWarps) decode_logits_kernel(float* logits, const bf16* x, const bf16* wte,
                                                                          int V, int C) {
    extern __shared__ float xs[];
    for (int c = threadIdx.x; c < C; c += blockDim.x) xs[c] = __bfloat162float(x[c]);
    __syncthreads();
    const int lane = threadIdx.x % 32;
    const int v = blockIdx.x * kLogitsWarps + threadIdx.x / 32;
    if (v >= V) return;
    const bf16* row = wte + (long)v * C;
    float sum = 0.f;
    for (int i = lane; i < C / 8; i += 32) {
        const Packed128<bf16> w = load128cs(row + i * 8);
#pragma unroll
        for (int j = 0; j < 8; j++) sum += xs[i * 8 + j] * __bfloat162float(w[j]);
    }
    sum = warp_sum(sum);
    if (lane == 0) logits[v] = sum;
}

constexpr size_t kMaxSharedBytes = 48 * 1024;  // without opting in to more

}  // namespace

void decode_attention(bf16* out, const bf16* q, int q_stride, const bf16* k_cache, const bf16* v_cache, int n,
                      int pos0, int NH, int HS, cudaStream_t stream) {
    if (n < 1 || pos0 < 0 || NH < 1 || HS < 1 || HS > kAttnThreads)
        throw Error("decode_attention: needs n >= 1, pos0 >= 0, NH >= 1 and HS in 1..256, got n=" + std::to_string(n) +
                    " pos0=" + std::to_string(pos0) + " NH=" + std::to_string(NH) + " HS=" + std::to_string(HS));
    const size_t smem = sizeof(float) * (HS + (size_t)pos0 + n + (kAttnThreads / HS) * HS + 32);
    if (smem > kMaxSharedBytes)
        throw Error("decode_attention: a context of " + std::to_string(pos0 + n) + " positions needs " +
                    std::to_string(smem) + " bytes of shared memory, more than 48 KiB");
    decode_attention_kernel<<<dim3(n, NH), kAttnThreads, smem, stream>>>(out, q, q_stride, k_cache, v_cache, pos0, n,
                                                                         NH, HS, 1.0f / sqrtf((float)HS));
    CUDA_CHECK_LAUNCH(decode_attention_kernel);
}

void decode_logits(float* logits, const bf16* x, const bf16* wte, int V, int C, cudaStream_t stream) {
    if (V < 1 || C < 8 || C % 8 != 0 || (uintptr_t)wte % 16 != 0)
        throw Error("decode_logits: needs V >= 1, C a positive multiple of 8 and wte 16-byte aligned, got V=" +
                    std::to_string(V) + " C=" + std::to_string(C));
    const size_t smem = sizeof(float) * C;
    if (smem > kMaxSharedBytes) throw Error("decode_logits: C=" + std::to_string(C) + " exceeds 48 KiB of shared memory");
    decode_logits_kernel<<<ceil_div(V, kLogitsWarps), 32 * kLogitsWarps, smem, stream>>>(logits, x, wte, V, C);
    CUDA_CHECK_LAUNCH(decode_logits_kernel);
}

}  // namespace codagpt
