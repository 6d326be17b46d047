// LayerNorm over the last dimension (eps 1e-5), forward and backward, and the residual add.
#pragma once
#include "common.cuh"

namespace codagpt {

// out = (inp - mean) * rstd * weight + bias, rows of C; mean and rstd (fp32, N each) kept for backward.
void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp, const bf16* weight, const bf16* bias,
                       int N, int C, cudaStream_t stream);

// dinp += LayerNorm backward (accumulates into the residual-stream gradient);
// dweight += sum_rows dout * xhat, dbias += sum_rows dout (fp32, accumulated, deterministic:
// per-block partials in `scratch`, then a fixed-order reduction).
// scratch: at least layernorm_backward_scratch_floats(N, C) floats.
size_t layernorm_backward_scratch_floats(int N, int C);
void layernorm_backward(bf16* dinp, float* dweight, float* dbias, float* scratch, const bf16* dout, const bf16* inp,
                        const bf16* weight, const float* mean, const float* rstd, int N, int C, cudaStream_t stream);

// out = a + b (n elements)
void residual_forward(bf16* out, const bf16* a, const bf16* b, long n, cudaStream_t stream);

}  // namespace codagpt
