#include "optim_cpu.hpp"

#include <algorithm>
#include <cmath>

namespace codagpt {

constexpr double kPi = 3.14159265358979323846;

// llm.c's convention: step 0 already trains with lr / warmup_steps, step warmup_steps-1 with lr.
// The decay (cosine or linear) then runs from lr at step warmup_steps (wsd: at the start of its
// cooldown) to lr * min_lr_frac at step steps-1.
double lr_at(const TrainConfig& c, int step) {
    if (step < c.warmup_steps) return c.lr * (step + 1) / c.warmup_steps;
    if (c.lr_schedule == "constant") return c.lr;
    // The decay runs over steps [first, last]: from lr at `first` to the minimum at the last step.
    const int last = c.steps - 1;
    const int first = c.lr_schedule == "wsd"
                          ? std::max(c.warmup_steps, last - (int)std::lround(c.cooldown_frac * c.steps))
                          : c.warmup_steps;
    const double min_lr = c.lr * c.min_lr_frac;
    const double progress = last > first ? std::clamp(double(step - first) / (last - first), 0.0, 1.0)
                                         : step >= last ? 1.0 : 0.0;  // no room for a decay: the last step alone
    const double weight = c.lr_schedule == "cosine" ? 0.5 * (1.0 + std::cos(kPi * progress)) : 1.0 - progress;
    return min_lr + weight * (c.lr - min_lr);
}

// Fixed chunks, their partial sums added in chunk order: the same bits for any thread count.
double sum_of_squares(const float* grads, size_t n) {
    constexpr size_t kChunk = 1 << 16;
    const long chunks = long((n + kChunk - 1) / kChunk);
    std::vector<double> partial(chunks);
#pragma omp parallel for schedule(static)
    for (long c = 0; c < chunks; c++) {
        const size_t end = std::min(n, (c + 1) * kChunk);
        double s = 0;
        for (size_t i = c * kChunk; i < end; i++) s += double(grads[i]) * grads[i];
        partial[c] = s;
    }
    double sum = 0;
    for (double s : partial) sum += s;
    return sum;
}

double global_grad_norm(const float* grads, size_t n) { return std::sqrt(sum_of_squares(grads, n)); }

AdamWCPU::AdamWCPU(const std::vector<ParamInfo>& layout) : layout_(layout) {
    size_t n = 0;
    for (const ParamInfo& t : layout_) n += t.size;
    m.assign(n, 0.0f);
    v.assign(n, 0.0f);
}

void adamw_update_range(const std::vector<ParamInfo>& layout, size_t begin, size_t end, float* params,
                        const float* grads, float* m, float* v, long t, double lr, double grad_norm,
                        const TrainConfig& c) {
    const float clip = c.grad_clip > 0 && grad_norm > c.grad_clip ? float(c.grad_clip / grad_norm) : 1.0f;
    const float beta1 = float(c.beta1), beta2 = float(c.beta2), eps = float(c.adam_eps), lr_f = float(lr);
    const float bias1 = float(1.0 - std::pow(c.beta1, double(t)));
    const float bias2 = float(1.0 - std::pow(c.beta2, double(t)));
    size_t tensor_begin = 0;
    for (const ParamInfo& tensor : layout) {
        const size_t lo = std::max(begin, tensor_begin), hi = std::min(end, tensor_begin + tensor.size);
        tensor_begin += tensor.size;
        if (lo >= hi) continue;
        const float wd = tensor.decay ? float(c.weight_decay) : 0.0f;
        float* p = params + (lo - begin);
        const float* g = grads + (lo - begin);
        float* mt = m + (lo - begin);
        float* vt = v + (lo - begin);
#pragma omp parallel for simd schedule(static)
        for (long i = 0; i < long(hi - lo); i++) {
            const float gi = g[i] * clip;
            mt[i] = beta1 * mt[i] + (1.0f - beta1) * gi;
            vt[i] = beta2 * vt[i] + (1.0f - beta2) * gi * gi;
            const float m_hat = mt[i] / bias1, v_hat = vt[i] / bias2;
            // decoupled weight decay: p shrinks by lr * wd * p, independent of the gradient moments
            p[i] -= lr_f * (m_hat / (std::sqrt(v_hat) + eps) + wd * p[i]);
        }
    }
}

void AdamWCPU::step(float* params, const float* grads, double lr, double grad_norm, const TrainConfig& c) {
    t++;
    adamw_update_range(layout_, 0, m.size(), params, grads, m.data(), v.data(), t, lr, grad_norm, c);
}

}  // namespace codagpt
