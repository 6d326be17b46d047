// GPT-2 on one GPU, unfused path: every op is its own kernel (kernels/), GEMMs through cuBLASLt,
// attention through flash attention. bf16 parameters and activations, fp32 master weights, fp32
// parameter gradients and AdamW moments. The layouts are the CPU reference's (param_layout(),
// [in, out] matrices), so the GPU model starts from, and is tested against, GPT2CPU.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
#include "config.hpp"
#include "model_cpu.hpp"
#include "sample.hpp"
#include "step_phases.hpp"

struct __nv_bfloat16;  // bf16 (cuda_bf16.h) and cudaStream_t, without CUDA headers
struct CUstream_st;

namespace codagpt {

class DataParallel;  // data_parallel.hpp

struct GPUModelOptions {
    Recompute recompute = Recompute::none;  // activations backward recomputes (backend.hpp)
    bool prefer_cudnn = true;     // cuDNN flash attention when built with it, else our own kernel
    // One rank of a data-parallel job (ZeRO-1 shard of the optimizer state, gradients reduced
    // across ranks, weights all-gathered after each step); null for a single process.
    std::shared_ptr<DataParallel> data_parallel;
    int recompute_layers = 0;  // recompute in layers [0, n) only; 0: every layer (GPUBackendOptions)
    // The fused path's LM head in this many equal row chunks (model_coda_gpu.hpp); 0: the fewest
    // chunks that fit the backward's scratch, cut where the GEMM plan prices them least. The
    // unfused path ignores it.
    int lm_head_chunks = 0;
    bool deterministic_attention = true;  // false: cuDNN's atomic-dQ backward (Attention)

    // The layers that keep no GELU output (--recompute gelu or mlp) and those that keep no fc output
    // either (mlp): backward recomputes them; their buffers are one shared slot (backend.hpp).
    LayerSlots gelu_slots(int n_layer) const { return {recomputed_layers(recompute, recompute_layers, n_layer)}; }
    LayerSlots fc_slots(int n_layer) const { return {recompute == Recompute::mlp ? gelu_slots(n_layer).r : 0}; }
};

class GPT2GPU {
public:
    // Allocates every buffer for micro-batches of B x T up front: the step loop never allocates.
    GPT2GPU(const ModelConfig& cfg, int B, int T, const GPUModelOptions& opt);
    ~GPT2GPU();
    GPT2GPU(const GPT2GPU&) = delete;
    GPT2GPU& operator=(const GPT2GPU&) = delete;

    // Sets the fp32 master weights (and their bf16 copies) from a flat host vector in param_layout order.
    void set_params(const std::vector<float>& params);
    std::vector<float> master_params() const;  // fp32 weights of record
    std::vector<float> grads() const;          // fp32 gradients, param_layout order (TrainableParams::local_grads)
    // AdamW state, for checkpoints: moments in param_layout order and the number of updates taken.
    // In a data-parallel job master_params() and optimizer_state() are collective (every rank calls
    // them) and hold the values on rank 0 only (TrainableParams, gpu_training.hpp).
    struct OptimizerState {
        std::vector<float> m, v;
        long t = 0;
    };
    OptimizerState optimizer_state() const;
    void set_optimizer_state(const std::vector<float>& m, const std::vector<float>& v, long t);

    // Forward of one micro-batch (host token ids, B*T each). Returns the mean loss over its B*T
    // positions. With backward_next, the classifier leaves dlogits scaled by grad_scale / (B*T)
    // in place for backward().
    double forward(const int* inputs, const int* targets, bool backward_next, float grad_scale = 1.0f);
    void backward();  // accumulates into the fp32 gradients
    void zero_grad();
    // Global-norm clip and AdamW over all tensors (weight decay where ParamInfo::decay); returns the
    // gradient norm before clipping.
    double update(double lr, const TrainConfig& c);
    // update() in two halves, so that a non-finite norm can skip the step: grad_norm() computes the
    // norm on the device and returns it (synchronizes); apply_update() clips with that device norm
    // and runs AdamW (synchronizes). update() = grad_norm() then apply_update().
    double grad_norm();
    void apply_update(double lr, const TrainConfig& c);
    // --phase-times: time every step from now on; the last step's phases after apply_update()
    // (TrainableParams::time_phases, phases).
    void time_phases();
    StepPhases phases() const;

    std::vector<float> logits() const;  // [B*T, Vp] of the last forward, as floats (before dlogits)
    const std::vector<float>& token_losses() const;  // [B*T] of the last forward
    const char* attention_backend() const;
    size_t num_params() const { return num_params_; }

private:
    friend class GPT2GPUDecoder;  // decodes with the bf16 weights in place (samples during training)
    struct Impl;
    std::unique_ptr<Impl> impl_;
    size_t num_params_ = 0;
};

// Text generation on the GPU (a Decoder, sample.hpp): the unfused model's kernels on bf16 weights,
// a KV cache per layer ([max_seq_len, C] bf16 keys and values), a prompt's positions in one pass
// (the prefill: GEMMs with M = prompt length) and then one position per call; attention and the
// LM head through kernels/decode.cuh, whose fp32 logits of the last position come back to the host.
// Every buffer is allocated at construction: decoding allocates nothing.
class GPT2GPUDecoder final : public Decoder {
public:
    // Over the bf16 weights of `model`, read at every call, so it decodes with the weights as trained
    // so far; `model` must outlive the decoder.
    explicit GPT2GPUDecoder(const GPT2GPU& model);
    // Over its own bf16 copy (rounded to nearest even, as GPT2GPU::set_params) of fp32 weights in
    // param_layout order.
    GPT2GPUDecoder(const ModelConfig& m, const std::vector<float>& params);
    // Over bf16 weights in param_layout order that another model owns and updates on `stream` (the
    // fused trainer's, GPT2CodaGPU), read at every call as with the constructor from a GPT2GPU.
    GPT2GPUDecoder(const ModelConfig& m, const __nv_bfloat16* weights, CUstream_st* stream);
    ~GPT2GPUDecoder() override;
    const ModelConfig& config() const override;

private:
    const float* forward(const int* tokens, int n) override;
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace codagpt
