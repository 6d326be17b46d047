// The CPU reference ops of GPT-2, in the shape of llm.c's train_gpt2.c: one function per op, each
// taking explicit pointers and sizes, forward and backward side by side. The CPU model
// (model_cpu.cpp) is built from them, and every GPU kernel test compares against them.
//
// Determinism: every output element (activation or gradient) is computed by exactly one thread,
// summing its terms in a fixed order, so results are bit-identical across runs and independent of
// the number of OpenMP threads. Backward functions accumulate (+=) into their gradient outputs.
#include "ops_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace codagpt::cpu {

namespace {

// ---------------------------------------------------------------- matrix products

// One R x W tile of out (row stride N) plus the products over k0..k1, its sums held in registers
// (the fixed sizes let the compiler keep acc out of memory).
template <typename F, long R, long W>
void nn_tile(F* out, const F* a, const F* b, long K, long N, long k0, long k1, bool overwrite) {
    F acc[R][W];
    for (long r = 0; r < R; r++)
        for (long j = 0; j < W; j++) acc[r][j] = overwrite ? F(0) : out[r * N + j];
    for (long k = k0; k < k1; k++) {
        const F* bk = b + k * N;
        for (long r = 0; r < R; r++) {
            const F ark = a[r * K + k];
#pragma omp simd
            for (long j = 0; j < W; j++) acc[r][j] += ark * bk[j];
        }
    }
    for (long r = 0; r < R; r++)
        for (long j = 0; j < W; j++) out[r * N + j] = acc[r][j];
}

// Partial tiles at the bottom and right edges: the same sums, straight from memory.
template <typename F>
void nn_edge(F* out, const F* a, const F* b, long K, long N, long rows, long cols, long k0, long k1,
             bool overwrite) {
    for (long r = 0; r < rows; r++) {
        if (overwrite) std::fill(out + r * N, out + r * N + cols, F(0));
        for (long k = k0; k < k1; k++) {
            const F ark = a[r * K + k];
            const F* bk = b + k * N;
#pragma omp simd
            for (long j = 0; j < cols; j++) out[r * N + j] += ark * bk[j];
        }
    }
}

// out[M, N] = a[M, K] b[K, N] (or += with accumulate), row-major: the one matrix product; the
// other forms go through it with a transposed operand. Threads take blocks of (MB rows, W
// columns); within a block, a K-slice of b stays in cache while the R x W tiles run down the rows.
// Every element is summed in ascending k by one thread: the result does not depend on the tiling
// or the thread count.
template <typename F>
void matmul_nn(F* out, const F* a, const F* b, long M, long K, long N, bool accumulate) {
    // A 4 x 128-byte tile of sums fits the 16 vector registers of AVX2 (or half of AVX-512's).
    constexpr long R = 4, W = 128 / sizeof(F), MB = 64, KB = 256;
    const long m_blocks = (M + MB - 1) / MB, n_blocks = (N + W - 1) / W;
#pragma omp parallel for collapse(2) schedule(static)
    for (long mb = 0; mb < m_blocks; mb++) {
        for (long nb = 0; nb < n_blocks; nb++) {
            const long m_end = std::min(M, (mb + 1) * MB), n0 = nb * W, cols = std::min(W, N - n0);
            for (long k0 = 0; k0 < K; k0 += KB) {
                const long k1 = std::min(K, k0 + KB);
                for (long m = mb * MB; m < m_end; m += R) {
                    const long rows = std::min(R, m_end - m);
                    const bool overwrite = k0 == 0 && !accumulate;
                    F* o = out + m * N + n0;
                    if (rows == R && cols == W)
                        nn_tile<F, R, W>(o, a + m * K, b + n0, K, N, k0, k1, overwrite);
                    else
                        nn_edge(o, a + m * K, b + n0, K, N, rows, cols, k0, k1, overwrite);
                }
            }
        }
    }
}

// out[C, R] = in[R, C], or += with Add
template <bool Add = false, typename F>
void transpose(F* out, const F* in, long R, long C) {
    constexpr long TB = 32;  // square tiles: reads and writes each stay within a few cache lines
#pragma omp parallel for collapse(2) schedule(static)
    for (long r0 = 0; r0 < R; r0 += TB) {
        for (long c0 = 0; c0 < C; c0 += TB) {
            for (long r = r0; r < std::min(R, r0 + TB); r++) {
                for (long c = c0; c < std::min(C, c0 + TB); c++) {
                    if (Add)
                        out[c * R + r] += in[r * C + c];
                    else
                        out[c * R + r] = in[r * C + c];
                }
            }
        }
    }
}

}  // namespace

// ---------------------------------------------------------------- ops, forward and backward

