// The CPU reference GPT-2, in the shape of llm.c's train_gpt2.c: one function per op, each taking
// explicit pointers and sizes, forward and backward side by side.
//
// Determinism: every output element (activation or gradient) is computed by exactly one thread,
// summing its terms in a fixed order, so results are bit-identical across runs and independent of
// the number of OpenMP threads. Backward functions accumulate (+=) into their gradient outputs.
#include "model_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <limits>
#include <stdexcept>

#include "rng.hpp"

namespace codagpt {

namespace {

// ---------------------------------------------------------------- parameter and activation lists

enum class Init { zeros, ones, normal, normal_residual };

// The parameter tensors in storage order: param_layout(), the buffer views and init() all walk
// this one list, so a tensor is always addressed by name. fn(name, field, size, decay, init).
template <typename F, typename Fn>
void for_each_param(GPT2Params<F>& p, const ModelConfig& m, Fn&& fn) {
    const size_t L = m.n_layer, C = m.n_embd, Vp = m.padded_vocab(), maxT = m.max_seq_len;
    fn("wte", p.wte, Vp * C, true, Init::normal);
    fn("wpe", p.wpe, maxT * C, true, Init::normal);
    fn("ln1_w", p.ln1_w, L * C, false, Init::ones);
    fn("ln1_b", p.ln1_b, L * C, false, Init::zeros);
    fn("qkv_w", p.qkv_w, L * C * 3 * C, true, Init::normal);
    fn("qkv_b", p.qkv_b, L * 3 * C, false, Init::zeros);
    fn("proj_w", p.proj_w, L * C * C, true, Init::normal_residual);
    fn("proj_b", p.proj_b, L * C, false, Init::zeros);
    fn("ln2_w", p.ln2_w, L * C, false, Init::ones);
    fn("ln2_b", p.ln2_b, L * C, false, Init::zeros);
    fn("fc_w", p.fc_w, L * C * 4 * C, true, Init::normal);
    fn("fc_b", p.fc_b, L * 4 * C, false, Init::zeros);
    fn("fcproj_w", p.fcproj_w, L * 4 * C * C, true, Init::normal_residual);
    fn("fcproj_b", p.fcproj_b, L * C, false, Init::zeros);
    fn("lnf_w", p.lnf_w, C, false, Init::ones);
    fn("lnf_b", p.lnf_b, C, false, Init::zeros);
}

// One layer's slice of the stacked parameters.
template <typename F>
struct LayerParams {
    F *ln1_w, *ln1_b, *qkv_w, *qkv_b, *proj_w, *proj_b, *ln2_w, *ln2_b, *fc_w, *fc_b, *fcproj_w, *fcproj_b;
};

template <typename F>
LayerParams<F> layer_params(const GPT2Params<F>& p, size_t l, size_t C) {
    return {p.ln1_w + l * C,         p.ln1_b + l * C,  p.qkv_w + l * C * 3 * C, p.qkv_b + l * 3 * C,
            p.proj_w + l * C * C,    p.proj_b + l * C, p.ln2_w + l * C,         p.ln2_b + l * C,
            p.fc_w + l * C * 4 * C,  p.fc_b + l * 4 * C, p.fcproj_w + l * 4 * C * C, p.fcproj_b + l * C};
}

// Activations kept by forward for backward; the gradient buffer uses the same layout (its
// mean/rstd/att/inv_sum/losses slots stay unused). Layer tensors are stacked over layers.
template <typename F>
struct Acts {
    F* encoded;    // [B, T, C]  token + position embedding: the residual entering layer 0
    F* ln1;        // [L, B, T, C]
    F* ln1_mean;   // [L, B, T]
    F* ln1_rstd;   // [L, B, T]
    F* qkv;        // [L, B, T, 3C]
    F* atty;       // [L, B, T, C]  attention output, heads side by side
    F* att;        // [L, B, NH, T, T]  softmax probabilities, zero above the diagonal
    F* attproj;    // [L, B, T, C]
    F* residual2;  // [L, B, T, C]
    F* ln2;        // [L, B, T, C]
    F* ln2_mean;   // [L, B, T]
    F* ln2_rstd;   // [L, B, T]
    F* fch;        // [L, B, T, 4C]  pre-GELU
    F* fch_gelu;   // [L, B, T, 4C]
    F* fcproj;     // [L, B, T, C]
    F* residual3;  // [L, B, T, C]  the layer's output
    F* lnf;        // [B, T, C]
    F* lnf_mean;   // [B, T]
    F* lnf_rstd;   // [B, T]
    F* inv_sum;    // [B, T]  1 / sum of the row's softmax exponentials
    F* losses;     // [B, T]
};

template <typename F, typename Fn>
void for_each_act(Acts<F>& a, const ModelConfig& m, size_t B, size_t T, Fn&& fn) {
    const size_t L = m.n_layer, C = m.n_embd, NH = m.n_head, BT = B * T;
    fn(a.encoded, BT * C);
    fn(a.ln1, L * BT * C);
    fn(a.ln1_mean, L * BT);
    fn(a.ln1_rstd, L * BT);
    fn(a.qkv, L * BT * 3 * C);
    fn(a.atty, L * BT * C);
    fn(a.att, L * B * NH * T * T);
    fn(a.attproj, L * BT * C);
    fn(a.residual2, L * BT * C);
    fn(a.ln2, L * BT * C);
    fn(a.ln2_mean, L * BT);
    fn(a.ln2_rstd, L * BT);
    fn(a.fch, L * BT * 4 * C);
    fn(a.fch_gelu, L * BT * 4 * C);
    fn(a.fcproj, L * BT * C);
    fn(a.residual3, L * BT * C);
    fn(a.lnf, BT * C);
    fn(a.lnf_mean, BT);
    fn(a.lnf_rstd, BT);
    fn(a.inv_sum, BT);
    fn(a.losses, BT);
}

template <typename F>
size_t acts_size(const ModelConfig& m, size_t B, size_t T) {
    Acts<F> unused{};
    size_t n = 0;
    for_each_act(unused, m, B, T, [&](F*&, size_t size) { n += size; });
    return n;
}

template <typename F>
Acts<F> acts_view(F* base, const ModelConfig& m, size_t B, size_t T) {
    Acts<F> a{};
    for_each_act(a, m, B, T, [&](F*& ptr, size_t size) {
        ptr = base;
        base += size;
    });
    return a;
}

// One layer's slice of the stacked activations.
template <typename F>
struct LayerActs {
    F *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *attproj, *residual2, *ln2, *ln2_mean, *ln2_rstd,
        *fch, *fch_gelu, *fcproj, *residual3;
};

template <typename F>
LayerActs<F> layer_acts(const Acts<F>& a, const ModelConfig& m, size_t l, size_t B, size_t T) {
    const size_t C = m.n_embd, NH = m.n_head, BT = B * T, BTC = BT * C;
    return {a.ln1 + l * BTC,        a.ln1_mean + l * BT,  a.ln1_rstd + l * BT,  a.qkv + l * 3 * BTC,
            a.atty + l * BTC,       a.att + l * B * NH * T * T, a.attproj + l * BTC, a.residual2 + l * BTC,
            a.ln2 + l * BTC,        a.ln2_mean + l * BT,  a.ln2_rstd + l * BT,  a.fch + l * 4 * BTC,
            a.fch_gelu + l * 4 * BTC, a.fcproj + l * BTC, a.residual3 + l * BTC};
}

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

constexpr double kLayerNormEps = 1e-5;

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
                const F* q = qkv + (b * T + t) * C3 + h * hs;
                F* a = att + ((b * NH + h) * T + t) * T;
                F maxv = -std::numeric_limits<F>::infinity();
                for (long t2 = 0; t2 <= t; t2++) {
                    const F* k = qkv + (b * T + t2) * C3 + C + h * hs;
                    F s = 0;
                    for (long i = 0; i < hs; i++) s += q[i] * k[i];
                    a[t2] = s * scale;
                    maxv = std::max(maxv, a[t2]);
                }
                F sum = 0;
                for (long t2 = 0; t2 <= t; t2++) {
                    a[t2] = std::exp(a[t2] - maxv);
                    sum += a[t2];
                }
                for (long t2 = 0; t2 <= t; t2++) a[t2] /= sum;
                for (long t2 = t + 1; t2 < T; t2++) a[t2] = 0;

