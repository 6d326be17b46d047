// Internal interface between attention.cu (dispatch) and attention_cudnn.cu (cuDNN SDPA through
// the backend graph API). Only used when the build has cuDNN (CODAGPT_HAVE_CUDNN).
#pragma once
#include "common.cuh"

namespace codagpt {

// Owns the cuDNN handle, the forward/backward execution plans of one shape and their workspace.
class CudnnAttention {
public:
    // Whether this build's cuDNN path can run at all; Attention falls back to the own kernels if not.
    static bool available();

    // deterministic (the trainer's form): dQ written straight from its product, the same bits every
    // run. false: dQ through an fp32 accumulator the engine fills with atomics (bench_attention
    // prices the difference).
    explicit CudnnAttention(bool deterministic = true);
    ~CudnnAttention();
    bool deterministic() const;  // the backward form asked for
    CudnnAttention(const CudnnAttention&) = delete;
    CudnnAttention& operator=(const CudnnAttention&) = delete;

    // Builds (once per shape) both graphs, their plans, and the workspace; throws Error naming the
    // cuDNN call that failed.
    void reserve(int B, int T, int NH, int HS);
    void forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int HS, cudaStream_t stream);
    void backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse, int B, int T,
                  int NH, int HS, cudaStream_t stream);

private:
    struct Impl;
    Impl* impl_;
};

}  // namespace codagpt
