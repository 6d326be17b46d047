// cuDNN SDPA (flash attention) through the backend graph API: not built yet (issue 3 delivered the
// own flash kernels first); available() is false, so Attention runs those.
//
// Notes for the follow-up:
//  - Both machines have cuDNN 9.19 (here /usr/local/cuda, on the H200 the Python wheel's
//    nvidia/cudnn). 9.19's headers add CUDNN_BACKEND_OPERATION_SDPA_{FWD,BWD}_DESCRIPTOR
//    (attributes Q/K/V/O/STATS/SCALE, block mask, page tables, sequence lengths) but no causal-mask
//    attribute, so a causal SDPA is still expressed as the graph the C++ frontend emits and the
//    runtime-fusion "flash" engine recognises. Forward: matmul(Q, K^T) -> pointwise MUL by the scale
//    (a 1x1x1x1 by-value tensor) -> causal mask (POINTWISE GEN_INDEX on axes 2 and 3, CMP_GE,
//    BINARY_SELECT against a by-value -inf) -> reduction MAX -> SUB -> EXP -> reduction ADD ->
//    LOG + max = Stats [B, NH, T, 1] fp32 (natural log, scale included: the same as our lse) ->
//    DIV -> matmul(P, V) = O. Intermediates are virtual fp32 tensors; engine from
//    CUDNN_HEUR_MODE_A, execution plan, variant pack with the uids of Q, K, V, O, Stats, scale.
//    Backward: the same recomputed P from Stats, D = reduction ADD of dO * O, dV = P^T dO,
//    dP = dO V^T, dS = P * (dP - D) * scale, dQ = dS K, dK = dS^T Q (transposes as strides).
//  - Layouts: Q, K, V are views of the fused [B, T, 3, NH, HS] buffer: dims [B, NH, T, HS], strides
//    [T*3C, HS, 3C, 1] (K^T: dims [B, NH, HS, T], strides [T*3C, HS, 1, 3C]); O, dO: strides
//    [T*C, HS, C, 1]; dQKV has the qkv strides.
//  - Public code that builds exactly these descriptors with thin wrappers over the backend calls:
//    NVIDIA/TransformerEngine fused_attn_f16_arbitrary_seqlen.cu (cuDNN 8.9 era), and
//    NVIDIA/cudnn-frontend include/cudnn_frontend/node/scaled_dot_product_flash_attention.h.
//  - Testing needs a GPU (cudnnCreate fails without one), so the graphs can only be debugged on the
//    device machine: test_gpu_attention's CudnnMatchesReference runs once available() is true.
#include "attention_cudnn.cuh"

namespace codagpt {

struct CudnnAttention::Impl {};

bool CudnnAttention::available() { return false; }

CudnnAttention::CudnnAttention() : impl_(new Impl) {}
CudnnAttention::~CudnnAttention() { delete impl_; }

void CudnnAttention::reserve(int, int, int, int) {
    throw Error("cuDNN attention: the SDPA backend graphs are not implemented yet (use the flash backend)");
}
void CudnnAttention::forward(bf16*, float*, const bf16*, int, int, int, int, cudaStream_t) {
    throw Error("cuDNN attention: the SDPA backend graphs are not implemented yet (use the flash backend)");
}
void CudnnAttention::backward(bf16*, const bf16*, const bf16*, const bf16*, const float*, int, int, int, int,
                              cudaStream_t) {
    throw Error("cuDNN attention: the SDPA backend graphs are not implemented yet (use the flash backend)");
}

}  // namespace codagpt
