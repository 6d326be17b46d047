// The optimizer step on the GPU: global gradient norm and AdamW with fp32 master weights.
#pragma once
#include "common.cuh"

namespace codagpt {

// out[0] = sum of squares of grads[0..n) in fp32 partials combined in a fixed order (deterministic).
// scratch: global_norm_scratch_floats() floats.
size_t global_norm_scratch_floats();
void global_norm_squared(float* out, float* scratch, const float* grads, size_t n, cudaStream_t stream);

// One AdamW update of n elements (decoupled weight decay; t = 1-based step for bias correction).
// grad_scale multiplies the gradient first (global-norm clipping); it is read from device memory
// (computed on the device from the norm) so that the step needs no host synchronisation.
// master (fp32) is the weight of record; params (bf16) receives its rounded copy.
struct AdamWArgs {
    float lr, beta1, beta2, eps, weight_decay;
    int t;
};
void adamw_update(float* master, bf16* params, const float* grads, float* m, float* v, size_t n,
                  const AdamWArgs& args, const float* grad_scale, cudaStream_t stream);
// grad_scale[0] = min(1, clip / sqrt(norm_squared[0])) (1 when clip <= 0); also norm[0] = sqrt(...)
void clip_scale(float* grad_scale, float* norm, const float* norm_squared, float clip, cudaStream_t stream);

}  // namespace codagpt
