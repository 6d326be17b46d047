// The CPU reference GPT-2: forward, backward in plain C++ (OpenMP), templated on the float type so
// that the same code runs in fp32 (the trainer and the oracle of every GPU path) and in fp64 (the
// finite-difference gradient check).
//
// GPT-2: learned positions, pre-LN blocks, causal self-attention, tanh-GELU MLP, final LayerNorm,
// LM head tied to the token embedding, vocabulary padded to a multiple of 128 (padded rows are
// zero at init and their logits are excluded from the softmax).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>
#include "config.hpp"
#include "gpt2_params.hpp"

namespace codagpt {

template <typename F>
class GPT2CPU {
public:
    explicit GPT2CPU(const ModelConfig& cfg);

    // Sets the parameters to gpt2_init_params(cfg, seed) (gpt2_params.hpp).
    void init(uint64_t seed);

    // Forward of B x T tokens (T <= max_seq_len). With targets, returns the mean cross-entropy
    // over all B*T positions and keeps activations for backward(); targets may be null (returns 0).
    F forward(const int* inputs, const int* targets, int B, int T);
    // Accumulates d(mean loss)/d(params) * grad_scale into grads (zero them with zero_grad()).
    // grad_scale is 1/grad_accum when accumulating micro-batches. Needs a forward() with targets
    // before each call (it consumes the softmax kept by that forward).
    void backward(F grad_scale = F(1));
    void zero_grad();

    const F* logits() const { return logits_.data(); }  // [B, T, Vp] of the last forward
    std::vector<F> token_losses() const;                // [B*T] of the last forward with targets
    const ModelConfig& config() const { return cfg_; }

    std::vector<F> params;  // flat, in param_layout order
    std::vector<F> grads;   // same layout
    GPT2Params<F> p() { return view(params.data()); }
    GPT2Params<F> g() { return view(grads.data()); }
    const std::vector<ParamInfo>& layout() const { return layout_; }

private:
    GPT2Params<F> view(F* base) const;
    void ensure_activations(int B, int T);

    ModelConfig cfg_;
    std::vector<ParamInfo> layout_;
    int B_ = 0, T_ = 0;
    bool backward_ready_ = false;  // a forward with targets ran since the last backward
    bool has_losses_ = false;      // the last forward had targets
    std::vector<int> inputs_, targets_;
    std::vector<F> acts_, dacts_;  // activations of the last forward and their gradients (Acts layout)
    std::vector<F> logits_;        // [B, T, Vp]
    std::vector<F> dlogits_;       // [B, T, Vp] softmax exponentials from forward, dlogits after backward
    std::vector<F> wte_t_;         // [C, Vp] wte transposed (forward), then its gradient (backward)
    std::vector<F> scratch_;       // transposed matmul operands
};

extern template class GPT2CPU<float>;
extern template class GPT2CPU<double>;

}  // namespace codagpt
