#include "gpu_training.hpp"

#include "adamw.cuh"

namespace codagpt {

double mean_device_loss(const float* losses, int n, cudaStream_t stream) {
    std::vector<float> host(n);
    CUDA_CHECK(cudaMemcpyAsync(host.data(), losses, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    double sum = 0;
    for (float x : host) sum += x;
    return sum / n;
}

void upload_bf16(bf16* dst, const std::vector<float>& params) {
    std::vector<bf16> rounded(params.size());
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < params.size(); i++) rounded[i] = __float2bfloat16(params[i]);
    CUDA_CHECK(cudaMemcpy(dst, rounded.data(), rounded.size() * sizeof(bf16), cudaMemcpyHostToDevice));
}

double device_grad_norm(const OptimizerBuffers& b, cudaStream_t stream) {
    float* const norm_sq = b.scalars;
    float* const norm = b.scalars + 1;
    global_norm_squared(norm_sq, b.norm_scratch, b.grads, b.n, stream);
    clip_scale(b.scalars + 2, norm, norm_sq, /*clip=*/0.0f, stream);  // the norm; the scale is set by the step
    float host_norm = 0;
    CUDA_CHECK(cudaMemcpyAsync(&host_norm, norm, sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return host_norm;
}

void device_adamw_step(const OptimizerBuffers& b, int t, double lr, const TrainConfig& c, cudaStream_t stream) {
    float* const norm_sq = b.scalars;
    float* const grad_scale = b.scalars + 2;
    clip_scale(grad_scale, nullptr, norm_sq, (float)c.grad_clip, stream);
    size_t offset = 0;
    for (const ParamInfo& info : *b.layout) {
        const AdamWArgs args{(float)lr, (float)c.beta1, (float)c.beta2, (float)c.adam_eps,
                             info.decay ? (float)c.weight_decay : 0.0f, t};
        adamw_update(b.master + offset, b.params + offset, b.grads + offset, b.m + offset, b.v + offset, info.size,
                     args, grad_scale, stream);
        offset += info.size;
    }
}

}  // namespace codagpt
