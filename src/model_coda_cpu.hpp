// The fused (CODA) GPT-2 schedule of ../shared/design/CODA_GPT2.md on the CPU: every GEMM runs
// through the engine's CPU emulator (gemm_emulator.hpp) with the epilogue programs of
// kernels/coda_programs.cuh, attention and the embedding through the CPU reference ops. It is the
// readable statement of the schedule that the GPU path is checked against, and CI checks it
// against the CPU reference GPT2CPU.
//
// Activations are fp32 (the programs with Act = float), so that the result equals the fp32
// reference to fp32 tolerance: the algebra, not bf16 rounding, is under test here.
#pragma once
#include <vector>

#include "config.hpp"
#include "gemm_emulator.hpp"
#include "gpt2_params.hpp"

namespace codagpt {

// A LayerNorm folded into the GEMM that consumes it: W~ = diag(gamma) W [K, N], c = column sums
// of W~, b~ = beta W + b (CODA_GPT2.md, "Folding LayerNorm into the consuming GEMM").
struct FoldedWeights {
    std::vector<float> w_folded, c, b_folded;
};

class GPT2CodaCPU {
public:
    // shape: the emulator's tile shape (results depend on it only through rounding).
    explicit GPT2CodaCPU(const ModelConfig& cfg, const coda::TileShape& shape = {});

    // Takes the parameters (flat, param_layout order, as GPT2CPU::params) and folds LN1, LN2 and
    // LN_f into their GEMMs: what the trainer does once per optimizer step.
    void set_params(const std::vector<float>& params);

    // Forward of B x T tokens with their targets: returns the mean cross-entropy and keeps what
    // backward() needs (x, qkv, y, x', f and the row statistics of each layer).
    float forward(const int* inputs, const int* targets, int B, int T);
    // Accumulates d(mean loss)/d(params) * grad_scale into grads, in param_layout order. Needs a
    // forward() before each call; turns the logits into dz in place, as the GPU kernel does.
    void backward(float grad_scale = 1.f);
    void zero_grad();

    const float* logits() const { return logits_.data(); }  // [B, T, Vp]; valid until backward()
    const std::vector<float>& params() const { return params_; }
    std::vector<float> grads;  // flat, param_layout order

private:
    GPT2Params<float> param_view() { return param_views(params_.data(), cfg_); }
    GPT2Params<float> grad_view() { return param_views(grads.data(), cfg_); }
    void ensure_activations(int B, int T);

    ModelConfig cfg_;
    coda::TileShape shape_;
    std::vector<float> params_;
    std::vector<FoldedWeights> qkv_fold_, fc_fold_;  // per layer: LN1 into qkv, LN2 into fc
    FoldedWeights lm_head_fold_;                     // LN_f into the tied LM head, W = wte^T [C, Vp]

    // Kept by forward for backward (l: layer, BT = B*T tokens). residual_[l] is x entering layer
    // l; residual_[L] enters LN_f. No LayerNorm output and no post-GELU g is kept.
    int B_ = 0, T_ = 0;
    bool backward_ready_ = false;
    std::vector<int> inputs_, targets_;  // [BT]
    std::vector<float> residual_;        // [L+1, BT, C]
    std::vector<float> mu_, rstd_;       // [L+1, BT]  row statistics of residual_
    std::vector<float> qkv_;             // [L, BT, 3C]
    std::vector<float> y_;               // [L, BT, C]  attention output
    std::vector<float> att_;             // [L, B, NH, T, T]  the CPU attention's probabilities
    std::vector<float> x_mid_;           // [L, BT, C]  x' = x + attention projection
    std::vector<float> mu_mid_, rstd_mid_;  // [L, BT]
    std::vector<float> f_;               // [L, BT, 4C]  pre-GELU
    std::vector<float> logits_;          // [BT, Vp]; dz (dlogits) after backward
    std::vector<float> lse_;             // [BT]
};

}  // namespace codagpt