// out[b, t] = wte[token] + wpe[t]
template <typename F>
void encoder_forward(F* out, const int* inputs, const F* wte, const F* wpe, long B, long T, long C) {
#pragma omp parallel for collapse(2) schedule(static)
    for (long b = 0; b < B; b++) {
        for (long t = 0; t < T; t++) {
            F* o = out + (b * T + t) * C;
            const F* tok = wte + (long)inputs[b * T + t] * C;
            const F* pos = wpe + t * C;
            for (long c = 0; c < C; c++) o[c] = tok[c] + pos[c];
        }
    }
}

// Serial: a token id may repeat, and the scatter must add in a fixed order.
template <typename F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const int* inputs, long B, long T, long C) {
    for (long b = 0; b < B; b++) {
        for (long t = 0; t < T; t++) {
            const F* d = dout + (b * T + t) * C;
            F* dtok = dwte + (long)inputs[b * T + t] * C;
            F* dpos = dwpe + t * C;
            for (long c = 0; c < C; c++) {
                dtok[c] += d[c];
                dpos[c] += d[c];
            }
        }
    }
}

// out = (x - mean) * rstd * w + b per row of C; mean and rstd are kept for backward.
template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* x, const F* w, const F* b, long N, long C) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < N; i++) {
        const F* xi = x + i * C;
        F m = 0;
        for (long c = 0; c < C; c++) m += xi[c];
        m /= C;
        F var = 0;
        for (long c = 0; c < C; c++) var += (xi[c] - m) * (xi[c] - m);
        var /= C;
        const F r = F(1) / std::sqrt(var + F(kLayerNormEps));
        F* o = out + i * C;
        for (long c = 0; c < C; c++) o[c] = (xi[c] - m) * r * w[c] + b[c];
        mean[i] = m;
        rstd[i] = r;
    }
}

// Serial: dw and db sum over all rows, in row order.
template <typename F>
void layernorm_backward(F* dx, F* dw, F* db, const F* dout, const F* x, const F* w, const F* mean,
                        const F* rstd, long N, long C) {
    for (long i = 0; i < N; i++) {
        const F* d = dout + i * C;
        const F* xi = x + i * C;
        const F m = mean[i], r = rstd[i];
        // dx = r * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dout * w
        F dxhat_mean = 0, dxhat_xhat_mean = 0;
        for (long c = 0; c < C; c++) {
            const F xhat = (xi[c] - m) * r;
            dxhat_mean += d[c] * w[c];
            dxhat_xhat_mean += d[c] * w[c] * xhat;
        }
        dxhat_mean /= C;
        dxhat_xhat_mean /= C;
        F* dxi = dx + i * C;
        for (long c = 0; c < C; c++) {
            const F xhat = (xi[c] - m) * r;
            db[c] += d[c];
            dw[c] += xhat * d[c];
            dxi[c] += (d[c] * w[c] - dxhat_mean - xhat * dxhat_xhat_mean) * r;
        }
    }
}

// out[M, N] = inp[M, K] w[K, N] + bias (bias may be null)
template <typename F>
void matmul_forward(F* out, const F* inp, const F* w, const F* bias, long M, long K, long N) {
    if (bias) {
#pragma omp parallel for schedule(static)
        for (long m = 0; m < M; m++) std::copy(bias, bias + N, out + m * N);
    }
    matmul_nn(out, inp, w, M, K, N, /*accumulate=*/bias != nullptr);
}

// dinp += dout w^T, dw += inp^T dout, dbias += column sums of dout. scratch holds the transposed
// operand: at least max(M, N) * K elements.
template <typename F>
void matmul_backward(F* dinp, F* dw, F* dbias, const F* dout, const F* inp, const F* w, F* scratch, long M,
                     long K, long N) {
    transpose(scratch, w, K, N);
    matmul_nn(dinp, dout, scratch, M, N, K, /*accumulate=*/true);
    transpose(scratch, inp, M, K);
    matmul_nn(dw, scratch, dout, K, M, N, /*accumulate=*/true);
    for (long m = 0; m < M; m++)
        for (long n = 0; n < N; n++) dbias[n] += dout[m * N + n];
}

template <typename F>
void attention_row(F* out, F* p, const F* q, const F* keys, const F* values, long stride, long t, long hs,
                   F scale) {
    F maxv = -std::numeric_limits<F>::infinity();
    for (long t2 = 0; t2 <= t; t2++) {
        const F* k = keys + t2 * stride;
        F s = 0;
        for (long i = 0; i < hs; i++) s += q[i] * k[i];
        p[t2] = s * scale;
        maxv = std::max(maxv, p[t2]);
    }
    F sum = 0;
    for (long t2 = 0; t2 <= t; t2++) {
        p[t2] = std::exp(p[t2] - maxv);
        sum += p[t2];
    }
    for (long t2 = 0; t2 <= t; t2++) p[t2] /= sum;
    for (long i = 0; i < hs; i++) out[i] = 0;
    for (long t2 = 0; t2 <= t; t2++) {
        const F* v = values + t2 * stride;
        for (long i = 0; i < hs; i++) out[i] += p[t2] * v[i];
    }
}

