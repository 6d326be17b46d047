#include "backend_coda_gpu.hpp"

#include "common.hpp"
#include "device.hpp"
#ifdef CODAGPT_HAVE_CUDA
#include <cuda_runtime.h>

#include "model_coda_gpu.hpp"
#include "sample.hpp"
#endif

namespace codagpt {

#ifdef CODAGPT_HAVE_CUDA
namespace {

// The unfused GPUBackend's twin (backend.cpp), with the same size checks and messages (which could
// move beside TrainBackend in backend.hpp to be shared).
class CodaGPUBackend final : public TrainBackend {
public:
    explicit CodaGPUBackend(const TrainConfig& c) : model_(c.model, c.batch_size, c.seq_len) {
        model_.set_params(gpt2_init_params(c.model, c.seed));  // the CPU reference's weights for this seed
    }
    std::string describe() const override {
        return "GPU " + cuda_device_name() + " (CODA fused, bf16, attention " + model_.attention_backend() + ")";
    }
    size_t num_params() const override { return model_.num_params(); }
    void zero_grad() override { model_.zero_grad(); }
    double forward_backward(const int* inputs, const int* targets, float grad_scale) override {
        const double loss = model_.forward(inputs, targets, /*backward_next=*/true, grad_scale);
        model_.backward();
        return loss;
    }
    double evaluate(const int* inputs, const int* targets) override { return model_.forward(inputs, targets, false); }
    double grad_norm() override { return model_.grad_norm(); }
    void apply_update(double lr, double, const TrainConfig& c) override { model_.apply_update(lr, c); }
    TrainState save_state() const override {
        GPT2GPU::OptimizerState o = model_.optimizer_state();
        return {model_.master_params(), std::move(o.m), std::move(o.v), o.t};
    }
    void load_state(const TrainState& s) override {
        const size_t n = model_.num_params();
        if (s.params.size() != n || s.m.size() != n || s.v.size() != n)
            throw Error("training state holds " + std::to_string(s.params.size()) + " parameters and " +
                        std::to_string(s.m.size()) + "/" + std::to_string(s.v.size()) +
                        " AdamW moments; this model has " + std::to_string(n));
        if (s.t < 0) throw Error("training state: negative AdamW step count " + std::to_string(s.t));
        model_.set_params(s.params);  // master weights, their bf16 copies and the folds, as after an update
        model_.set_optimizer_state(s.m, s.v, s.t);
    }
    void load_params(const std::vector<float>& params) override {
        if (params.size() != model_.num_params())
            throw Error("weights hold " + std::to_string(params.size()) + " parameters; this model has " +
                        std::to_string(model_.num_params()));
        model_.set_params(params);
    }
    std::unique_ptr<Decoder> make_decoder() const override { return model_.make_decoder(); }
    double device_memory_mib() const override {
        size_t free = 0, total = 0;
        if (cudaMemGetInfo(&free, &total) != cudaSuccess) return -1;
        return (total - free) / (1024.0 * 1024.0);
    }

private:
    GPT2CodaGPU model_;
};

}  // namespace

#endif

std::unique_ptr<TrainBackend> make_coda_gpu_backend(const TrainConfig& c, const GPUBackendOptions&) {
#ifdef CODAGPT_HAVE_CUDA
    if (cuda_device_count() == 0) throw Error("no CUDA GPU is visible");
    return std::make_unique<CodaGPUBackend>(c);
#else
    (void)c;
    throw Error("this build has no CUDA support (configure with nvcc on PATH)");
#endif
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

}  // namespace codagpt
