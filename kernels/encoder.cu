// Token + position embedding. Forward: one thread per 8 channels of one position.
// Backward without atomics: the host groups the positions of each token id (buckets sorted by token,
// positions ascending within a bucket); one thread then owns 8 channels of one token's gradient
// row and adds that token's positions in ascending order, which is exactly the order of the CPU
// reference, so the fp32 sums match it bit for bit.
#include "encoder.cuh"

#include <algorithm>
#include <cstdint>
#include <vector>

namespace codagpt {

struct EncoderBuckets {
    int max_tokens = 0;
    int n_tokens = 0;   // B*T of the last build
    int n_buckets = 0;  // distinct token ids of the last build
    // One device allocation, three arrays: positions [max_tokens] (grouped by token),
    // bucket_start [max_tokens + 1] (offsets into positions), bucket_token [max_tokens].
    int* dev = nullptr;
    std::vector<int> host;          // staging copy of the same three arrays
    std::vector<uint64_t> keys;     // (token << 32 | position), sorted
    int* positions() const { return dev; }
    int* bucket_start() const { return dev + max_tokens; }
    int* bucket_token() const { return dev + 2 * max_tokens + 1; }
};

namespace {

__global__ void encoder_forward_kernel(bf16* out, const int* inputs, const bf16* wte, const bf16* wpe, int N, int T,
                                       int C) {
    const int CV = C / 8;
    const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long)N * CV) return;
    const int p = (int)(idx / CV), c = (int)(idx % CV) * 8, t = p % T;
    const Packed128<bf16> tok = load128(wte + (long)inputs[p] * C + c);
    const Packed128<bf16> pos = load128(wpe + (long)t * C + c);
    Packed128<bf16> o;
#pragma unroll
    for (int j = 0; j < 8; j++) o[j] = __float2bfloat16(__bfloat162float(tok[j]) + __bfloat162float(pos[j]));
    store128(out + (long)p * C + c, o);
}

// Loads 8 fp32 values at p (16-byte aligned) as two float4.
__device__ inline void load8(float (&v)[8], const float* p) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
__device__ inline void store8(float* p, const float (&v)[8]) {
    reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// One thread per (bucket, 8 channels): dwte[token, c..c+8] += dout[p, c..c+8] over the bucket's
// positions in ascending order.
__global__ void encoder_backward_wte_kernel(float* dwte, const bf16* dout, const int* positions,
                                           const int* bucket_start, const int* bucket_token, int n_buckets, int C) {
    const int CV = C / 8;
    const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long)n_buckets * CV) return;
    const int u = (int)(idx / CV), c = (int)(idx % CV) * 8;
    float* row = dwte + (long)bucket_token[u] * C + c;
    float acc[8];
    load8(acc, row);
    for (int i = bucket_start[u]; i < bucket_start[u + 1]; i++) {
        const Packed128<bf16> d = load128(dout + (long)positions[i] * C + c);
#pragma unroll
        for (int j = 0; j < 8; j++) acc[j] += __bfloat162float(d[j]);
    }
    store8(row, acc);
}

// One thread per (t, 8 channels): dwpe[t, c..c+8] += dout[b, t, c..c+8] for b = 0..B-1 in order.
__global__ void encoder_backward_wpe_kernel(float* dwpe, const bf16* dout, int B, int T, int C) {
    const int CV = C / 8;
    const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long)T * CV) return;
    const int t = (int)(idx / CV), c = (int)(idx % CV) * 8;
    float* row = dwpe + (long)t * C + c;
    float acc[8];
    load8(acc, row);
    for (int b = 0; b < B; b++) {
        const Packed128<bf16> d = load128(dout + ((long)b * T + t) * C + c);
#pragma unroll
        for (int j = 0; j < 8; j++) acc[j] += __bfloat162float(d[j]);
    }
    store8(row, acc);
}

void check_channels(int C, const char* fn) {
    if (C <= 0 || C % 8 != 0)
        throw Error(std::string(fn) + ": C must be a positive multiple of 8 (16-byte vectors), got " +
                    std::to_string(C));
}

constexpr int kBlock = 256;

}  // namespace

