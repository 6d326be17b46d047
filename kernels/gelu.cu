// tanh-GELU, 8 bf16 per thread (16-byte accesses), fp32 math.
//
// 0.5 (1 + tanh(u)) is the logistic sigmoid s = 1 / (1 + exp(-2u)), so
//   gelu(x)  = x s
//   gelu'(x) = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) du/dx = s + 2 x s (1 - s) du/dx,   1 - s = exp(-2u) s.
// One fast exponential and one reciprocal per element, accurate in relative terms also where
// 1 + tanh(u) is tiny (x << 0), unlike tanh.approx. -2u is clamped at 80 so that exp(-2u) stays finite
// (beyond that gelu and gelu' are below 1e-33 anyway).
#include "gelu.cuh"

#include <cstdint>

#include "ops_cpu.hpp"

namespace codagpt {

namespace {

struct GeluTerms {
    float s;     // sigmoid(2u)
    float e_s;   // exp(-2u) s = 1 - s
    float du_dx;
};

__device__ inline GeluTerms gelu_terms(float x) {
    constexpr float k = (float)kGeluScale, c = 0.044715f;
    const float u = k * (x + c * x * x * x);
    const float e = __expf(fminf(-2.f * u, 80.f));
    const float s = __frcp_rn(1.f + e);
    return {s, e * s, k * (1.f + 3.f * c * x * x)};
}

__global__ void gelu_forward_kernel(bf16* out, const bf16* inp, long n) {
    const long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i + 8 <= n) {
        const Packed128<bf16> x = load128cs(inp + i);
        Packed128<bf16> o;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const float xj = __bfloat162float(x[j]);
            o[j] = __float2bfloat16(xj * gelu_terms(xj).s);
        }
        store128(out + i, o);
    } else {
        for (long k = i; k < n; k++) {
            const float xk = __bfloat162float(inp[k]);
            out[k] = __float2bfloat16(xk * gelu_terms(xk).s);
        }
    }
}

__device__ inline float gelu_grad(float x) {
    const GeluTerms g = gelu_terms(x);
    return g.s + 2.f * x * g.s * g.e_s * g.du_dx;
}

__global__ void gelu_backward_kernel(bf16* dinp, const bf16* inp, const bf16* dout, long n) {
    const long i = ((long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i + 8 <= n) {
        const Packed128<bf16> x = load128cs(inp + i), d = load128(dout + i);
        Packed128<bf16> o;
#pragma unroll
        for (int j = 0; j < 8; j++) o[j] = __float2bfloat16(gelu_grad(__bfloat162float(x[j])) * __bfloat162float(d[j]));
        store128(dinp + i, o);
    } else {
        for (long k = i; k < n; k++)
            dinp[k] = __float2bfloat16(gelu_grad(__bfloat162float(inp[k])) * __bfloat162float(dout[k]));
    }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
constexpr int kBlock = 256;

}  // namespace

void gelu_forward(bf16* out, const bf16* inp, long n, cudaStream_t stream) {
    if (!aligned16(out) || !aligned16(inp)) throw Error("gelu_forward: pointers must be 16-byte aligned");
    if (n <= 0) return;
    gelu_forward_kernel<<<ceil_div(ceil_div(n, 8), kBlock), kBlock, 0, stream>>>(out, inp, n);
    CUDA_CHECK_LAUNCH(gelu_forward_kernel);
}

void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, long n, cudaStream_t stream) {
    if (!aligned16(dinp) || !aligned16(inp) || !aligned16(dout))
        throw Error("gelu_backward: pointers must be 16-byte aligned");
    if (n <= 0) return;
    gelu_backward_kernel<<<ceil_div(ceil_div(n, 8), kBlock), kBlock, 0, stream>>>(dinp, inp, dout, n);
    CUDA_CHECK_LAUNCH(gelu_backward_kernel);
}

}  // namespace codagpt
