// Helpers of the model tests that compare a model against the CPU reference (test_coda_cpu.cpp,
// test_gpu_model.cpp, test_gpu_coda.cpp): token streams, parameters that exercise every LayerNorm
// and bias term, and per-tensor gradient errors.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "config.hpp"
#include "gpt2_params.hpp"
#include "rng.hpp"

namespace codagpt::test {

inline std::vector<int> random_tokens(size_t n, int vocab, uint64_t seed) {
    Rng rng(seed);
    std::vector<int> t(n);
    for (int& x : t) x = (int)rng.below(vocab);
    return t;
}

// The GPU tests' small training run: gpt2-tiny's shape (2 layers, 4 heads, C = 64, T = 64) at
// batch 4, the rest TrainConfig's defaults.
inline TrainConfig tiny_train_config() {
    TrainConfig tc;
    tc.model = ModelConfig{2, 4, 64, 64, 50257};
    tc.batch_size = 4;
    tc.seq_len = 64;
    return tc;
}

// GPT-2 init (seed 11), then LayerNorm gammas 1 + 0.1 N(0,1), LayerNorm betas and all biases
// 0.1 N(0,1) (init's ones and zeros would make the gamma, beta and bias terms of a fold vanish),
// and wpe_offset added to wpe, so that the residual stream has a mean far from zero (with 0.7,
// |mean| / std ~ 20 at the embedding): where a folded LayerNorm's r (acc - mu c) cancels and
// E[x^2] - mu^2 would fail.
inline std::vector<float> nonzero_mean_params(const ModelConfig& m, float wpe_offset = 0.7f) {
    std::vector<float> params = gpt2_init_params(m, 11);
    GPT2Params<float> pv = param_views(params.data(), m);
    Rng rng(12);
    for_each_param(pv, m, [&](const char*, float* ptr, size_t size, bool, Init init) {
        if (init == Init::ones)  // LayerNorm gammas
            for (size_t i = 0; i < size; i++) ptr[i] = (float)(1 + 0.1 * rng.normal());
        if (init == Init::zeros)  // LayerNorm betas, biases
            for (size_t i = 0; i < size; i++) ptr[i] = (float)(0.1 * rng.normal());
    });
    for (size_t i = 0; i < (size_t)m.max_seq_len * m.n_embd; i++) pv.wpe[i] += wpe_offset;
    return params;
}

// ||a - b|| / ||b|| of each tensor of two flat vectors in param_layout order; a NaN gives +inf.
inline std::vector<double> tensor_errors(const std::vector<float>& a, const std::vector<float>& b,
                                         const std::vector<ParamInfo>& layout) {
    std::vector<double> errors;
    size_t off = 0;
    for (const ParamInfo& p : layout) {
        double num = 0, den = 0;
        for (size_t i = off; i < off + p.size; i++) {
            num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
            den += (double)b[i] * b[i];
        }
        errors.push_back(std::isfinite(num) ? std::sqrt(num / (den > 0 ? den : 1)) : INFINITY);
        off += p.size;
    }
    return errors;
}

// Per-tensor relative error of two flat gradient vectors in param_layout order, each below tol.
inline void expect_grads_close(const std::vector<float>& got, const std::vector<float>& ref,
                               const std::vector<ParamInfo>& layout, double tol) {
    const std::vector<double> errors = tensor_errors(got, ref, layout);
    for (size_t t = 0; t < layout.size(); t++) {
        EXPECT_LT(errors[t], tol) << "gradient of " << layout[t].name;
        std::printf("  grad %-9s rel err %.2e\n", layout[t].name.c_str(), errors[t]);
    }
}

}  // namespace codagpt::test