                F* o = out + (b * T + t) * C + h * hs;
                for (long i = 0; i < hs; i++) o[i] = 0;
                for (long t2 = 0; t2 <= t; t2++) {
                    const F* v = qkv + (b * T + t2) * C3 + 2 * C + h * hs;
                    for (long i = 0; i < hs; i++) o[i] += a[t2] * v[i];
                }
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

// GPT-2's tanh approximation: gelu(x) = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2/pi)

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

}  // namespace

// ---------------------------------------------------------------- the model

std::vector<ParamInfo> param_layout(const ModelConfig& m) {
    std::vector<ParamInfo> layout;
    GPT2Params<float> unused{};
    for_each_param(unused, m, [&](const char* name, float*&, size_t size, bool decay, Init) {
        layout.push_back({name, size, decay});
    });
    return layout;
}

template <typename F>
GPT2CPU<F>::GPT2CPU(const ModelConfig& cfg) : cfg_(cfg), layout_(param_layout(cfg)) {
    size_t n = 0;
    for (const ParamInfo& t : layout_) n += t.size;
    params.assign(n, F(0));
    grads.assign(n, F(0));
    wte_t_.resize((size_t)cfg.n_embd * cfg.padded_vocab());
}

template <typename F>
GPT2Params<F> GPT2CPU<F>::view(F* base) const {
    GPT2Params<F> v{};
    for_each_param(v, cfg_, [&](const char*, F*& ptr, size_t size, bool, Init) {
        ptr = base;
        base += size;
    });
    return v;
}

// Draw order (GPU paths reproduce these weights from the same seed): one Rng(seed) stream, tensors
// in param_layout order, elements in storage order, one Rng::normal() per drawn element, scaled
// in double and then rounded to F. Drawn: wte (real vocabulary rows only; the padded rows are 0),
// wpe, qkv_w, fc_w with std 0.02; proj_w, fcproj_w with 0.02 / sqrt(2L). Nothing is drawn for
// biases (0) and LayerNorm weights (1) and biases (0).
template <typename F>
void GPT2CPU<F>::init(uint64_t seed) {
    Rng rng(seed);
    GPT2Params<F> pv = p();
    const F* wte = pv.wte;
    const size_t real_wte = (size_t)cfg_.vocab_size * cfg_.n_embd;
    const double std_normal = 0.02, std_residual = 0.02 / std::sqrt(2.0 * cfg_.n_layer);
    for_each_param(pv, cfg_, [&](const char*, F*& ptr, size_t size, bool, Init init) {
        std::fill(ptr, ptr + size, init == Init::ones ? F(1) : F(0));
        if (init != Init::normal && init != Init::normal_residual) return;
        const double sigma = init == Init::normal ? std_normal : std_residual;
        const size_t drawn = ptr == wte ? real_wte : size;
        for (size_t i = 0; i < drawn; i++) ptr[i] = F(sigma * rng.normal());
    });
}

template <typename F>
void GPT2CPU<F>::zero_grad() {
    std::fill(grads.begin(), grads.end(), F(0));
}

template <typename F>
void GPT2CPU<F>::ensure_activations(int B, int T) {
    if (B == B_ && T == T_) return;
    B_ = B;
    T_ = T;
    const size_t n = acts_size<F>(cfg_, B, T), nlogits = (size_t)B * T * cfg_.padded_vocab();
    acts_.assign(n, F(0));
    dacts_.assign(n, F(0));
    logits_.assign(nlogits, F(0));
    dlogits_.assign(nlogits, F(0));
    scratch_.resize((size_t)std::max(B * T, cfg_.n_embd) * 4 * cfg_.n_embd);  // max(M, N) * K of any product
    inputs_.resize((size_t)B * T);
    targets_.resize((size_t)B * T);
}

template <typename F>
F GPT2CPU<F>::forward(const int* inputs, const int* targets, int B, int T) {
    if (B < 1 || T < 1 || T > cfg_.max_seq_len)
        throw std::invalid_argument("GPT2CPU::forward: bad batch shape " + std::to_string(B) + "x" +
                                    std::to_string(T));
    ensure_activations(B, T);
    const long L = cfg_.n_layer, C = cfg_.n_embd, NH = cfg_.n_head, V = cfg_.vocab_size,
               Vp = cfg_.padded_vocab(), BT = (long)B * T;
    std::copy(inputs, inputs + BT, inputs_.begin());
    const GPT2Params<F> pv = p();
    const Acts<F> a = acts_view(acts_.data(), cfg_, B, T);

    encoder_forward(a.encoded, inputs, pv.wte, pv.wpe, B, T, C);
    for (long l = 0; l < L; l++) {
        const LayerParams<F> lp = layer_params(pv, l, C);
        const LayerActs<F> la = layer_acts(a, cfg_, l, B, T);
        const F* residual = l == 0 ? a.encoded : layer_acts(a, cfg_, l - 1, B, T).residual3;
        layernorm_forward(la.ln1, la.ln1_mean, la.ln1_rstd, residual, lp.ln1_w, lp.ln1_b, BT, C);
        matmul_forward(la.qkv, la.ln1, lp.qkv_w, lp.qkv_b, BT, C, 3 * C);
        attention_forward(la.atty, la.att, la.qkv, B, T, C, NH);
        matmul_forward(la.attproj, la.atty, lp.proj_w, lp.proj_b, BT, C, C);
        residual_forward(la.residual2, residual, la.attproj, BT * C);
        layernorm_forward(la.ln2, la.ln2_mean, la.ln2_rstd, la.residual2, lp.ln2_w, lp.ln2_b, BT, C);
        matmul_forward(la.fch, la.ln2, lp.fc_w, lp.fc_b, BT, C, 4 * C);
        gelu_forward(la.fch_gelu, la.fch, BT * 4 * C);
        matmul_forward(la.fcproj, la.fch_gelu, lp.fcproj_w, lp.fcproj_b, BT, 4 * C, C);
        residual_forward(la.residual3, la.residual2, la.fcproj, BT * C);
    }
    const F* last = layer_acts(a, cfg_, L - 1, B, T).residual3;
    layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, last, pv.lnf_w, pv.lnf_b, BT, C);
    lm_head_forward(logits_.data(), wte_t_.data(), a.lnf, pv.wte, BT, C, Vp);

