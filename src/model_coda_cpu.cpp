// The fused (CODA) GPT-2 schedule, step by step as ../shared/design/CODA_GPT2.md numbers it
// ("Forward schedule of one layer", "Backward schedule of one layer"). Each GEMM is one
// emulate_gemm call with its epilogue program; each "tiny reduce" is a finalize loop over the
// partials the epilogues wrote. The formulas live in kernels/coda_programs.cuh, not here.
//
// One step the design doc leaves implicit: layer 0's LN1 needs the row statistics of the
// embedding output, which no GEMM produces. Here a stats pass over the stored embedding
// (ResidualStats, then the same finalize) provides them; the GPU encoder kernel can write the
// same Welford partials from its registers.
//
// Where the backward departs from the design doc: the dz producers store dz itself, not dz^ = r dz
// (so the pass after attention writes no tile: both GEMMs of the qkv fold read dqkv). The dX GEMM
// multiplies by the unfolded W, so that its acc is the gradient of the LayerNorm output; its
// epilogue applies gamma and r, stores the LayerNorm output xhat gamma + beta (recomputed from x,
// mu, r), and takes the gamma and beta gradients as column partials (sum_i xhat acc, sum_i acc).
// The dW GEMM runs after it as a plain GEMM on that output (dW += LN(x)^T dz, the unfused path's
// GEMM; on the GPU cuBLASLt's): no rank-1 correction, no column vector v = sum_i mu dz^ to subtract
// (the doc's acc - v cancels where |mu| >> sigma), no pass over the weights. Steps 3/4 and 9/10
// swap accordingly.
#include "model_coda_cpu.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "coda_programs.cuh"
#include "ops_cpu.hpp"

namespace codagpt {

using namespace coda;

namespace {

// The logical matrix p [rows, ld] row-major, and the transpose of p [cols, ld] (element (r, c)
// at p[c*ld + r]): A = x^T of a dW GEMM, B = W^T of a dX GEMM.
Operand<float> matrix(const float* p, long ld) { return {p, {ld}}; }
Operand<float> transposed(const float* p, long ld) { return {p, {ld, true}}; }

// W~ = diag(gamma) W, c = column sums of W~, b~ = beta W + b (b may be null). W [K, N] is read
// through `layout`: the LM head's W is wte^T. Sums in double, rounded once.
FoldedWeights fold_layernorm(const float* gamma, const float* beta, const float* w, Layout layout, const float* b,
                            int K, int N) {
    FoldedWeights f{std::vector<float>((size_t)K * N), std::vector<float>(N), std::vector<float>(N)};
#pragma omp parallel for schedule(static)
    for (int j = 0; j < N; j++) {
        double c = 0, b_folded = b ? b[j] : 0.0;
        for (int k = 0; k < K; k++) {
            const float w_kj = w[layout.at(k, j)];
            const float w_folded = gamma[k] * w_kj;
            f.w_folded[(size_t)k * N + j] = w_folded;
            c += w_folded;
            b_folded += (double)beta[k] * w_kj;
        }
        f.c[j] = (float)c;
        f.b_folded[j] = (float)b_folded;
    }
    return f;
}

// The tiny reduce after a residual epilogue: (mu, r) of each of the M rows from Welford partials.
void finalize_stats(const std::vector<float>& partials, int M, int tiles_n, float* mu, float* rstd) {
    for (int i = 0; i < M; i++) {
        const RowStats s = finalize_row_stats(partials.data(), i, tiles_n);
        mu[i] = s.mu;
        rstd[i] = s.rstd;
    }
}

// The dz-producer outputs of one folded GEMM's backward: the row partials m1, m2 and column
// partials db that the producer's epilogue writes, and their finalized values (the tiny
// reductions between the producer and the dX / dW GEMMs). M tokens, N outputs, K = C the
// LayerNorm's width. dz itself lives in a buffer of the caller's.
struct FoldGradientBuffers {
    int M, N, K;
    TileShape shape;
    std::vector<float> m1_partials, m2_partials, db_partials;
    std::vector<float> m1, m2;

