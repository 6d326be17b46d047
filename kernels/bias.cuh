// Bias gradient: column sums of an M x N bf16 matrix, deterministic (no atomics).
#pragma once
#include "common.cuh"

namespace codagpt {

size_t bias_backward_scratch_floats(int M, int N);
// dbias[j] += sum_i dout[i, j]  (fp32 accumulation; per-block partials in scratch, fixed-order reduce)
void bias_backward(float* dbias, float* scratch, const bf16* dout, int M, int N, cudaStream_t stream);

}  // namespace codagpt
