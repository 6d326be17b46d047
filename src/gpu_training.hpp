// What the two GPU trainers share (the unfused GPT2GPU, model_gpu.hpp, and the fused GPT2CodaGPU,
// model_coda_gpu.hpp): device buffers allocated up front and freed together, bf16 copies of fp32
// weights, and the optimizer step over flat parameter buffers in param_layout order (global
// gradient norm, clipping, AdamW: kernels/adamw.cuh).
#pragma once
#include <vector>

#include "common.cuh"
#include "config.hpp"
#include "gpt2_params.hpp"

namespace codagpt {

// Device buffers freed together, also when the constructor that allocates them throws halfway.
struct DeviceBuffers {
    std::vector<void*> ptrs;
    DeviceBuffers() = default;
    DeviceBuffers(const DeviceBuffers&) = delete;
    DeviceBuffers& operator=(const DeviceBuffers&) = delete;
    ~DeviceBuffers() {
        for (void* p : ptrs) cudaFree(p);
    }
    template <typename T>
    T* alloc(size_t n) {
        ptrs.push_back(nullptr);
        CUDA_CHECK(cudaMalloc(&ptrs.back(), n * sizeof(T)));
        return static_cast<T*>(ptrs.back());
    }
};

// The mean of n per-token losses on the device (one host copy, summed in token order on the host:
// the same bits run to run); synchronizes the stream.
double mean_device_loss(const float* losses, int n, cudaStream_t stream);

// Weights rounded to bf16 (nearest even) on the host, then copied to dst (n = params.size()).
void upload_bf16(bf16* dst, const std::vector<float>& params);

// The buffers of an optimizer step: n elements each, flat in `layout` order, and the step's device
// scratch: scalars (3 floats: norm^2, norm, clip scale) and norm_scratch
// (global_norm_scratch_floats() floats).
struct OptimizerBuffers {
    const std::vector<ParamInfo>* layout = nullptr;
    size_t n = 0;
    float* master = nullptr;  // fp32 weights of record
    bf16* params = nullptr;   // their bf16 copies, which the kernels read
    float *grads = nullptr, *m = nullptr, *v = nullptr;
    float *scalars = nullptr, *norm_scratch = nullptr;
};

// The global L2 norm of the gradients, computed on the device and kept there (scalars[0] = norm^2)
// for device_adamw_step; synchronizes to return it.
double device_grad_norm(const OptimizerBuffers& b, cudaStream_t stream);

// Clips with the norm device_grad_norm left on the device, then AdamW step t (1-based) over every
// tensor (weight decay where ParamInfo::decay). Enqueued on `stream`: does not synchronize.
void device_adamw_step(const OptimizerBuffers& b, int t, double lr, const TrainConfig& c, cudaStream_t stream);

}  // namespace codagpt
