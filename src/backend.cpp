#include "backend.hpp"

#include <algorithm>
#include <cstdio>
#include <omp.h>

#include "common.hpp"
#include "data_parallel.hpp"
#include "device.hpp"
#include "model_cpu.hpp"
#include "optim_cpu.hpp"
#include "sample.hpp"
#ifdef CODAGPT_HAVE_CUDA
#include <cuda_runtime.h>
#include "model_coda_gpu.hpp"
#include "model_gpu.hpp"
#endif

namespace codagpt {

namespace {

void check_params_size(const std::vector<float>& params, size_t n) {
    if (params.size() != n)
        throw Error("weights hold " + std::to_string(params.size()) + " parameters; this model has " + std::to_string(n));
}

void check_state_sizes(const TrainState& s, size_t n) {
    if (s.params.size() != n || s.m.size() != n || s.v.size() != n)
        throw Error("training state holds " + std::to_string(s.params.size()) + " parameters and " +
                    std::to_string(s.m.size()) + "/" + std::to_string(s.v.size()) +
                    " AdamW moments; this model has " + std::to_string(n));
    if (s.t < 0) throw Error("training state: negative AdamW step count " + std::to_string(s.t));
}

class CPUBackend final : public TrainBackend {
public:
    explicit CPUBackend(const TrainConfig& c) : model_(c.model), optimizer_(param_layout(c.model)), B_(c.batch_size), T_(c.seq_len) {
        model_.init(c.seed);
    }
    std::string describe() const override {
        return "CPU reference (fp32, " + std::to_string(omp_get_max_threads()) + " threads)";
    }
    size_t num_params() const override { return model_.params.size(); }
    void zero_grad() override { model_.zero_grad(); }
    double forward_backward(const int* inputs, const int* targets, float grad_scale) override {
        const double loss = model_.forward(inputs, targets, B_, T_);
        model_.backward(grad_scale);
        return loss;
    }
    double evaluate(const int* inputs, const int* targets) override { return model_.forward(inputs, targets, B_, T_); }
    std::vector<float> evaluate_tokens(const int* inputs, const int* targets) override {
        model_.forward(inputs, targets, B_, T_);
        return model_.token_losses();
    }
    double grad_norm() override { return global_grad_norm(model_.grads.data(), model_.grads.size()); }
    std::vector<float> gradients() const override { return model_.grads; }
    void apply_update(double lr, double norm, const TrainConfig& c) override {
        optimizer_.step(model_.params.data(), model_.grads.data(), lr, norm, c);
    }
    TrainState save_state() const override { return {model_.params, optimizer_.m, optimizer_.v, optimizer_.t}; }
    void load_state(const TrainState& s) override {
        check_state_sizes(s, model_.params.size());
        std::copy(s.params.begin(), s.params.end(), model_.params.begin());  // in place: decoders keep pointing at them
        optimizer_.m = s.m;
        optimizer_.v = s.v;
        optimizer_.t = s.t;
    }
    void load_params(const std::vector<float>& params) override {
        check_params_size(params, model_.params.size());
        std::copy(params.begin(), params.end(), model_.params.begin());
    }
    std::unique_ptr<Decoder> make_decoder() const override {
        return std::make_unique<GPT2Decoder>(model_.config(), model_.params.data());
    }

private:
    GPT2CPU<float> model_;
    AdamWCPU optimizer_;
    int B_, T_;
};

#ifdef CODAGPT_HAVE_CUDA
// What describe() adds for a GPU model's --recompute mode and the layers it recomputes in.
std::string recompute_note(const GPUModelOptions& o, int n_layer) {
    const int layers = o.gelu_slots(n_layer).r;
    const std::string where = layers < n_layer ? " in layers 0-" + std::to_string(layers - 1) : "";
    switch (o.recompute) {
        case Recompute::gelu: return ", GELU recomputed" + where;
        case Recompute::mlp: return ", MLP recomputed" + where;
        default: return "";
    }
}

// What describe() adds for the fused model's LM head in more than one row chunk, runs of equal
// chunks counted: ", LM head in 4 row chunks (4 x 4096)". Nothing for the unfused model.
std::string lm_head_note(const GPT2GPU&) { return ""; }
std::string lm_head_note(const GPT2CodaGPU& m) {
    const std::vector<int> rows = m.lm_head_chunk_rows();
    if (rows.size() < 2) return "";
    std::string runs;
    for (size_t i = 0, j; i < rows.size(); i = j) {
        for (j = i; j < rows.size() && rows[j] == rows[i]; j++) {}
        runs += (runs.empty() ? "" : " + ") + (j - i > 1 ? std::to_string(j - i) + " x " : "") + std::to_string(rows[i]);
    }
    return ", LM head in " + std::to_string(rows.size()) + " row chunks (" + runs + ")";
}

// A decoder over a GPU model's bf16 weights in place.
std::unique_ptr<Decoder> decoder_of(const GPT2GPU& m) { return std::make_unique<GPT2GPUDecoder>(m); }
std::unique_ptr<Decoder> decoder_of(const GPT2CodaGPU& m) { return m.make_decoder(); }

// Either GPU path (GPT2GPU: unfused; GPT2CodaGPU: the fused schedule) behind the same interface,
// data, AdamW and checkpoint state, so runs and --resume work the same on both. `path` and `note`
// go into describe(). With a DataParallel (which the model was given too) it counts the micro-steps
// since zero_grad, so that gradients are reduced in the backward of the last of grad_accum.
template <class Model>
class GPUBackend final : public TrainBackend {
public:
    template <class... ModelOptions>
    GPUBackend(const TrainConfig& c, std::shared_ptr<DataParallel> dp, std::string path, std::string note,
               ModelOptions... options)
        : model_(c.model, c.batch_size, c.seq_len, options...), dp_(std::move(dp)), grad_accum_(c.grad_accum),
          path_(std::move(path)), note_(std::move(note)) {
        model_.set_params(gpt2_init_params(c.model, c.seed));  // the CPU reference's weights for this seed
    }
    std::string describe() const override {
        const std::string ranks = dp_ ? ", rank " + std::to_string(dp_->rank()) + " of " +
                                            std::to_string(dp_->world_size()) + ", ZeRO-1"
                                      : "";
        return "GPU " + cuda_device_name() + " (" + path_ + ", bf16, attention " + model_.attention_backend() + note_ +
               lm_head_note(model_) + ranks + ")";
    }
    size_t num_params() const override { return model_.num_params(); }
    void zero_grad() override {
        model_.zero_grad();
        micro_steps_ = 0;
    }
    double forward_backward(const int* inputs, const int* targets, float grad_scale) override {
        const double loss = model_.forward(inputs, targets, /*backward_next=*/true, grad_scale);
        if (dp_) dp_->set_last_micro_step(++micro_steps_ == grad_accum_);
        model_.backward();
        return loss;
    }
    double evaluate(const int* inputs, const int* targets) override { return model_.forward(inputs, targets, false); }
    std::vector<float> evaluate_tokens(const int* inputs, const int* targets) override {
        model_.forward(inputs, targets, false);
        return model_.token_losses();
    }
    double grad_norm() override { return model_.grad_norm(); }
    std::vector<float> gradients() const override { return model_.grads(); }
    void apply_update(double lr, double, const TrainConfig& c) override { model_.apply_update(lr, c); }
    void time_phases() override { model_.time_phases(); }
    StepPhases phases() const override { return model_.phases(); }
    TrainState save_state() const override {
        GPT2GPU::OptimizerState o = model_.optimizer_state();
        return {model_.master_params(), std::move(o.m), std::move(o.v), o.t};
    }
    void load_state(const TrainState& s) override {
        check_state_sizes(s, model_.num_params());
        model_.set_params(s.params);  // master weights, their bf16 copies (and folds), as after an update
        model_.set_optimizer_state(s.m, s.v, s.t);
    }
    void load_params(const std::vector<float>& params) override {
        check_params_size(params, model_.num_params());
        model_.set_params(params);
    }
    std::unique_ptr<Decoder> make_decoder() const override { return decoder_of(model_); }
    double device_memory_mib() const override {
        size_t free = 0, total = 0;
        if (cudaMemGetInfo(&free, &total) != cudaSuccess) return -1;
        return (total - free) / (1024.0 * 1024.0);
    }

private:
    Model model_;
    std::shared_ptr<DataParallel> dp_;
    int grad_accum_, micro_steps_ = 0;
    std::string path_, note_;
};
#endif

}  // namespace

std::unique_ptr<TrainBackend> make_cpu_backend(const TrainConfig& c) { return std::make_unique<CPUBackend>(c); }

#ifdef CODAGPT_HAVE_CUDA
// The model options both GPU paths take from the command line's, with the path's recompute.
static GPUModelOptions model_options(const GPUBackendOptions& opt, Recompute recompute,
                                     std::shared_ptr<DataParallel> data_parallel) {
    GPUModelOptions model{recompute, true, std::move(data_parallel), opt.recompute_layers};
    model.lm_head_chunks = opt.lm_head_chunks;
    model.deterministic_attention = opt.deterministic_attention;
    return model;
}
#endif

std::unique_ptr<TrainBackend> make_gpu_backend(const TrainConfig& c, const GPUBackendOptions& opt,
                                               std::shared_ptr<DataParallel> data_parallel) {
#ifdef CODAGPT_HAVE_CUDA
    if (cuda_device_count() == 0) throw Error("no CUDA GPU is visible");
    if (opt.lm_head_chunks != 0)
        throw Error("--lm-head-chunks applies to the fused path (--fusion coda): the unfused one computes all logits at once");
    const GPUModelOptions model = model_options(opt, opt.recompute, data_parallel);
    return std::make_unique<GPUBackend<GPT2GPU>>(c, data_parallel, "unfused", recompute_note(model, c.model.n_layer),
                                                 model);
#else
    (void)c;
    (void)opt;
    (void)data_parallel;
    throw Error("this build has no CUDA support (configure with nvcc on PATH)");
#endif
}

std::unique_ptr<TrainBackend> make_coda_gpu_backend(const TrainConfig& c, const GPUBackendOptions& opt,
                                                    std::shared_ptr<DataParallel> data_parallel) {
#ifdef CODAGPT_HAVE_CUDA
    if (cuda_device_count() == 0) throw Error("no CUDA GPU is visible");
    // GELU outputs are never kept on this path: --recompute gelu is none here.
    const Recompute r = opt.recompute == Recompute::mlp ? Recompute::mlp : Recompute::none;
    const GPUModelOptions model = model_options(opt, r, data_parallel);
    return std::make_unique<GPUBackend<GPT2CodaGPU>>(c, data_parallel, "CODA fused",
                                                     recompute_note(model, c.model.n_layer), model);
#else
    (void)c;
    (void)opt;
    (void)data_parallel;
    throw Error("this build has no CUDA support (configure with nvcc on PATH)");
#endif
}

Recompute parse_recompute(const std::string& s) {
    for (Recompute r : {Recompute::none, Recompute::gelu, Recompute::mlp})
        if (s == recompute_name(r)) return r;
    throw Error("--recompute must be none, gelu or mlp, got '" + one_line(s) + "'");
}

const char* recompute_name(Recompute r) {
    switch (r) {
        case Recompute::gelu: return "gelu";
        case Recompute::mlp: return "mlp";
        default: return "none";
    }
}

bool use_coda(const std::string& fusion) {
    if (fusion == "unfused") return false;
    if (fusion != "coda" && fusion != "auto")
        throw Error("--fusion must be coda, unfused or auto, got '" + one_line(fusion) + "'");
    bool sm80 = false;
#ifdef CODAGPT_HAVE_CUDA
    int device = 0, major = 0;
    sm80 = cuda_device_count() > 0 && cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 8;
#endif
    if (fusion == "coda" && !sm80) throw Error("--fusion coda needs a GPU of compute capability 8.0 or newer");
    return sm80;
}

bool use_gpu(const std::string& device) {
    if (device == "cpu") return false;
    if (device == "cuda") return true;
    if (device == "auto") return cuda_device_count() > 0;
    throw Error("--device must be auto, cpu or cuda, got '" + one_line(device) + "'");
}

std::unique_ptr<Decoder> make_gpu_decoder(const ModelConfig& m, const std::vector<float>& params) {
#ifdef CODAGPT_HAVE_CUDA
    if (cuda_device_count() == 0) throw Error("no CUDA GPU is visible");
    return std::make_unique<GPT2GPUDecoder>(m, params);
#else
    (void)m;
    (void)params;
    throw Error("this build has no CUDA support (configure with nvcc on PATH)");
#endif
}

}  // namespace codagpt
