// The CPU reference ops of GPT-2, one function per op, forward and backward: the CPU model is built
// from them, and each GPU kernel is tested against the op it replaces. Templated on the float type
// (instantiated for float and double). Tensors are row-major; sizes are element counts.
// Backward functions accumulate (+=) into their gradient outputs.
#pragma once

namespace codagpt {

constexpr double kLayerNormEps = 1e-5;
constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2/pi), GPT-2's tanh-GELU

namespace cpu {

// out[b, t, :] = wte[inputs[b, t], :] + wpe[t, :]
template <typename F>
void encoder_forward(F* out, const int* inputs, const F* wte, const F* wpe, long B, long T, long C);
// dwte[inputs[b, t], :] += dout[b, t, :];  dwpe[t, :] += dout[b, t, :]  (serial, in (b, t) order)
template <typename F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const int* inputs, long B, long T, long C);

// out = (x - mean) * rstd * w + b per row of C (eps kLayerNormEps); mean and rstd [N] kept for backward.
template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* x, const F* w, const F* b, long N, long C);
// dx += d/dx, dw += sum_rows dout * xhat, db += sum_rows dout (rows summed in order)
template <typename F>
void layernorm_backward(F* dx, F* dw, F* db, const F* dout, const F* x, const F* w, const F* mean,
                        const F* rstd, long N, long C);

// out[M, N] = inp[M, K] w[K, N] + bias (bias may be null)
template <typename F>
void matmul_forward(F* out, const F* inp, const F* w, const F* bias, long M, long K, long N);
// dinp += dout w^T, dw += inp^T dout, dbias += column sums of dout (rows in order).
// scratch: at least max(M, N) * K elements.
template <typename F>
void matmul_backward(F* dinp, F* dw, F* dbias, const F* dout, const F* inp, const F* w, F* scratch, long M,
                     long K, long N);

// Causal self-attention over qkv [B, T, 3C] into out [B, T, C]; att [B, NH, T, T] keeps the
// softmax probabilities (zero above the diagonal) for backward. Scores scaled by 1/sqrt(C/NH).
template <typename F>
void attention_forward(F* out, F* att, const F* qkv, long B, long T, long C, long NH);
// One query row of it: p[0..t] = softmax(scale * q.k) over keys 0..t (key t2 at keys + t2 * stride),
// out[0..hs) = sum_t2 p[t2] * value t2 (at values + t2 * stride). Shared with the KV-cache sampler.
template <typename F>
void attention_row(F* out, F* p, const F* q, const F* keys, const F* values, long stride, long t, long hs,
                   F scale);
template <typename F>
void attention_backward(F* dqkv, const F* dout, const F* qkv, const F* att, long B, long T, long C, long NH);

// gelu(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
template <typename F>
void gelu_forward(F* out, const F* x, long n);
// dx += gelu'(x) * dout
template <typename F>
void gelu_backward(F* dx, const F* x, const F* dout, long n);

template <typename F>
void residual_forward(F* out, const F* a, const F* b, long n);
template <typename F>
void residual_backward(F* da, F* db, const F* dout, long n);

// The tied LM head: logits[M, Vp] = x[M, C] wte^T; wte_t: scratch of C * Vp.
template <typename F>
void lm_head_forward(F* logits, F* wte_t, const F* x, const F* wte, long M, long C, long Vp);
// dx += dlogits wte; dwte += dlogits^T x. dwte_t: scratch of C * Vp, x_t: scratch of C * M.
template <typename F>
void lm_head_backward(F* dx, F* dwte, F* dwte_t, F* x_t, const F* dlogits, const F* x, const F* wte, long M,
                      long C, long Vp);

// Softmax over the V real logits of each row (padded columns excluded) and the cross-entropy
// losses; exps keeps exp(logit - max) (padded columns 0), inv_sum 1 / sum.
template <typename F>
void softmax_crossentropy_forward(F* exps, F* inv_sum, F* losses, const F* logits, const int* targets, long M,
                                  long V, long Vp);
// In place: exps becomes dlogits = (softmax - onehot(target)) * scale; padded columns stay 0.
template <typename F>
void softmax_crossentropy_backward(F* exps, const F* inv_sum, const int* targets, long M, long V, long Vp,
                                   F scale);

}  // namespace cpu
}  // namespace codagpt
