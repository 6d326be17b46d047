// GEMMs of the unfused path through cuBLASLt (bf16 inputs, fp32 accumulation).
// Layouts follow the CPU reference: activations row-major [M, K]; weights row-major [K, N]
// ("[in, out]", z = x W + b), so the GPU starts from exactly the CPU reference's weights.
#pragma once
#include <cublasLt.h>

#include <map>
#include <tuple>

#include "common.cuh"

namespace codagpt {

#define CUBLAS_CHECK(call)                                                                        \
    do {                                                                                          \
        cublasStatus_t st_ = (call);                                                              \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                         \
            throw ::codagpt::Error(std::string("cuBLASLt error in ") + #call + ": status " +      \
                                   std::to_string((int)st_) + " (" __FILE__ ")");                 \
    } while (0)

// Not thread-safe, and one workspace: use one Matmul per stream that runs GEMMs concurrently.
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
    // dw[K, N] (+)= inp[M, K]^T dout[M, N]      (fp32, overwritten; or accumulated when accumulate)
    void backward_weight(float* dw, const bf16* inp, const bf16* dout, int M, int K, int N, bool accumulate,
                         cudaStream_t stream);
    // logits[M, Vp] = x[M, C] wte[Vp, C]^T (tied LM head: wte is the embedding, row-major [Vp, C])
    void forward_nt(bf16* out, const bf16* a, const bf16* b, int M, int K, int N, cudaStream_t stream);
    // dx[M, C] (+)= dlogits[M, Vp] wte[Vp, C]   (bf16)
    void backward_nt_input(bf16* da, const bf16* dout, const bf16* b, int M, int K, int N, bool accumulate,
                           cudaStream_t stream);
    // dwte[Vp, C] (+)= dlogits[M, Vp]^T x[M, C]  (fp32, overwritten; or accumulated when accumulate)
    void backward_nt_weight(float* db, const bf16* a, const bf16* dout, int M, int K, int N, bool accumulate,
                            cudaStream_t stream);

private:
    // One row-major GEMM: out[M, N] = alpha op(a) op(b) (+ bias[N]) + beta out, with op(a) [M, K] and
    // op(b) [K, N]; a is stored [M, K] (or [K, M] when trans_a), b [K, N] (or [N, K] when trans_b).
    // out is bf16, or fp32 when out_fp32.
    void gemm(void* out, bool out_fp32, const bf16* a, bool trans_a, const bf16* b, bool trans_b, const bf16* bias,
              int M, int K, int N, float alpha, float beta, cudaStream_t stream);

    // Descriptors and the heuristic's algorithm for one (shape, op, alignment): made once, reused.
    struct Plan {
        cublasLtMatmulDesc_t desc = nullptr;
        cublasLtMatrixLayout_t a = nullptr, b = nullptr, out = nullptr;
        cublasLtMatmulAlgo_t algo{};
    };
    // M, K, N, trans_a, trans_b, out_fp32, bias, beta != 0, min alignment of a|b|out|bias in bytes
    using PlanKey = std::tuple<int, int, int, bool, bool, bool, bool, bool, int>;
    const Plan& plan(const PlanKey& key);

    cublasLtHandle_t handle_ = nullptr;
    void* workspace_ = nullptr;
    size_t workspace_bytes_ = 32u << 20;
    std::map<PlanKey, Plan> plans_;
};

}  // namespace codagpt
