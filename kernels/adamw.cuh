// The optimizer step on the GPU: global gradient norm and AdamW with fp32 master weights (kept as
// their bf16 copy and its low halves: master_weights.cuh).
#pragma once
#include <stdint.h>

#include "common.cuh"

namespace codagpt {

// out[0] = sum of squares of grads[0..n): squares summed in double per thread, fp32 per-block
// partials in scratch, combined in a fixed order by one block (deterministic: a fixed grid, so the
// same gradients give the same bits). scratch: global_norm_scratch_floats() floats. Any n, any
// 4-byte-aligned grads.
size_t global_norm_scratch_floats();
void global_norm_squared(float* out, float* scratch, const float* grads, size_t n, cudaStream_t stream);
// out[0] = partials[0] + ... + partials[n-1], added in index order in double (the ranks' shard sums
// of squares of a ZeRO-1 step: the same bits on every rank, and partials[0] itself when n = 1).
void sum_in_order(float* out, const float* partials, int n, cudaStream_t stream);

// One AdamW update of n elements (decoupled weight decay; t = 1-based step for bias correction).
// grad_scale multiplies the gradient first (global-norm clipping); it is read from device memory
// (computed on the device from the norm) so that the step needs no host synchronisation.
// The fp32 master weight of record is the pair (params, master_lo) (master_weights.cuh): read,
// updated in fp32 and written back as its two halves, so params receives the updated weight
// rounded to bf16 (to nearest, ties away from zero). Any alignment works; the 16-byte vectorized
// path runs when the five buffers share one (as tensors at the same offset of 16-byte-aligned flat
// buffers do). Pass weight_decay = 0 for tensors that are not decayed.
struct AdamWArgs {
    float lr, beta1, beta2, eps, weight_decay;
    int t;
};
void adamw_update(bf16* params, uint16_t* master_lo, const float* grads, float* m, float* v, size_t n,
                  const AdamWArgs& args, const float* grad_scale, cudaStream_t stream);
// grad_scale[0] = min(1, clip / sqrt(norm_squared[0])) (1 when clip <= 0); also norm[0] = sqrt(...)
// unless norm is null. sqrt and division are exactly rounded.
void clip_scale(float* grad_scale, float* norm, const float* norm_squared, float clip, cudaStream_t stream);

}  // namespace codagpt
