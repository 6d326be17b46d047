// Decoding with a KV cache (text generation): attention of new query rows against the cached keys
// and values, and the tied LM head for one row with fp32 logits. The rest of a decoding step reuses
// the training kernels (encoder, layernorm, gelu, residual) and cuBLASLt GEMMs with M = rows.
#pragma once
#include "common.cuh"

namespace codagpt {

// out[r, h*HS : (h+1)*HS] = softmax(q_r . k_t * scale, t = 0..pos0+r) . v_t for the n query rows
// r = 0..n-1 at positions pos0+r and every head h: causal by construction, row r sees the cache up
// to its own position only. q row r starts at q + r * q_stride (the qkv GEMM's output, stride 3C);
// the caches are [positions, C] (head h at column h*HS) and must hold positions 0..pos0+n-1.
// fp32 scores and sums in a fixed order: run-to-run identical. HS <= 256; a row's scores must fit in
// 48 KiB of shared memory (contexts up to about 11,900 positions).
void decode_attention(bf16* out, const bf16* q, int q_stride, const bf16* k_cache, const bf16* v_cache, int n,
                      int pos0, int NH, int HS, cudaStream_t stream);

// logits[v] = <x, wte[v, :]> for v < V, fp32 (bf16 products, fp32 sums): the tied LM head for one
// row, kept in fp32 because the sampler ranks and exponentiates these values, where bf16's 8-bit
// mantissa would tie neighbours. C a multiple of 8, wte 16-byte aligned.
void decode_logits(float* logits, const bf16* x, const bf16* wte, int V, int C, cudaStream_t stream);

}  // namespace codagpt