    FoldGradientBuffers(int M_, int N_, int K_, const TileShape& s)
        : M(M_), N(N_), K(K_), shape(s), m1_partials((size_t)M * n_tiles(N, s.bn)), m2_partials(m1_partials.size()),
          m1(M), m2(M) {}

    // kBias: the folded GEMM has a bias, whose gradient the db partials are (the LM head has none)
    template <bool kBias = true>
    FoldGradient<kBias> producer(const FoldedWeights& fold) {
        FoldGradient<kBias> p;
        p.c = {fold.c.data()}, p.b_folded = {fold.b_folded.data()};
        p.m1 = {m1_partials.data()}, p.m2 = {m2_partials.data()};
        if constexpr (kBias) {
            db_partials.assign((size_t)n_tiles(M, shape.bm) * N, 0.f);
            p.db = {db_partials.data()};
        }
        return p;
    }
    // m1, m2 as means over the K inputs of the fold; db, the sums over the M tokens, added into
    // bias_grad, the folded GEMM's bias gradient (null for the LM head, which has no bias).
    void finalize(float* bias_grad) {
        const int tiles_n = n_tiles(N, shape.bn), tiles_m = n_tiles(M, shape.bm);
        for (int i = 0; i < M; i++) {
            m1[i] = finalize_row_sum(m1_partials.data(), i, tiles_n, 1.f / K);
            m2[i] = finalize_row_sum(m2_partials.data(), i, tiles_n, 1.f / K);
        }
        if (!bias_grad) return;
        if (db_partials.empty())
            throw std::logic_error("FoldGradientBuffers::finalize: a bias gradient from a producer without db");
        for (int j = 0; j < N; j++) bias_grad[j] += finalize_col_sum(db_partials.data(), j, tiles_m, N);
    }
};

// The backward of a folded GEMM after its dz producer: the dX GEMM, A = dz [M, N], B = W^T (the
// unfolded weight, w_t; LnBackwardX): the LayerNorm backward of x plus the pass-through dres (null
// for LN_f), into dx_out (may alias dres), and the LayerNorm output into ln_out, the A operand of
// the fold's dW GEMM (a plain GEMM, the caller's next step); then the tiny reduce of its column
// partials: gamma and beta += their gradients, and bias_grad, the bias of the GEMM that produced x
// (null: the embedding produced x, and has no bias), += the column sums of dx.
void ln_backward_x(const float* dz, Operand<float> w_t, const FoldGradientBuffers& grad, const float* x,
                   const float* mu, const float* rstd, const float* gamma, const float* beta, const float* dres,
                   float* dx_out, float* ln_out, float* bias_grad, float* dgamma, float* dbeta, const TileShape& shape) {
    const int M = grad.M, N = grad.N, C = grad.K, tiles_m = n_tiles(M, shape.bm);
    std::vector<float> bias_partials((size_t)tiles_m * C), dgamma_partials(bias_partials.size()),
        dbeta_partials(bias_partials.size());
    LnBackwardX<float> p;
    p.mu = {mu}, p.rstd = {rstd}, p.m1 = {grad.m1.data()}, p.m2 = {grad.m2.data()};
    p.gamma = {gamma}, p.beta = {beta};
    p.x = {x, {C}}, p.dres = {dres, {C}}, p.ln_out = {ln_out, {C}}, p.dx_out = {dx_out, {C}};
    p.bias_grad = {bias_partials.data()}, p.dgamma = {dgamma_partials.data()}, p.dbeta = {dbeta_partials.data()};
    emulate_gemm(p, M, C, N, matrix(dz, N), w_t, shape);
    for (int j = 0; j < C; j++) {
        if (bias_grad) bias_grad[j] += finalize_col_sum(bias_partials.data(), j, tiles_m, C);
        dgamma[j] += finalize_col_sum(dgamma_partials.data(), j, tiles_m, C);
        dbeta[j] += finalize_col_sum(dbeta_partials.data(), j, tiles_m, C);
    }
}

// Plain GEMMs: out = A B, and dw += A B.
void gemm_store(float* out, int M, int N, int K, Operand<float> a, Operand<float> b, const TileShape& shape) {
    PlainStore<float> p;
    p.out = {out, {N}};
    emulate_gemm(p, M, N, K, a, b, shape);
}
void gemm_accumulate(float* dw, int M, int N, int K, Operand<float> a, Operand<float> b, const TileShape& shape) {
    PlainAccumulate p;
    p.dw = {dw, {N}};
    emulate_gemm(p, M, N, K, a, b, shape);
}

}  // namespace

GPT2CodaCPU::GPT2CodaCPU(const ModelConfig& cfg, const TileShape& shape) : cfg_(cfg), shape_(shape) {
    size_t n = 0;
    for (const ParamInfo& t : param_layout(cfg)) n += t.size;
    params_.assign(n, 0.f);
    grads.assign(n, 0.f);
    set_params(params_);
}

void GPT2CodaCPU::set_params(const std::vector<float>& params) {
    if (params.size() != params_.size())
        throw std::invalid_argument("GPT2CodaCPU::set_params: expected " + std::to_string(params_.size()) +
                                    " parameters, got " + std::to_string(params.size()));
    params_ = params;
    const int L = cfg_.n_layer, C = cfg_.n_embd, Vp = cfg_.padded_vocab();
    const GPT2Params<float> pv = param_view();
    qkv_fold_.clear();
    fc_fold_.clear();
    for (int l = 0; l < L; l++) {
        const LayerParams<float> lp = layer_params(pv, l, C);
        qkv_fold_.push_back(fold_layernorm(lp.ln1_w, lp.ln1_b, lp.qkv_w, {3 * C}, lp.qkv_b, C, 3 * C));
        fc_fold_.push_back(fold_layernorm(lp.ln2_w, lp.ln2_b, lp.fc_w, {4 * C}, lp.fc_b, C, 4 * C));
    }
    lm_head_fold_ = fold_layernorm(pv.lnf_w, pv.lnf_b, pv.wte, {C, true}, nullptr, C, Vp);
}

void GPT2CodaCPU::zero_grad() { std::fill(grads.begin(), grads.end(), 0.f); }

void GPT2CodaCPU::ensure_activations(int B, int T) {
    if (B == B_ && T == T_) return;
    B_ = B, T_ = T;
    const size_t L = cfg_.n_layer, C = cfg_.n_embd, NH = cfg_.n_head, BT = (size_t)B * T;
    inputs_.resize(BT), targets_.resize(BT);
    residual_.resize((L + 1) * BT * C), mu_.resize((L + 1) * BT), rstd_.resize((L + 1) * BT);
    qkv_.resize(L * BT * 3 * C), y_.resize(L * BT * C), att_.resize(L * B * NH * T * T);
    x_mid_.resize(L * BT * C), mu_mid_.resize(L * BT), rstd_mid_.resize(L * BT), f_.resize(L * BT * 4 * C);
    logits_.resize(BT * cfg_.padded_vocab()), lse_.resize(BT);
}

float GPT2CodaCPU::forward(const int* inputs, const int* targets, int B, int T) {
    if (B < 1 || T < 1 || T > cfg_.max_seq_len || !targets)
        throw std::invalid_argument("GPT2CodaCPU::forward: needs targets and 1 <= T <= max_seq_len, got " +
                                    std::to_string(B) + "x" + std::to_string(T));
    ensure_activations(B, T);
    const int L = cfg_.n_layer, C = cfg_.n_embd, NH = cfg_.n_head, V = cfg_.vocab_size, Vp = cfg_.padded_vocab();
    const int M = B * T, C3 = 3 * C, C4 = 4 * C, tiles_c = n_tiles(C, shape_.bn);
    std::copy(inputs, inputs + M, inputs_.begin());
    std::copy(targets, targets + M, targets_.begin());
    const GPT2Params<float> pv = param_view();
    std::vector<float> row_stats((size_t)M * tiles_c * Welford::kWords);  // residual epilogues' partials
    std::vector<float> g((size_t)M * C4);  // gelu(f): the fcproj GEMM's operand, not kept for backward

    // Embedding, and the row statistics of its output for layer 0's LN1 (a stats pass: see top).
    cpu::encoder_forward(residual_.data(), inputs, pv.wte, pv.wpe, B, T, C);
    {
        ResidualStats<float> p;
        p.x = {residual_.data(), {C}}, p.row_stats = {row_stats.data()};
        emulate_pass(p, M, C, shape_);
        finalize_stats(row_stats, M, tiles_c, mu_.data(), rstd_.data());
    }

    for (int l = 0; l < L; l++) {
        const LayerParams<float> lp = layer_params(pv, l, C);
        const FoldedWeights &qkv_fold = qkv_fold_[l], &fc_fold = fc_fold_[l];
        const float *x = &residual_[(size_t)l * M * C], *mu = &mu_[(size_t)l * M], *rstd = &rstd_[(size_t)l * M];
        float *qkv = &qkv_[(size_t)l * M * C3], *y = &y_[(size_t)l * M * C], *x_mid = &x_mid_[(size_t)l * M * C];
        float *mu_mid = &mu_mid_[(size_t)l * M], *rstd_mid = &rstd_mid_[(size_t)l * M], *f = &f_[(size_t)l * M * C4];
        float* x_out = &residual_[(size_t)(l + 1) * M * C];

        {  // 1. qkv GEMM, A = x, B = W~qkv: z = r(acc - mu c) + b~
            QkvForward<float> p;
            p.ln = {{mu}, {rstd}, {qkv_fold.c.data()}, {qkv_fold.b_folded.data()}};
            p.z = {qkv, {C3}};
            emulate_gemm(p, M, C3, C, matrix(x, C), matrix(qkv_fold.w_folded.data(), C3), shape_);
        }
        // 2. attention (CODA leaves it alone)
        cpu::attention_forward(y, &att_[(size_t)l * B * NH * T * T], qkv, B, T, C, NH);
        auto residual_gemm = [&](const float* a, int K, const float* w, const float* bias, const float* residual,
                                 float* out) {
            ResidualForward<float> p;
            p.bias = {bias}, p.residual = {residual, {C}}, p.x_out = {out, {C}}, p.row_stats = {row_stats.data()};
            emulate_gemm(p, M, C, K, matrix(a, K), matrix(w, C), shape_);
        };
        // 3. proj GEMM, A = y, B = Wo: x' = acc + bo + x, row partials
        residual_gemm(y, C, lp.proj_w, lp.proj_b, x, x_mid);
        // 4. tiny reduce -> mu', r'
        finalize_stats(row_stats, M, tiles_c, mu_mid, rstd_mid);
        {  // 5. fc GEMM, A = x', B = W~fc: f = r'(acc - mu' c) + b~ ; g = gelu(f)
            FcForward<float> p;
            p.ln = {{mu_mid}, {rstd_mid}, {fc_fold.c.data()}, {fc_fold.b_folded.data()}};
            p.f = {f, {C4}}, p.g = {g.data(), {C4}};
            emulate_gemm(p, M, C4, C, matrix(x_mid, C), matrix(fc_fold.w_folded.data(), C4), shape_);
        }
        // 6. fcproj GEMM, A = g, B = Wp: x'' = acc + bp + x', row partials
        residual_gemm(g.data(), C4, lp.fcproj_w, lp.fcproj_b, x_mid, x_out);
        // 7. tiny reduce -> the statistics of the next layer's LN1 (or of LN_f)
        finalize_stats(row_stats, M, tiles_c, &mu_[(size_t)(l + 1) * M], &rstd_[(size_t)(l + 1) * M]);
    }

    // Final: LM head GEMM with LN_f folded, A = x_L, B = W~e = diag(gamma_f) wte^T: logits,
    // (max, sum-exp) partials and the target logit; a tiny reduce gives lse and the loss.
    const int tiles_v = n_tiles(Vp, shape_.bn);
    std::vector<float> lse_partials((size_t)M * tiles_v * MaxSumExp::kWords), target_logit(M);
    {
        LmHeadForward<float> p;
        p.ln = {{&mu_[(size_t)L * M]}, {&rstd_[(size_t)L * M]}, {lm_head_fold_.c.data()}, {lm_head_fold_.b_folded.data()}};
        p.logits = {logits_.data(), {Vp}};
        p.vocab = V;
        p.lse_partials = {lse_partials.data()};
        p.target_logit = {targets, target_logit.data()};
        emulate_gemm(p, M, Vp, C, matrix(&residual_[(size_t)L * M * C], C), matrix(lm_head_fold_.w_folded.data(), Vp),
                     shape_);
    }
    double loss = 0;
    for (int i = 0; i < M; i++) {
        const TokenLoss t = finalize_loss(lse_partials.data(), i, tiles_v, target_logit[i]);
        lse_[i] = t.lse;
        loss += t.loss;
    }
    backward_ready_ = true;
    return (float)(loss / M);
}

void GPT2CodaCPU::backward(float grad_scale) {
    if (!backward_ready_) throw std::logic_error("GPT2CodaCPU::backward needs a forward() first");
    backward_ready_ = false;
    const int L = cfg_.n_layer, C = cfg_.n_embd, NH = cfg_.n_head, V = cfg_.vocab_size, Vp = cfg_.padded_vocab();
    const int B = B_, T = T_, M = B * T, C3 = 3 * C, C4 = 4 * C;
    const GPT2Params<float> pv = param_view(), gv = grad_view();
    const float* x_final = &residual_[(size_t)L * M * C];
    const float *mu_final = &mu_[(size_t)L * M], *rstd_final = &rstd_[(size_t)L * M];
    std::vector<float> dres((size_t)M * C), dy((size_t)M * C), g((size_t)M * C4), df((size_t)M * C4),
        dqkv((size_t)M * C3), ln((size_t)M * C);

    // Cross-entropy pass: dz = (softmax - onehot) * grad_scale / (B T) from the logits, written in
    // place, plus the dz-producer partials of the LN_f fold.
    FoldGradientBuffers lm_grad(M, Vp, C, shape_);
    float* dz = logits_.data();
    {
        CrossEntropyGradient<float> p;
        p.logits = {logits_.data(), {Vp}};
        p.lse = {lse_.data()};
        p.target = targets_.data();
        p.vocab = V;
        p.scale = grad_scale / M;
        p.dz = {dz, {Vp}};
        p.fold = lm_grad.producer<false>(lm_head_fold_);
        emulate_pass(p, M, Vp, shape_);
        lm_grad.finalize(nullptr);
    }
    // LM head dX GEMM, B = wte (W = wte^T): LN_f backward (nothing passes through) -> dres, LN_f's
    // output, the LN_f gamma and beta gradients; its column sums of dres are the last layer's fcproj
    // bias gradient.
    ln_backward_x(dz, matrix(pv.wte, C), lm_grad, x_final, mu_final, rstd_final, pv.lnf_w, pv.lnf_b, nullptr,
                  dres.data(), ln.data(), layer_params(gv, L - 1, C).fcproj_b, gv.lnf_w, gv.lnf_b, shape_);
    // LM head dW GEMM, A = dz^T, B = LN_f(x): tied embeddings, so it adds into the wte gradient [Vp, C].
    gemm_accumulate(gv.wte, Vp, C, M, transposed(dz, Vp), matrix(ln.data(), C), shape_);

    for (int l = L - 1; l >= 0; l--) {
        const LayerParams<float> lp = layer_params(pv, l, C), lg = layer_params(gv, l, C);
        const FoldedWeights &qkv_fold = qkv_fold_[l], &fc_fold = fc_fold_[l];
        const float *x = &residual_[(size_t)l * M * C], *mu = &mu_[(size_t)l * M], *rstd = &rstd_[(size_t)l * M];
        const float *qkv = &qkv_[(size_t)l * M * C3], *y = &y_[(size_t)l * M * C], *x_mid = &x_mid_[(size_t)l * M * C];
        const float *mu_mid = &mu_mid_[(size_t)l * M], *rstd_mid = &rstd_mid_[(size_t)l * M];
        const float* f = &f_[(size_t)l * M * C4];
        FoldGradientBuffers fc_grad(M, C4, C, shape_), qkv_grad(M, C3, C, shape_);

        {  // 1. dG GEMM, A = dres, B = Wp^T: df = acc gelu'(f), g = gelu(f) re-emitted, fc fold partials;
           //    the fc bias gradient is the producer's db
            GeluBackward<float> p;
            p.f = {f, {C4}}, p.g = {g.data(), {C4}}, p.df = {df.data(), {C4}};
            p.fold = fc_grad.producer(fc_fold);
            emulate_gemm(p, M, C4, C, matrix(dres.data(), C), transposed(lp.fcproj_w, C), shape_);
            fc_grad.finalize(lg.fc_b);
        }
        // 2. dW_p GEMM, A = g^T, B = dres. (The fcproj bias gradient was taken from the column
        //    partials of the epilogue that produced dres: step 9 above, or the LM head dX GEMM.)
        gemm_accumulate(lg.fcproj_w, C4, C, M, transposed(g.data(), C4), matrix(dres.data(), C), shape_);
        // 3. dX GEMM, A = df, B = Wfc^T: LN2 backward + dres pass-through -> dres' (in place), and
        //    LN2's output; column partials -> proj bias, gamma2 and beta2 gradients
        ln_backward_x(df.data(), transposed(lp.fc_w, C4), fc_grad, x_mid, mu_mid, rstd_mid, lp.ln2_w, lp.ln2_b,
                      dres.data(), dres.data(), ln.data(), lg.proj_b, lg.ln2_w, lg.ln2_b, shape_);
        // 4. dW_fc GEMM, A = LN2(x')^T, B = df
        gemm_accumulate(lg.fc_w, C, C4, M, transposed(ln.data(), C), matrix(df.data(), C4), shape_);
        // 5. dY GEMM, A = dres', B = Wo^T -> dy
        gemm_store(dy.data(), M, C, C, matrix(dres.data(), C), transposed(lp.proj_w, C), shape_);
        // 6. dW_o GEMM, A = y^T, B = dres'
        gemm_accumulate(lg.proj_w, C, C, M, transposed(y, C), matrix(dres.data(), C), shape_);
        // 7. attention backward -> dqkv
        std::fill(dqkv.begin(), dqkv.end(), 0.f);
        cpu::attention_backward(dqkv.data(), dy.data(), qkv, &att_[(size_t)l * B * NH * T * T], B, T, C, NH);
        {  // 8. the one small pass over dqkv, qkv: dz-producer outputs of the qkv fold; the qkv bias
           //    gradient is its db
            QkvGradient<float> p;
            p.dqkv = {dqkv.data(), {C3}}, p.qkv = {qkv, {C3}};
            p.fold = qkv_grad.producer(qkv_fold);
            emulate_pass(p, M, C3, shape_);
            qkv_grad.finalize(lg.qkv_b);
        }
        // 9. dX GEMM, A = dqkv, B = Wqkv^T: LN1 backward + dres' pass-through -> dres for the layer
        //    below (in place), and LN1's output; column partials -> gamma1 and beta1 gradients and
        //    that layer's fcproj bias gradient
        float* below_fcproj_b = l > 0 ? layer_params(gv, l - 1, C).fcproj_b : nullptr;
        ln_backward_x(dqkv.data(), transposed(lp.qkv_w, C3), qkv_grad, x, mu, rstd, lp.ln1_w, lp.ln1_b, dres.data(),
                      dres.data(), ln.data(), below_fcproj_b, lg.ln1_w, lg.ln1_b, shape_);
        // 10. dW_qkv GEMM, A = LN1(x)^T, B = dqkv
        gemm_accumulate(lg.qkv_w, C, C3, M, transposed(ln.data(), C), matrix(dqkv.data(), C3), shape_);
    }
    // Embedding backward: its own kernel, adding into the wte gradient beside the LM head's.
    cpu::encoder_backward(gv.wte, gv.wpe, dres.data(), inputs_.data(), B, T, C);
}

}  // namespace codagpt
