// Causal multi-head self-attention as flash attention (the T x T matrix is never stored):
// cuDNN's SDPA through its backend graph API when the build has cuDNN, else our own kernel.
// qkv is the qkv GEMM's output [B, T, 3, NH, HS] (q, k, v each [B, T, NH, HS] with row stride 3C);
// out (y) is [B, T, NH, HS] = [B, T, C]; lse [B, NH, T] fp32 (log-sum-exp of each score row,
// natural log, scale 1/sqrt(HS) included) is kept for backward.
// Head size: HS in {16, 32, 64, 128} (64: every GPT-2 size; 16: gpt2-tiny); others are refused with an Error.
// Pointers must be 16-byte aligned (cudaMalloc'd buffers and offsets of whole rows are).
#pragma once
#include "common.cuh"

namespace codagpt {

class Attention {
public:
    // prefer_cudnn: use cuDNN when the build has it (tests pass false to check our own kernel).
    // deterministic = false: cuDNN's backward adds dQ with atomics (--nondeterministic-attention:
    // a step ~1% faster and a few hundred MiB smaller, results not repeatable bit for bit); our
    // own kernels are deterministic either way.
    explicit Attention(bool prefer_cudnn = true, bool deterministic = true);
    ~Attention();
    Attention(const Attention&) = delete;
    Attention& operator=(const Attention&) = delete;

    const char* backend() const;  // "cudnn", "cudnn (atomic dQ)" or "flash" (own kernel)
    bool uses_cudnn() const;      // cuDNN runs it (either form): asked for, built in and usable
    // Builds what a shape needs (cuDNN plans, workspace, backward's row-dot buffer): the only place
    // that allocates. forward/backward call it themselves when the shape changes, so a training
    // loop allocates at its first step only; call it at set-up to keep allocation out of the loop.
    void reserve(int B, int T, int NH, int HS);
    void forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int HS, cudaStream_t stream);
    // dqkv (overwritten) from dout, with qkv, out and lse of the forward.
    void backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse, int B, int T,
                  int NH, int HS, cudaStream_t stream);

private:
    struct Impl;
    Impl* impl_;
};

}  // namespace codagpt