// Causal self-attention over qkv [B, T, 3C] (q, k, v each [NH, hs] per token) into out [B, T, C].
// att [B, NH, T, T] keeps the softmax probabilities for backward.
template <typename F>
void attention_forward(F* out, F* att, const F* qkv, long B, long T, long C, long NH) {
    const long C3 = 3 * C, hs = C / NH;
    const F scale = F(1) / std::sqrt(F(hs));
#pragma omp parallel for collapse(3) schedule(static)
    for (long b = 0; b < B; b++) {
        for (long t = 0; t < T; t++) {
            for (long h = 0; h < NH; h++) {
                const F* keys = qkv + b * T * C3 + C + h * hs;
                F* a = att + ((b * NH + h) * T + t) * T;
                attention_row(out + (b * T + t) * C + h * hs, a, qkv + (b * T + t) * C3 + h * hs, keys, keys + C, C3,
                              t, hs, scale);
                for (long t2 = t + 1; t2 < T; t2++) a[t2] = 0;
            }
        }
    }
}

// Each (b, h) pair reads and writes only its own slices of qkv and dqkv: parallel without races.
template <typename F>
void attention_backward(F* dqkv, const F* dout, const F* qkv, const F* att, long B, long T, long C, long NH) {
    const long C3 = 3 * C, hs = C / NH;
    const F scale = F(1) / std::sqrt(F(hs));
#pragma omp parallel
    {
        std::vector<F> datt(T), dscore(T);  // one row of d(probabilities), d(scores)
#pragma omp for collapse(2) schedule(static)
        for (long b = 0; b < B; b++) {
            for (long h = 0; h < NH; h++) {
                for (long t = 0; t < T; t++) {
                    const F* a = att + ((b * NH + h) * T + t) * T;
                    const F* d = dout + (b * T + t) * C + h * hs;
                    // out = sum_t2 a[t2] v[t2]
                    for (long t2 = 0; t2 <= t; t2++) {
                        const F* v = qkv + (b * T + t2) * C3 + 2 * C + h * hs;
                        F* dv = dqkv + (b * T + t2) * C3 + 2 * C + h * hs;
                        F s = 0;
                        for (long i = 0; i < hs; i++) {
                            s += v[i] * d[i];
                            dv[i] += a[t2] * d[i];
                        }
                        datt[t2] = s;
                    }
                    // softmax: dscore = a * (datt - sum(a * datt))
                    F a_datt = 0;
                    for (long t2 = 0; t2 <= t; t2++) a_datt += a[t2] * datt[t2];
                    for (long t2 = 0; t2 <= t; t2++) dscore[t2] = a[t2] * (datt[t2] - a_datt) * scale;
                    // score = scale * q . k
                    const F* q = qkv + (b * T + t) * C3 + h * hs;
                    F* dq = dqkv + (b * T + t) * C3 + h * hs;
                    for (long t2 = 0; t2 <= t; t2++) {
                        const F* k = qkv + (b * T + t2) * C3 + C + h * hs;
                        F* dk = dqkv + (b * T + t2) * C3 + C + h * hs;
                        for (long i = 0; i < hs; i++) {
                            dq[i] += k[i] * dscore[t2];
                            dk[i] += q[i] * dscore[t2];
                        }
                    }
                }
            }
        }
    }
}

template <typename F>
void gelu_forward(F* out, const F* x, long n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        const F u = F(kGeluScale) * (x[i] + F(0.044715) * x[i] * x[i] * x[i]);
        out[i] = F(0.5) * x[i] * (F(1) + std::tanh(u));
    }
}

template <typename F>
void gelu_backward(F* dx, const F* x, const F* dout, long n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        const F u = F(kGeluScale) * (x[i] + F(0.044715) * x[i] * x[i] * x[i]);
        const F th = std::tanh(u);
        const F du_dx = F(kGeluScale) * (F(1) + F(3 * 0.044715) * x[i] * x[i]);
        const F grad = F(0.5) * (F(1) + th) + F(0.5) * x[i] * (F(1) - th * th) * du_dx;
        dx[i] += grad * dout[i];
    }
}

template <typename F>
void residual_forward(F* out, const F* a, const F* b, long n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) out[i] = a[i] + b[i];
}

