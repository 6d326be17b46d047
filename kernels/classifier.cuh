// Fused softmax + cross-entropy + dlogits over the (padded) vocabulary, one pass pair per row.
#pragma once
#include "common.cuh"

namespace codagpt {

// For each of M rows of logits [M, Vp] (only the first V columns are real):
//   losses[i] = logsumexp(logits[i, :V]) - logits[i, targets[i]]    (fp32)
//   if write_dlogits: logits[i, :] becomes (softmax - onehot(target)) * dloss, padded columns 0,
//   in place (bf16).  dloss = 1 / (B*T*grad_accum) for the mean loss over an optimizer step.
// Needs 0 <= targets[i] < V, Vp a multiple of 8 (128 in the model) and logits 16-byte aligned.
// Deterministic: the same logits give the same bits. No scratch memory.
void fused_classifier(bf16* logits, float* losses, const int* targets, int M, int V, int Vp, float dloss,
                      bool write_dlogits, cudaStream_t stream);

}  // namespace codagpt
