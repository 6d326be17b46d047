// AdamW with decoupled weight decay, global-norm gradient clipping and the learning-rate schedules,
// on flat fp32 buffers (the CPU reference; GPU paths are checked against it).
#pragma once
#include <cstddef>
#include <vector>
#include "config.hpp"
#include "model_cpu.hpp"

namespace codagpt {

// Learning rate at `step` (0-based): linear warmup over warmup_steps to lr, then c.lr_schedule
// (config.hpp): a cosine or linear decay to lr * min_lr_frac at the last step, lr throughout, or
// lr until the last cooldown_frac of the steps and a linear decay over them (wsd).
double lr_at(const TrainConfig& c, int step);

// Sum of squares of grads[0..n), in double: fixed chunks whose partial sums are added in chunk
// order, so the bits do not depend on the thread count. A ZeRO-1 rank computes it over its shard.
double sum_of_squares(const float* grads, size_t n);

// L2 norm of the whole gradient: sqrt(sum_of_squares).
double global_grad_norm(const float* grads, size_t n);

// AdamW step t (1-based) of the flat elements [begin, end) of `layout` (any range, tensors cut
// anywhere); params, grads, m and v point at element `begin`. Gradients are scaled by
// min(1, grad_clip / grad_norm) first (grad_clip > 0); weight decay applies to the elements of
// tensors whose ParamInfo::decay is set. Every element's update reads only its own values, so
// updating the ranges of any split of [0, n) gives the bits of one update over [0, n): the ZeRO-1
// shards (zero_shard.hpp) rely on it.
void adamw_update_range(const std::vector<ParamInfo>& layout, size_t begin, size_t end, float* params,
                        const float* grads, float* m, float* v, long t, double lr, double grad_norm,
                        const TrainConfig& c);

class AdamWCPU {
public:
    explicit AdamWCPU(const std::vector<ParamInfo>& layout);
    // One update. Gradients are scaled by min(1, grad_clip / grad_norm) first (grad_clip > 0).
    // Weight decay applies to tensors whose ParamInfo::decay is set.
    void step(float* params, const float* grads, double lr, double grad_norm, const TrainConfig& c);
    std::vector<float> m, v;  // first and second moments, flat like the parameters
    long t = 0;               // updates done (bias correction)

private:
    std::vector<ParamInfo> layout_;
};

}  // namespace codagpt
