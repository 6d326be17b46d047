// AdamW with decoupled weight decay, global-norm gradient clipping and the cosine learning-rate
// schedule, on flat fp32 buffers (the CPU reference; GPU paths are checked against it).
#pragma once
#include <cstddef>
#include <vector>
#include "config.hpp"
#include "model_cpu.hpp"

namespace codagpt {

// Learning rate at `step` (0-based): linear warmup over warmup_steps to lr, then cosine decay to
// lr * min_lr_frac at the last step.
double lr_at(const TrainConfig& c, int step);

// L2 norm of the whole gradient, accumulated in double.
double global_grad_norm(const float* grads, size_t n);

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