    backward_ready_ = targets != nullptr;
    if (!targets) return F(0);
    std::copy(targets, targets + BT, targets_.begin());
    softmax_crossentropy_forward(dlogits_.data(), a.inv_sum, a.losses, logits_.data(), targets, BT, V, Vp);
    double sum = 0;
    for (long i = 0; i < BT; i++) sum += a.losses[i];
    return F(sum / BT);
}

template <typename F>
void GPT2CPU<F>::backward(F grad_scale) {
    if (!backward_ready_) throw std::logic_error("GPT2CPU::backward needs a forward() with targets first");
    backward_ready_ = false;
    const long L = cfg_.n_layer, C = cfg_.n_embd, NH = cfg_.n_head, V = cfg_.vocab_size,
               Vp = cfg_.padded_vocab(), B = B_, T = T_, BT = B * T;
    const GPT2Params<F> pv = p(), gv = g();
    const Acts<F> a = acts_view(acts_.data(), cfg_, B, T);
    std::fill(dacts_.begin(), dacts_.end(), F(0));
    const Acts<F> d = acts_view(dacts_.data(), cfg_, B, T);

    F* dlogits = dlogits_.data();
    softmax_crossentropy_backward(dlogits, a.inv_sum, targets_.data(), BT, V, Vp, grad_scale / F(BT));
    lm_head_backward(d.lnf, gv.wte, wte_t_.data(), scratch_.data(), dlogits, a.lnf, pv.wte, BT, C, Vp);
    const LayerActs<F> last = layer_acts(a, cfg_, L - 1, B, T), dlast = layer_acts(d, cfg_, L - 1, B, T);
    layernorm_backward(dlast.residual3, gv.lnf_w, gv.lnf_b, d.lnf, last.residual3, pv.lnf_w, a.lnf_mean,
                       a.lnf_rstd, BT, C);
    for (long l = L - 1; l >= 0; l--) {
        const LayerParams<F> lp = layer_params(pv, l, C), lg = layer_params(gv, l, C);
        const LayerActs<F> la = layer_acts(a, cfg_, l, B, T), ld = layer_acts(d, cfg_, l, B, T);
        const F* residual = l == 0 ? a.encoded : layer_acts(a, cfg_, l - 1, B, T).residual3;
        F* dresidual = l == 0 ? d.encoded : layer_acts(d, cfg_, l - 1, B, T).residual3;
        residual_backward(ld.residual2, ld.fcproj, ld.residual3, BT * C);
        matmul_backward(ld.fch_gelu, lg.fcproj_w, lg.fcproj_b, ld.fcproj, la.fch_gelu, lp.fcproj_w, scratch_.data(),
                        BT, 4 * C, C);
        gelu_backward(ld.fch, la.fch, ld.fch_gelu, BT * 4 * C);
        matmul_backward(ld.ln2, lg.fc_w, lg.fc_b, ld.fch, la.ln2, lp.fc_w, scratch_.data(), BT, C, 4 * C);
        layernorm_backward(ld.residual2, lg.ln2_w, lg.ln2_b, ld.ln2, la.residual2, lp.ln2_w, la.ln2_mean,
                           la.ln2_rstd, BT, C);
        residual_backward(dresidual, ld.attproj, ld.residual2, BT * C);
        matmul_backward(ld.atty, lg.proj_w, lg.proj_b, ld.attproj, la.atty, lp.proj_w, scratch_.data(), BT, C, C);
        attention_backward(ld.qkv, ld.atty, la.qkv, la.att, B, T, C, NH);
        matmul_backward(ld.ln1, lg.qkv_w, lg.qkv_b, ld.qkv, la.ln1, lp.qkv_w, scratch_.data(), BT, C, 3 * C);
        layernorm_backward(dresidual, lg.ln1_w, lg.ln1_b, ld.ln1, residual, lp.ln1_w, la.ln1_mean, la.ln1_rstd,
                           BT, C);
    }
    encoder_backward(gv.wte, gv.wpe, d.encoded, inputs_.data(), B, T, C);
}

template class GPT2CPU<float>;
template class GPT2CPU<double>;

}  // namespace codagpt
