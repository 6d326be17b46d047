// GPT-2 on one GPU, fused (CODA) path: the schedule of ../shared/design/CODA_GPT2.md on the CODA
// GEMM engine (kernels/gemm.cuh) with the epilogue programs of kernels/coda_programs.cuh, as
// GPT2CodaCPU (model_coda_cpu.hpp) runs it on the CPU emulator. bf16 activations, fp32 master
// weights, fp32 gradients and AdamW moments, the parameter layout of the CPU reference; encoder,
// attention (cuDNN or own flash attention) and the optimizer step are the unfused model's.
//
// What it launches: the GEMMs with their epilogue programs, cuBLASLt for the three GEMMs that have
// no epilogue work (dY, dW_o, dW_p), three passes without a GEMM (the embedding's row statistics,
// cross-entropy, the qkv fold after attention backward), tiny finalize kernels that merge epilogue
// partials, the encoder, attention, and once per optimizer step the AdamW update and the LayerNorm
// fold (kernels/coda_kernels.cuh). No LayerNorm, GELU, residual-add or bias kernel. Kept for
// backward per layer and token: x, qkv, y, x', f (bf16; f not with --recompute mlp), the row
// statistics of x and x' and attention's lse (fp32); post-GELU g is recomputed.
//
// The LM head runs over row chunks (GPUModelOptions::lm_head_chunks; by default as few chunks as
// keep their logits within the backward's scratch of 8 M C bf16, or within three waves of tiles of
// their dX GEMM where that is more, cut where the engine's plan prices their dX GEMMs least: on 1.5B
// at B = 16, T = 1024 four of 4096 rows, on 350M three of 6272, 5888 and 4224): no buffer holds all
// M x Vp logits. Before a backward, each chunk's LM head backward (cross-entropy, LN_f backward,
// the wte gradient) runs in forward right after its logits, so backward() begins with the last layer.
#pragma once
#include <memory>
#include <vector>

#include "config.hpp"
#include "model_gpu.hpp"

namespace codagpt {

class GPT2CodaGPU {
public:
    // Allocates every buffer for micro-batches of B x T up front: the step loop never allocates.
    // opt as GPT2GPU's; with Recompute::mlp backward runs the fc GEMM again for f, which is then
    // kept for one layer at a time instead of all of them.
    GPT2CodaGPU(const ModelConfig& cfg, int B, int T, const GPUModelOptions& opt = {});
    ~GPT2CodaGPU();
    GPT2CodaGPU(const GPT2CodaGPU&) = delete;
    GPT2CodaGPU& operator=(const GPT2CodaGPU&) = delete;

    // fp32 master weights (and their bf16 copies) from a flat host vector in param_layout order;
    // folds the LayerNorms into their GEMMs' weights.
    void set_params(const std::vector<float>& params);
    std::vector<float> master_params() const;
    std::vector<float> grads() const;  // fp32, param_layout order
    GPT2GPU::OptimizerState optimizer_state() const;
    void set_optimizer_state(const std::vector<float>& m, const std::vector<float>& v, long t);

    // Forward of one micro-batch (host token ids, B*T each); returns its mean loss. With
    // backward_next, backward() may follow: it accumulates d(mean loss)/d(params) * grad_scale.
    double forward(const int* inputs, const int* targets, bool backward_next, float grad_scale = 1.0f);
    void backward();
    void zero_grad();
    // The optimizer step in two halves as GPT2GPU's; apply_update also refolds the LayerNorms
    // into the updated weights (once per optimizer step, not per micro-batch). Both synchronize.
    double grad_norm();
    void apply_update(double lr, const TrainConfig& c);
    // --phase-times, as GPT2GPU's.
    void time_phases();
    StepPhases phases() const;

    // [B*T, Vp] of the last forward without a backward next; with the LM head in one chunk only.
    std::vector<float> logits() const;
    const std::vector<float>& token_losses() const;  // [B*T] of the last forward
    const char* attention_backend() const;
    std::vector<int> lm_head_chunk_rows() const;  // the LM head's row chunks, first to last
    size_t num_params() const { return num_params_; }
    // A decoder over the bf16 weights in place (sampling during training); must not outlive the model.
    std::unique_ptr<GPT2GPUDecoder> make_decoder() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    size_t num_params_ = 0;
};

}  // namespace codagpt