void encoder_forward(bf16* out, const int* inputs, const bf16* wte, const bf16* wpe, int B, int T, int C,
                     cudaStream_t stream) {
    check_channels(C, "encoder_forward");
    const long threads = (long)B * T * (C / 8);
    if (threads == 0) return;
    encoder_forward_kernel<<<ceil_div(threads, kBlock), kBlock, 0, stream>>>(out, inputs, wte, wpe, B * T, T, C);
    CUDA_CHECK_LAUNCH(encoder_forward_kernel);
}

EncoderBuckets* encoder_buckets_create(int max_tokens) {
    if (max_tokens <= 0) throw Error("encoder_buckets_create: max_tokens must be positive");
    auto* bk = new EncoderBuckets;
    bk->max_tokens = max_tokens;
    bk->host.resize(3 * (size_t)max_tokens + 1);
    bk->keys.reserve(max_tokens);
    const cudaError_t err = cudaMalloc(&bk->dev, bk->host.size() * sizeof(int));
    if (err != cudaSuccess) {
        delete bk;
        cuda_fail(err, "cudaMalloc(&bk->dev, ...)", __FILE__, __LINE__);
    }
    return bk;
}

void encoder_buckets_destroy(EncoderBuckets* bk) {
    if (!bk) return;
    cudaFree(bk->dev);
    delete bk;
}

void encoder_buckets_build(EncoderBuckets* bk, const int* inputs_host, int B, int T, cudaStream_t stream) {
    const int n = B * T;
    if (B <= 0 || T <= 0 || n > bk->max_tokens)
        throw Error("encoder_buckets_build: B*T = " + std::to_string(n) + " outside 1.." +
                    std::to_string(bk->max_tokens));
    bk->keys.clear();
    for (int p = 0; p < n; p++) {
        if (inputs_host[p] < 0)
            throw Error("encoder_buckets_build: negative token id at position " + std::to_string(p));
        bk->keys.push_back((uint64_t)inputs_host[p] << 32 | (uint32_t)p);
    }
    std::sort(bk->keys.begin(), bk->keys.end());
    int* positions = bk->host.data();
    int* start = positions + bk->max_tokens;
    int* token = start + bk->max_tokens + 1;
    int u = -1;
    for (int i = 0; i < n; i++) {
        const int tok = (int)(bk->keys[i] >> 32);
        positions[i] = (int)(bk->keys[i] & 0xFFFFFFFFu);
        if (u < 0 || token[u] != tok) {
            token[++u] = tok;
            start[u] = i;
        }
    }
    bk->n_buckets = u + 1;
    bk->n_tokens = n;
    start[bk->n_buckets] = n;
    // Pageable source: the copy is staged before cudaMemcpyAsync returns, so the host arrays can be
    // rebuilt at once; stream order keeps it behind any encoder_backward still reading the old buckets.
    CUDA_CHECK(cudaMemcpyAsync(bk->dev, bk->host.data(), bk->host.size() * sizeof(int), cudaMemcpyHostToDevice,
                               stream));
}

void encoder_backward(float* dwte, float* dwpe, const bf16* dout, const EncoderBuckets* bk, int B, int T, int C,
                      cudaStream_t stream) {
    check_channels(C, "encoder_backward");
    if (B * T != bk->n_tokens)
        throw Error("encoder_backward: buckets were built for " + std::to_string(bk->n_tokens) +
                    " positions, called with B*T = " + std::to_string(B * T));
    const long wte_threads = (long)bk->n_buckets * (C / 8), wpe_threads = (long)T * (C / 8);
    encoder_backward_wte_kernel<<<ceil_div(wte_threads, kBlock), kBlock, 0, stream>>>(
        dwte, dout, bk->positions(), bk->bucket_start(), bk->bucket_token(), bk->n_buckets, C);
    CUDA_CHECK_LAUNCH(encoder_backward_wte_kernel);
    encoder_backward_wpe_kernel<<<ceil_div(wpe_threads, kBlock), kBlock, 0, stream>>>(dwpe, dout, B, T, C);
    CUDA_CHECK_LAUNCH(encoder_backward_wpe_kernel);
}

}  // namespace codagpt
