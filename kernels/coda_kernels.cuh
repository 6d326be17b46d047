// The small kernels of the fused (CODA) path beside its GEMMs (../shared/design/CODA_GPT2.md):
// folding each LayerNorm into the weights of the GEMM that consumes it (its vectors once per
// optimizer step, W~ before each GEMM that reads it), and the "tiny reduce" kernels that merge
// the partials the GEMM epilogues write. Each finalize kernel takes a row with a group of lanes (a
// warp where it has more than 16 partials), or a column with a thread a group of its partials, in
// the fixed order of epilogue.cuh's merge_row / merge_col (the host's), and applies the finalize
// formula of coda_programs.cuh; so results are deterministic.
// Partials layouts are epilogue.cuh's: rows [M, n_tiles, words], columns [n_tiles, N, words].
#pragma once
#include "common.cuh"

namespace codagpt {

// For `layers` stacked LayerNorm + linear pairs (gamma, beta [K] and W [K, N], b [N] per layer),
// the vectors of the fold W~ = diag(gamma) W (../shared/design/CODA_GPT2.md): c = column sums of
// the bf16 W~ that coda_fold_weight writes (the forward's), c_bwd = column sums of diag(gamma) W
// unrounded (the backward's: its dX GEMM multiplies by W), b~ = beta W + b (b may be null).
// w is the bf16 weight (every rank holds all of them), row-major [K, N] (N a multiple of 8, w
// 16-byte aligned), or with `transposed` stored as W^T [N, K] (the tied LM head: W = wte^T).
// Strides between layers: K*N for w, K for gamma and beta, N for b, c, c_bwd and b_folded.
void coda_fold_layernorm(float* c, float* c_bwd, float* b_folded, const bf16* w, bool transposed, const float* gamma,
                         const float* beta, const float* b, int K, int N, int layers, cudaStream_t stream);

// W~ = diag(gamma) W (bf16) of one such pair, written in w's layout: the B operand of the GEMM
// the LayerNorm is folded into, made just before it (the fused model keeps no W~ between GEMMs).
void coda_fold_weight(bf16* w_folded, const bf16* w, bool transposed, const float* gamma, int K, int N,
                      cudaStream_t stream);

// dst[i] = src[i] for n elements: fp32 copies of the bf16 weights the epilogues read as vectors.
void coda_widen(float* dst, const bf16* src, long n, cudaStream_t stream);

// LayerNorm statistics (mu, rstd) of M rows from ResidualForward / ResidualStats Welford partials.
void coda_row_stats(float* mu, float* rstd, const float* partials, int M, int n_tiles, cudaStream_t stream);

// lse and cross-entropy of M tokens from LmHeadForward's (max, sum-exp) partials and target logits.
void coda_token_loss(float* lse, float* loss, const float* partials, const float* target_logit, int M, int n_tiles,
                     cudaStream_t stream);

// The finalize of a dz producer (FoldGradient) of a folded GEMM with M tokens, N outputs and K
// inputs: m1, m2 = row sums / K; bias_grad, the bias gradient of the folded GEMM, += the column
// sums db (null: no bias, the LM head; the columns are then not summed).
void coda_fold_gradient_finalize(float* m1, float* m2, float* bias_grad, const float* m1_partials,
                                 const float* m2_partials, const float* db_partials, int M, int N, int K, int tiles_n,
                                 int tiles_m, cudaStream_t stream);

// LnBackwardX's column partials, for the N columns: bias_grad[j] (may be null), dgamma[j] and
// dbeta[j] += the column sums of bias_partials, dgamma_partials and dbeta_partials.
void coda_ln_backward_finalize(float* bias_grad, float* dgamma, float* dbeta, const float* bias_partials,
                               const float* dgamma_partials, const float* dbeta_partials, int N, int n_tiles,
                               cudaStream_t stream);

}  // namespace codagpt
