// GEMMs of the unfused path through cuBLASLt (bf16 inputs, fp32 accumulation).
// Layouts follow the CPU reference: activations row-major [M, K]; weights row-major [K, N]
// ("[in, out]", z = x W + b), so the GPU starts from exactly the CPU reference's weights.
#pragma once
#include <cublasLt.h>
#include "common.cuh"

namespace codagpt {

#define CUBLAS_CHECK(call)                                                                        \
    do {                                                                                          \
        cublasStatus_t st_ = (call);                                                              \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                         \
            throw ::codagpt::Error(std::string("cuBLASLt error in ") + #call + ": status " +      \
                                   std::to_string((int)st_) + " (" __FILE__ ")");                 \
    } while (0)

class Matmul {
public:
    Matmul();  // creates the handle and a 32 MiB workspace
    ~Matmul();
    Matmul(const Matmul&) = delete;
    Matmul& operator=(const Matmul&) = delete;

    // out[M, N] = inp[M, K] w[K, N] (+ bias[N], bias may be null)      (bf16 out)
    void forward(bf16* out, const bf16* inp, const bf16* w, const bf16* bias, int M, int K, int N,
                 cudaStream_t stream);
    // dinp[M, K] = dout[M, N] w[K, N]^T      (bf16, overwritten; or accumulated when accumulate)
    void backward_input(bf16* dinp, const bf16* dout, const bf16* w, int M, int K, int N, bool accumulate,
                        cudaStream_t stream);
    // dw[K, N] += inp[M, K]^T dout[M, N]      (fp32, accumulated)
    void backward_weight(float* dw, const bf16* inp, const bf16* dout, int M, int K, int N, cudaStream_t stream);
    // logits[M, Vp] = x[M, C] wte[Vp, C]^T (tied LM head: wte is the embedding, row-major [Vp, C])
    void forward_nt(bf16* out, const bf16* a, const bf16* b, int M, int K, int N, cudaStream_t stream);
    // dx[M, C] (+)= dlogits[M, Vp] wte[Vp, C]   (bf16)
    void backward_nt_input(bf16* da, const bf16* dout, const bf16* b, int M, int K, int N, bool accumulate,
                           cudaStream_t stream);
    // dwte[Vp, C] += dlogits[M, Vp]^T x[M, C]  (fp32)
    void backward_nt_weight(float* db, const bf16* a, const bf16* dout, int M, int K, int N, cudaStream_t stream);

private:
    cublasLtHandle_t handle_ = nullptr;
    void* workspace_ = nullptr;
    size_t workspace_bytes_ = 32u << 20;
};

}  // namespace codagpt
