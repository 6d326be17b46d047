// What the two GPU trainers share (the unfused GPT2GPU, model_gpu.hpp, and the fused GPT2CodaGPU,
// model_coda_gpu.hpp): device buffers allocated up front and freed together, bf16 copies of fp32
// weights, and the trainable state with its optimizer step over flat parameter buffers in
// param_layout order (global gradient norm, clipping, AdamW: kernels/adamw.cuh), on one GPU or as
// one rank of a data-parallel job with ZeRO-1 (data_parallel.hpp).
#pragma once
#include <stdint.h>

#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "common.cuh"
#include "config.hpp"
#include "data_parallel.hpp"
#include "gpt2_params.hpp"
#include "step_phases.hpp"
#include "zero_shard.hpp"

namespace codagpt {

// Device buffers freed together, also when the constructor that allocates them throws halfway.
// A cudaMalloc that runs out of memory throws one line: its size, what these buffers already hold,
// the device's free memory, and `hint` (what the owner's user can change) where set.
struct DeviceBuffers {
    std::vector<void*> ptrs;
    size_t bytes = 0;  // allocated so far
    std::string hint;
    DeviceBuffers() = default;
    DeviceBuffers(const DeviceBuffers&) = delete;
    DeviceBuffers& operator=(const DeviceBuffers&) = delete;
    ~DeviceBuffers() {
        for (void* p : ptrs) cudaFree(p);
    }
    template <typename T>
    T* alloc(size_t n) {
        void* ptr = nullptr;
        const cudaError_t err = cudaMalloc(&ptr, n * sizeof(T));
        if (err == cudaErrorMemoryAllocation) {
            (void)cudaGetLastError();  // not sticky, but clear it before the caller's next call
            throw Error(out_of_memory(n * sizeof(T)));
        }
        CUDA_CHECK(err);
        ptrs.push_back(ptr);
        bytes += n * sizeof(T);
        return static_cast<T*>(ptr);
    }
    std::string out_of_memory(size_t asked) const;
};

// The mean of n per-token losses on the device (one host copy into `host`, kept for the caller,
// summed in token order on the host: the same bits run to run); synchronizes the stream.
double mean_device_loss(const float* losses, int n, cudaStream_t stream, std::vector<float>& host);

// Weights rounded to bf16 on the host as the trainer rounds its master weights (master_hi:
// to nearest, ties away from zero), then copied to dst (n = params.size()).
void upload_bf16(bf16* dst, const std::vector<float>& params);
// n bf16 values from the device as floats, after the work queued on `stream` (e.g. the logits).
std::vector<float> download_bf16(const bf16* src, size_t n, cudaStream_t stream);

// CODAGPT_DUMP (tensor_dump.hpp): layer l's bf16 tensors, after the work queued on `stream`.
struct DumpedTensor {
    const char* name;
    const bf16* data;
    size_t n;
};
void dump(int layer, std::initializer_list<DumpedTensor> tensors, cudaStream_t stream);

// The buffers of one rank's optimizer step. params and grads are the model's whole flat buffers
// (param_layout order); master_lo, m and v hold the flat elements [shard->begin, shard->end) (a
// ZeRO-1 rank's shard, or the whole model as the one shard of one rank). scalars: 3 floats (norm^2,
// norm, clip scale); norm_scratch: global_norm_scratch_floats() floats.
struct OptimizerBuffers {
    const RankShard* shard = nullptr;
    bf16* params = nullptr;          // the weights the kernels read: the fp32 masters' bf16 halves
    uint16_t* master_lo = nullptr;   // and their low halves (master_weights.cuh)
    float *grads = nullptr, *m = nullptr, *v = nullptr;
    float *scalars = nullptr, *norm_scratch = nullptr;
};

// out[0] = the sum of squares of the shard's gradients (on the device).
void device_shard_norm_squared(const OptimizerBuffers& b, float* out, cudaStream_t stream);

// Clips with the global norm^2 in scalars[0], then AdamW step t (1-based) over the shard, tensor by
// tensor (weight decay where ParamInfo::decay), writing the bf16 copies of the updated weights into
// params at their own offsets. Every element's update reads only its own values, so the shards of
// any rank count give the bits of the unsharded step. Enqueued on `stream`: does not synchronize.
void device_adamw_step(const OptimizerBuffers& b, int t, double lr, const TrainConfig& c, cudaStream_t stream);

// The parameter tensors whose gradient, in each backward, comes from weight-gradient GEMMs that
// write all of it before anything else adds to it: wte (the tied LM head's dW GEMM, then the
// embedding's kernel adds), qkv_w, proj_w, fc_w and fcproj_w (one dW GEMM a layer). Every other
// gradient is a kernel's sum into a zeroed tensor. Both GPU models keep this contract.
bool written_by_weight_gemms(const std::string& tensor);

// A GPU model's trainable state, one implementation for both models: bf16 weights (what the kernels
// read), fp32 gradients, and the optimizer state of this rank's ZeRO-1 shard (fp32 master weights,
// AdamW moments). A master weight is its bf16 weight and 16 low bits (master_weights.cuh): 16 bytes
// a parameter in all, not 18. Alone (no DataParallel) the one shard is the whole model and nothing
// is communicated. With a DataParallel of R ranks the weight and gradient buffers hold the plan's
// padded_total elements (zeros past n), the masters' low halves, m and v only the rank's chunk
// (shard_size); after each update the bf16 weights are all-gathered (both models compute with them).
// With time_phases() (--phase-times) it also times each step's phases with CUDA events
// (step_phases.hpp): recorded on the streams as the step goes, read after the update's sync.
class TrainableParams {
public:
    // alloc: the model's device allocator, in bytes (it reports running out of memory its own way).
    TrainableParams(const ModelConfig& c, std::shared_ptr<DataParallel> dp, cudaStream_t stream,
                    const std::function<void*(size_t)>& alloc);
    ~TrainableParams();
    TrainableParams(const TrainableParams&) = delete;
    TrainableParams& operator=(const TrainableParams&) = delete;
    // Device bytes the constructor allocates, for out-of-memory estimates.
    static size_t device_bytes(const ModelConfig& c, const DataParallel* dp);

