// tanh-GELU, forward and backward.
#pragma once
#include "common.cuh"

namespace codagpt {

// out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
void gelu_forward(bf16* out, const bf16* inp, long n, cudaStream_t stream);
// dinp = dout * gelu'(inp); dinp may alias dout.
void gelu_backward(bf16* dinp, const bf16* inp, const bf16* dout, long n, cudaStream_t stream);

}  // namespace codagpt