template <typename F>
void residual_backward(F* da, F* db, const F* dout, long n) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        da[i] += dout[i];
        db[i] += dout[i];
    }
}

// The tied LM head: logits[M, Vp] = x[M, C] wte^T, the [in, out] product with wte_t = wte^T.
template <typename F>
void lm_head_forward(F* logits, F* wte_t, const F* x, const F* wte, long M, long C, long Vp) {
    transpose(wte_t, wte, Vp, C);
    matmul_forward(logits, x, wte_t, (const F*)nullptr, M, C, Vp);
}

// dx += dlogits wte; dwte += dlogits^T x, formed as its transpose x^T dlogits in dwte_t ([C, Vp])
// so that the long Vp dimension is the contiguous one. x_t: scratch of C * M.
template <typename F>
void lm_head_backward(F* dx, F* dwte, F* dwte_t, F* x_t, const F* dlogits, const F* x, const F* wte, long M,
                      long C, long Vp) {
    matmul_nn(dx, dlogits, wte, M, Vp, C, /*accumulate=*/true);
    transpose(x_t, x, M, C);
    matmul_nn(dwte_t, x_t, dlogits, C, M, Vp, /*accumulate=*/false);
    transpose</*Add=*/true>(dwte, dwte_t, C, Vp);
}

// Softmax over the V real logits of each row (padded columns excluded) and the cross-entropy
// losses = log(sum) - (logit[target] - max). exps keeps exp(logit - max) (padded columns 0) and
// inv_sum 1 / sum: the normalisation is left to backward, which reads every row once anyway.
template <typename F>
void softmax_crossentropy_forward(F* exps, F* inv_sum, F* losses, const F* logits, const int* targets, long M,
                                  long V, long Vp) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < M; i++) {
        const F* z = logits + i * Vp;
        F* e = exps + i * Vp;
        F maxv = z[0];
#pragma omp simd reduction(max : maxv)
        for (long v = 0; v < V; v++) maxv = std::max(maxv, z[v]);
        double sum = 0;  // 50k terms
        for (long v = 0; v < V; v++) {
            e[v] = std::exp(z[v] - maxv);
            sum += e[v];
        }
        std::fill(e + V, e + Vp, F(0));
        inv_sum[i] = F(1 / sum);
        losses[i] = F(std::log(sum) - double(z[targets[i]] - maxv));
    }
}

// In place: exps becomes dlogits = (softmax - onehot(target)) * scale; padded columns stay 0.
template <typename F>
void softmax_crossentropy_backward(F* exps, const F* inv_sum, const int* targets, long M, long V, long Vp,
                                   F scale) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < M; i++) {
        F* d = exps + i * Vp;
        const F prob_scale = inv_sum[i] * scale;
        for (long v = 0; v < V; v++) d[v] *= prob_scale;
        d[targets[i]] -= scale;
    }
}

// ---------------------------------------------------------------- instantiations: fp32 and fp64

#define CODAGPT_CPU_OPS(F)                                                                                 \
    template void encoder_forward(F*, const int*, const F*, const F*, long, long, long);                   \
    template void encoder_backward(F*, F*, const F*, const int*, long, long, long);                        \
    template void layernorm_forward(F*, F*, F*, const F*, const F*, const F*, long, long);                 \
    template void layernorm_backward(F*, F*, F*, const F*, const F*, const F*, const F*, const F*, long, long); \
    template void matmul_forward(F*, const F*, const F*, const F*, long, long, long);                      \
    template void matmul_backward(F*, F*, F*, const F*, const F*, const F*, F*, long, long, long);         \
    template void attention_forward(F*, F*, const F*, long, long, long, long);                             \
    template void attention_row(F*, F*, const F*, const F*, const F*, long, long, long, F);                \
    template void attention_backward(F*, const F*, const F*, const F*, long, long, long, long);            \
    template void gelu_forward(F*, const F*, long);                                                        \
    template void gelu_backward(F*, const F*, const F*, long);                                             \
    template void residual_forward(F*, const F*, const F*, long);                                          \
    template void residual_backward(F*, F*, const F*, long);                                               \
    template void lm_head_forward(F*, F*, const F*, const F*, long, long, long);                           \
    template void lm_head_backward(F*, F*, F*, F*, const F*, const F*, const F*, long, long, long);        \
    template void softmax_crossentropy_forward(F*, F*, F*, const F*, const int*, long, long, long);        \
    template void softmax_crossentropy_backward(F*, const F*, const int*, long, long, long, F);

CODAGPT_CPU_OPS(float)
CODAGPT_CPU_OPS(double)

}  // namespace codagpt::cpu