    bf16* params() const { return params_; }
    float* grads() const { return grads_; }

    // Weights (every rank passes all n, param_layout order): the rank's master chunk and all bf16 copies.
    void set_params(const std::vector<float>& params);
    // Host copies of all n elements, in param_layout order. With several ranks these are collective
    // (every rank calls them) and return the values on rank 0 only, empty vectors on the others.
    std::vector<float> master_params() const;
    std::vector<float> m() const;
    std::vector<float> v() const;
    long step() const { return step_; }
    void set_optimizer_state(const std::vector<float>& m, const std::vector<float>& v, long t);
    // This rank's gradient buffer (n elements): its own micro-batches' gradients, its shard averaged
    // over the ranks once grad_norm() has run.
    std::vector<float> local_grads() const;

    // A step's gradients begin (its timing too): zeroes the gradients that kernels add into, and
    // leaves those of the matrices a backward's weight-gradient GEMMs write whole
    // (written_by_weight_gemms) to the next backward, which overwrites them. At 1.5B the memset
    // shrinks from 6.2 GB to 10 MB (1.9 ms a step on an H100).
    void zero_grad();
    // From zero_grad() to the end of the next backward (layer_grads_done(-1)): that backward writes
    // the written_by_weight_gemms tensors' gradients (GEMM beta = 0; for wte, the LM head's first
    // GEMM) instead of adding to them. Both GPU models ask it before each weight-gradient GEMM.
    bool first_backward() const { return first_backward_; }
    // Backward's report that `layer`'s gradients are complete (-1: wte, wpe, LN_f): with several
    // ranks, on the last micro-step, their reduction starts on the side stream.
    void layer_grads_done(int layer);
    // The global gradient norm before clipping: waits for the reductions, sums the shards' squares
    // in rank order; keeps norm^2 on the device for apply_update. Synchronizes.
    double grad_norm();
    // AdamW over the rank's shard with the clip from grad_norm(), then the all-gather of the
    // weights. Enqueued on the stream: the model refolds (fused path) and synchronizes.
    void apply_update(double lr, const TrainConfig& c);

    // From now on every step is timed: the events (and the DataParallel's) are created here, once.
    void time_phases();
    // The phases of the last step, once apply_update's work is complete (the models synchronize
    // after it). Reads events only: no synchronization, no effect on the numbers trained.
    StepPhases phases() const;

private:
    std::vector<float> gather(const float* shard_buf) const;
    // The shards' real elements (elem_bytes each) into full (plan_.n elements) on rank 0.
    void gather_into(void* full, const void* shard_buf, size_t elem_bytes) const;
    OptimizerBuffers buffers() const;
    ZeroPlan plan_;
    int rank_ = 0;
    std::shared_ptr<DataParallel> dp_;
    cudaStream_t stream_;
    bf16* params_ = nullptr;
    uint16_t* master_lo_ = nullptr;
    float *grads_ = nullptr, *m_ = nullptr, *v_ = nullptr;
    float *scalars_ = nullptr, *norm_scratch_ = nullptr, *norm_partials_ = nullptr;
    int step_ = 0;  // optimizer steps taken (AdamW bias correction)
    // The flat ranges zero_grad() clears: the tensors not written_by_weight_gemms, adjacent ones merged.
    std::vector<std::pair<size_t, size_t>> zeroed_;
    bool first_backward_ = false;
    // time_phases(): events on the stream where the step begins (zero_grad), its last backward
    // ends, and the optimizer begins (gradients reduced) and ends (weights gathered); else empty.
    enum { kStepBegin, kBackwardEnd, kOptimizerBegin, kOptimizerEnd, kPhaseEvents };
    std::vector<cudaEvent_t> phase_events_;
    void mark(int event);
};

}  // namespace codagpt
