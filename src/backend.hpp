// What the training loop needs from a model on some device: the CPU reference or a GPU path.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "config.hpp"
#include "step_phases.hpp"

namespace codagpt {

class Decoder;       // sample.hpp
class DataParallel;  // data_parallel.hpp

// What a checkpoint holds of a backend: the fp32 weights of record (the master weights on a GPU),
// the AdamW moments, all flat in param_layout() order, and the number of AdamW updates taken.
struct TrainState {
    std::vector<float> params, m, v;
    long t = 0;
};

class TrainBackend {
public:
    virtual ~TrainBackend() = default;
    virtual std::string describe() const = 0;  // for the log: device, path, attention backend
    virtual size_t num_params() const = 0;
    virtual void zero_grad() = 0;
    // Forward and backward of one micro-batch (host token ids, B*T each); gradients accumulate
    // scaled by grad_scale. Returns the mean loss of the micro-batch.
    virtual double forward_backward(const int* inputs, const int* targets, float grad_scale) = 0;
    virtual double evaluate(const int* inputs, const int* targets) = 0;  // mean loss, no gradients
    // The loss of every position (B*T, row-major), no gradients: for scoring multiple choices.
    virtual std::vector<float> evaluate_tokens(const int* inputs, const int* targets) = 0;
    // The global L2 norm of the accumulated gradients (before clipping). Synchronizes with the
    // device, so the training loop can skip the step when it is not finite.
    virtual double grad_norm() = 0;
    // A host copy of the accumulated gradients (fp32, param_layout() order), as grad_norm() sees
    // them and apply_update() leaves them: for --grad-norms. One process only (a data-parallel
    // rank reduces only its shard).
    virtual std::vector<float> gradients() const = 0;
    // Global-norm clipping with `norm` (grad_norm()'s value; a GPU uses its device copy of it) and
    // one AdamW step. Synchronizes: the step's time is complete when it returns.
    virtual void apply_update(double lr, double norm, const TrainConfig& c) = 0;
    // Both, as one optimizer step; returns the gradient norm before clipping.
    double update(double lr, const TrainConfig& c) {
        const double norm = grad_norm();
        apply_update(lr, norm, c);
        return norm;
    }
    // --phase-times (GPU backends): time every step's phases from now on with CUDA events; the
    // phases of the last step once apply_update has returned.
    virtual void time_phases() {}
    virtual StepPhases phases() const { return {}; }
    // Device memory in use (total - free, as llm.c reports it), or -1 where not applicable.
    virtual double device_memory_mib() const { return -1; }
    // For checkpoints: a host copy of the state, and its restoration (sizes are checked: Error).
    // After load_state the backend continues exactly as the one save_state was taken from.
    virtual TrainState save_state() const = 0;
    virtual void load_state(const TrainState& s) = 0;
    // New weights (fp32, param_layout order; size checked: Error), optimizer state untouched: on a
    // fresh backend, fine-tuning from other weights with zero AdamW moments at step 0.
    virtual void load_params(const std::vector<float>& params) = 0;
    // A decoder (sample.hpp) over the backend's weights in place, not a copy: each call decodes
    // with the weights as trained so far. For samples during training; must not outlive the backend.
    virtual std::unique_ptr<Decoder> make_decoder() const = 0;
};

std::unique_ptr<TrainBackend> make_cpu_backend(const TrainConfig& c);

// What backward recomputes instead of keeping from forward (--recompute), trading time for memory.
enum class Recompute {
    none,
    gelu,  // the GELU output: one buffer, recomputed from the kept GELU input (llm.c's -r 1). The
           // fused path never keeps it (its dG epilogue re-emits it): there this is none.
    mlp,   // every activation of the MLP: backward runs the fc GEMM again, layer by layer (unfused:
           // the fc output and GELU, 8C bf16 a token and layer; fused: its pre-activation f, 4C)
};
// "none", "gelu" or "mlp"; Error naming the value otherwise.
Recompute parse_recompute(const std::string& s);
const char* recompute_name(Recompute r);

struct GPUBackendOptions {
    Recompute recompute = Recompute::none;
    // --recompute-layers: recompute in layers [0, n) only and keep the later layers' activations
    // (less time, more memory than every layer); 0: every layer. Ignored with Recompute::none.
    int recompute_layers = 0;
    // --lm-head-chunks: the fused path's LM head in this many equal row chunks (GPUModelOptions); 0:
    // the model's cut. The unfused path refuses any other value.
    int lm_head_chunks = 0;
    // --nondeterministic-attention: cuDNN's attention backward with atomic dQ (GPUModelOptions).
    bool deterministic_attention = true;
};

// The layers whose activations backward recomputes: [0, recomputed_layers(...)).
inline int recomputed_layers(Recompute r, int recompute_layers, int n_layer) {
    if (r == Recompute::none) return 0;
    return recompute_layers > 0 && recompute_layers < n_layer ? recompute_layers : n_layer;
}
// A per-layer activation that layers [0, r) recompute in backward: those layers share one slot
// (each overwrites it in forward and rebuilds it in backward), the later layers keep one each.
struct LayerSlots {
    int r;  // recomputed layers
    size_t count(size_t n_layer) const { return n_layer - (size_t)r + (r > 0 ? 1 : 0); }
    size_t of(int l) const { return l < r ? 0 : (size_t)(l - r) + (r > 0 ? 1 : 0); }
};
// data_parallel: this process is one rank of a data-parallel job (data_parallel.hpp); its backend
// trains on the rank's micro-batches, averages the gradients across ranks on the last of the
// config's grad_accum micro-steps, and keeps the ZeRO-1 shard of the optimizer state; save_state()
// is then collective (every rank calls it) and holds the state on rank 0 only. Null: one process.
// Throws Error when the build has no CUDA or no GPU is visible.
std::unique_ptr<TrainBackend> make_gpu_backend(const TrainConfig& c, const GPUBackendOptions& opt,
                                               std::shared_ptr<DataParallel> data_parallel = nullptr);
// The fused (CODA) GPU trainer (model_coda_gpu.hpp). Errors as make_gpu_backend.
std::unique_ptr<TrainBackend> make_coda_gpu_backend(const TrainConfig& c, const GPUBackendOptions& opt = {},
                                                    std::shared_ptr<DataParallel> data_parallel = nullptr);
// Whether `--fusion` selects the fused path on this machine's GPU: "coda", or "auto" on a GPU of
// compute capability 8.0 or newer (the GEMM engine's portable mainloop needs sm_80); "unfused"
// never. Error for any other value, and for "coda" without such a GPU.
bool use_coda(const std::string& fusion);

// Whether --device means the GPU: "cuda", or "auto" when a GPU is visible; "cpu" does not. Error
// for any other value.
bool use_gpu(const std::string& device);
// The GPU decoder (GPT2GPUDecoder) over bf16 copies of fp32 weights in param_layout order, for
// `codagpt sample`. Throws Error when the build has no CUDA or no GPU is visible.
std::unique_ptr<Decoder> make_gpu_decoder(const ModelConfig& m, const std::vector<float>& params);

}  // namespace codagpt
