// Row-major GEMMs through cuBLASLt, which is column-major: a row-major X[r, c] is the column-major
// X^T[c, r] with the same memory, so out = op(a) op(b) is computed as out^T = op(b)^T op(a)^T,
// b first. No transposes in memory; only operand order and the transpose flags change.
#include <algorithm>
#include <cstdint>
#include <string>

#include "matmul.cuh"

namespace codagpt {

Matmul::Matmul() {
    CUBLAS_CHECK(cublasLtCreate(&handle_));
    CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

Matmul::~Matmul() {
    // No throwing from a destructor: statuses are ignored here.
    for (auto& [key, p] : plans_) {
        cublasLtMatrixLayoutDestroy(p.a);
        cublasLtMatrixLayoutDestroy(p.b);
        cublasLtMatrixLayoutDestroy(p.out);
        cublasLtMatmulDescDestroy(p.desc);
    }
    cudaFree(workspace_);
    cublasLtDestroy(handle_);
}

void Matmul::forward(bf16* out, const bf16* inp, const bf16* w, const bf16* bias, int M, int K, int N,
                     cudaStream_t stream) {
    gemm(out, false, inp, false, w, false, bias, M, K, N, 1.0f, 0.0f, stream);
}
void Matmul::backward_input(bf16* dinp, const bf16* dout, const bf16* w, int M, int K, int N, bool accumulate,
                            cudaStream_t stream) {
    gemm(dinp, false, dout, false, w, true, nullptr, M, N, K, 1.0f, accumulate ? 1.0f : 0.0f, stream);
}
void Matmul::backward_weight(float* dw, const bf16* inp, const bf16* dout, int M, int K, int N, bool accumulate,
                             cudaStream_t stream) {
    gemm(dw, true, inp, true, dout, false, nullptr, K, M, N, 1.0f, accumulate ? 1.0f : 0.0f, stream);
}
void Matmul::forward_nt(bf16* out, const bf16* a, const bf16* b, int M, int K, int N, cudaStream_t stream) {
    gemm(out, false, a, false, b, true, nullptr, M, K, N, 1.0f, 0.0f, stream);
}
void Matmul::backward_nt_input(bf16* da, const bf16* dout, const bf16* b, int M, int K, int N, bool accumulate,
                               cudaStream_t stream) {
    gemm(da, false, dout, false, b, false, nullptr, M, N, K, 1.0f, accumulate ? 1.0f : 0.0f, stream);
}
void Matmul::backward_nt_weight(float* db, const bf16* a, const bf16* dout, int M, int K, int N, bool accumulate,
                                cudaStream_t stream) {
    gemm(db, true, dout, true, a, false, nullptr, N, M, K, 1.0f, accumulate ? 1.0f : 0.0f, stream);
}

// Largest power of two (at most 256, cuBLASLt's default assumption) dividing the address.
static int alignment_of(const void* p) {
    if (p == nullptr) return 256;
    const auto addr = (uintptr_t)p;
    int align = 256;
    while (align > 1 && addr % align != 0) align /= 2;
    return align;
}

void Matmul::gemm(void* out, bool out_fp32, const bf16* a, bool trans_a, const bf16* b, bool trans_b,
                  const bf16* bias, int M, int K, int N, float alpha, float beta, cudaStream_t stream) {
    if (M <= 0 || K <= 0 || N <= 0)
        throw Error("Matmul: empty GEMM M=" + std::to_string(M) + " K=" + std::to_string(K) +
                    " N=" + std::to_string(N));
    int align = alignment_of(a);
    for (const void* p : {(const void*)b, (const void*)out, (const void*)bias}) align = std::min(align, alignment_of(p));
    const Plan& p = plan({M, K, N, trans_a, trans_b, out_fp32, bias != nullptr, beta != 0.0f, align});
    if (bias != nullptr)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    // C = D: beta reads the output in place.
    CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, b, p.b, a, p.a, &beta, out, p.out, out, p.out, &p.algo,
                                workspace_, workspace_bytes_, stream));
}

const Matmul::Plan& Matmul::plan(const PlanKey& key) {
    if (auto it = plans_.find(key); it != plans_.end()) return it->second;
    const auto [M, K, N, trans_a, trans_b, out_fp32, has_bias, accumulate, align] = key;

    Plan p;
    // cuBLASLt's first operand is op(b)^T [N, K]: b is stored [K, N] row-major = [N, K] column-major
    // (no transpose), or [N, K] row-major = [K, N] column-major (transpose).
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, trans_b ? K : N, trans_b ? N : K, trans_b ? K : N));
    // Second operand op(a)^T [K, M], likewise.
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, trans_a ? M : K, trans_a ? K : M, trans_a ? M : K));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.out, out_fp32 ? CUDA_R_32F : CUDA_R_16BF, N, M, N));

    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof(op_b)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof(op_a)));
    // The bias runs along out^T's rows (out's columns, N), broadcast over tokens.
    const cublasLtEpilogue_t epilogue = has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (has_bias) {
        const cudaDataType_t bias_type = CUDA_R_16BF;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                    sizeof(bias_type)));
    }

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = workspace_bytes_;
    const uint32_t align_bytes = (uint32_t)align;
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align_bytes, sizeof(align_bytes)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.b, p.a, p.out, p.out, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
        cublasLtMatrixLayoutDestroy(p.a);
        cublasLtMatrixLayoutDestroy(p.b);
        cublasLtMatrixLayoutDestroy(p.out);
        cublasLtMatmulDescDestroy(p.desc);
        throw Error("cuBLASLt: cublasLtMatmulAlgoGetHeuristic found no algorithm (status " + std::to_string((int)st) +
                    ") for M=" + std::to_string(M) + " K=" + std::to_string(K) + " N=" + std::to_string(N) +
                    (trans_a ? " a^T" : "") + (trans_b ? " b^T" : "") + (out_fp32 ? " fp32 out" : " bf16 out") +
                    (has_bias ? " bias" : "") + (accumulate ? " beta=1" : "") +
                    " alignment " + std::to_string(align));
    }
    p.algo = result.algo;
    return plans_.emplace(key, p).first->second;
}

}  // namespace codagpt
