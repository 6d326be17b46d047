// The fused (CODA) GPU trainer, GPT2CodaGPU, against the unfused GPU trainer (GPT2GPU) and the fp32
// CPU reference (GPT2CPU): logits, loss and every parameter gradient (two micro-batches
// accumulated with grad_scale 1/2) on gpt2-tiny and on 2 layers of GPT-2 124M's widths, with the
// LM head in one row chunk and in several, and the kernels one fused training step launches. (20 AdamW steps against the CPU: test_gpu_model.cpp;
// bit-exact resume: test_gpu_checkpoint.cpp; both for each GPU path.)
//
// Parameters: nonzero_mean_params (model_test_util.hpp): non-trivial LayerNorm and bias parameters
// and a residual stream whose rows have |mean| / std ~ 20, where a folded LayerNorm cancels most.
// Both GPU paths keep the residual stream in bf16, and rounding x ~ 0.7 to bf16 moves xhat by up to
// 2^-9 * 20 ~ 4%: against the fp32 CPU reference that is the dominant error of both GPU paths, and
// it is the same rounding of the same stored values in both. So the bound of the fused path is the
// unfused path's own error on the same problem, times 2, plus a floor for tensors where the
// unfused error happens to be tiny: a missing or wrong term of the fold gives errors of order 1.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <set>
#include <string>

#include "backend.hpp"
#include "coda_kernels.cuh"
#include "coda_programs.cuh"
#include "gpu_test_util.hpp"
#include "kernel_trace.hpp"
#include "model_coda_gpu.hpp"
#include "model_cpu.hpp"
#include "model_gpu.hpp"
#include "model_test_util.hpp"
#include "test_util.hpp"

using namespace codagpt;
using namespace codagpt::test;

namespace {

constexpr int kMicroBatches = 2;
constexpr double kFactor = 2.0;                       // fused error <= kFactor * unfused error + floor
constexpr double kLossFloor = 2e-3, kFloor = 1e-2;    // relative: loss; logits and gradients (norm-wise)

struct Case {
    const char* name;
    ModelConfig cfg;
    int B, T;
};

// What a path computes on the case: the loss, per-position losses and logits (real vocabulary) of
// an evaluation of micro-batch 0, the training losses and the accumulated gradients.
struct StepResult {
    double eval_loss = 0;
    std::vector<float> token_losses, logits;
    std::vector<double> losses;
    std::vector<float> grads;
};

std::vector<float> real_vocab(const std::vector<float>& logits, const ModelConfig& m, int rows) {
    if (logits.empty()) return {};
    std::vector<float> out;
    for (size_t i = 0; i < (size_t)rows; i++)
        out.insert(out.end(), logits.begin() + i * m.padded_vocab(), logits.begin() + i * m.padded_vocab() + m.vocab_size);
    return out;
}

std::vector<int> batch_inputs(const Case& c, int s) { return random_tokens((size_t)c.B * c.T, c.cfg.vocab_size, 7 + 2 * s); }
std::vector<int> batch_targets(const Case& c, int s) { return random_tokens((size_t)c.B * c.T, c.cfg.vocab_size, 8 + 2 * s); }

// with_logits: the model keeps all logits of a forward (the fused one only with the LM head in one chunk).
template <class Model>
StepResult gpu_step(Model& model, const Case& c, bool with_logits) {
    StepResult r;
    const auto in0 = batch_inputs(c, 0), tg0 = batch_targets(c, 0);
    r.eval_loss = model.forward(in0.data(), tg0.data(), /*backward_next=*/false);
    r.token_losses = model.token_losses();
    if (with_logits) r.logits = real_vocab(model.logits(), c.cfg, c.B * c.T);
    model.zero_grad();
    for (int s = 0; s < kMicroBatches; s++) {
        const auto in = batch_inputs(c, s), tg = batch_targets(c, s);
        r.losses.push_back(model.forward(in.data(), tg.data(), /*backward_next=*/true, 1.0f / kMicroBatches));
        model.backward();
    }
    r.grads = model.grads();
    return r;
}

StepResult cpu_step(GPT2CPU<float>& model, const Case& c) {
    StepResult r;
    model.zero_grad();
    for (int s = 0; s < kMicroBatches; s++) {
        const auto in = batch_inputs(c, s), tg = batch_targets(c, s);
        r.losses.push_back(model.forward(in.data(), tg.data(), c.B, c.T));
        if (s == 0) {
            r.eval_loss = r.losses[0];
            r.token_losses = model.token_losses();
            r.logits = real_vocab(std::vector<float>(model.logits(), model.logits() + (size_t)c.B * c.T * c.cfg.padded_vocab()),
                                  c.cfg, c.B * c.T);
        }
        model.backward(1.0f / kMicroBatches);
    }
    r.grads = model.grads;
    return r;
}

// lm_head_chunks: the fused model's (GPUModelOptions); its logits are compared with one chunk only.
// deterministic_attention: both GPU models' (false: cuDNN's atomic-dQ backward).
void check_against_cpu_and_unfused(const Case& c, int lm_head_chunks, bool deterministic_attention = true) {
    std::vector<float> params = nonzero_mean_params(c.cfg);
    for (float& w : params) w = bf16_round(w);  // the GPU holds bf16 weights: the CPU gets the same
    GPT2CPU<float> cpu(c.cfg);
    std::copy(params.begin(), params.end(), cpu.params.begin());
    const StepResult ref = cpu_step(cpu, c);

    StepResult fused, unfused;
    {
        GPUModelOptions opt;
        opt.lm_head_chunks = lm_head_chunks;
        opt.deterministic_attention = deterministic_attention;
        GPT2CodaGPU model(c.cfg, c.B, c.T, opt);
        model.set_params(params);
        std::printf("%s, LM head chunks %d: attention %s\n", c.name, lm_head_chunks, model.attention_backend());
        fused = gpu_step(model, c, lm_head_chunks == 1);
        if (lm_head_chunks != 1) {
            EXPECT_THROW(model.logits(), Error);
        }
    }
    {
        GPUModelOptions opt;
        opt.deterministic_attention = deterministic_attention;
        GPT2GPU model(c.cfg, c.B, c.T, opt);
        model.set_params(params);
        unfused = gpu_step(model, c, true);
    }

    auto loss_err = [&](const StepResult& r, int s) { return std::fabs(r.losses[s] / ref.losses[s] - 1); };
    for (int s = 0; s < kMicroBatches; s++) {
        std::printf("  micro-batch %d loss: cpu %.6f fused %.6f unfused %.6f (rel err %.2e / %.2e)\n", s, ref.losses[s],
                    fused.losses[s], unfused.losses[s], loss_err(fused, s), loss_err(unfused, s));
        EXPECT_LE(loss_err(fused, s), kFactor * loss_err(unfused, s) + kLossFloor) << "loss of micro-batch " << s;
    }
    EXPECT_EQ(fused.eval_loss, fused.losses[0]);  // evaluation and training forward are the same computation
    // The per-position losses (multiple-choice scoring): the evaluation's mean is theirs, in order.
    for (const StepResult* r : {&fused, &unfused}) {
        ASSERT_EQ(r->token_losses.size(), (size_t)c.B * c.T);
        double sum = 0;
        for (float x : r->token_losses) sum += x;
        EXPECT_EQ(sum / r->token_losses.size(), r->eval_loss);
    }
    const double tokens_fused = rel_error(fused.token_losses, ref.token_losses),
                 tokens_unfused = rel_error(unfused.token_losses, ref.token_losses);
    std::printf("  per-position losses rel err: fused %.2e unfused %.2e\n", tokens_fused, tokens_unfused);
    EXPECT_LE(tokens_fused, kFactor * tokens_unfused + kFloor);

    if (lm_head_chunks == 1) {
        const double logits_fused = rel_error(fused.logits, ref.logits),
                     logits_unfused = rel_error(unfused.logits, ref.logits);
        std::printf("  logits rel err: fused %.2e unfused %.2e (fused vs unfused %.2e)\n", logits_fused,
                    logits_unfused, rel_error(fused.logits, unfused.logits));
        EXPECT_LE(logits_fused, kFactor * logits_unfused + kFloor);
    }

    const std::vector<ParamInfo> layout = param_layout(c.cfg);
    const std::vector<double> ef = tensor_errors(fused.grads, ref.grads, layout),
                              eu = tensor_errors(unfused.grads, ref.grads, layout),
                              efu = tensor_errors(fused.grads, unfused.grads, layout);
    for (size_t t = 0; t < layout.size(); t++) {
        std::printf("  grad %-9s rel err: fused %.2e unfused %.2e (fused vs unfused %.2e)\n", layout[t].name.c_str(),
                    ef[t], eu[t], efu[t]);
        EXPECT_LE(ef[t], kFactor * eu[t] + kFloor) << "gradient of " << layout[t].name;
    }
}

}  // namespace

TEST(CodaGPU, TinyMatchesUnfusedAndCPUReference) {
    REQUIRE_GPU();
    check_against_cpu_and_unfused({"gpt2-tiny", ModelConfig{2, 4, 64, 64, 50257}, 4, 64}, 1);
}

// 256 rows in chunks of 88, 88 and 80: none a tile multiple.
TEST(CodaGPU, TinyWithTheLmHeadInThreeChunksMatchesUnfusedAndCPUReference) {
    REQUIRE_GPU();
    check_against_cpu_and_unfused({"gpt2-tiny", ModelConfig{2, 4, 64, 64, 50257}, 4, 64}, 3);
}

TEST(CodaGPU, TwoLayers124MWidthsMatchUnfusedAndCPUReference) {
    REQUIRE_GPU();
    check_against_cpu_and_unfused({"2 layers, C=768, 12 heads, T=1024", ModelConfig{2, 12, 768, 1024, 50257}, 1, 1024}, 1);
}

// --nondeterministic-attention: both paths with cuDNN's atomic-dQ attention backward.
TEST(CodaGPU, TwoLayers124MWidthsWithAtomicAttentionMatchUnfusedAndCPUReference) {
    REQUIRE_GPU();
    check_against_cpu_and_unfused({"2 layers, C=768, 12 heads, T=1024", ModelConfig{2, 12, 768, 1024, 50257}, 1, 1024}, 1,
                                  /*deterministic_attention=*/false);
}

// 1024 rows in 8 chunks of 128.
TEST(CodaGPU, TwoLayers124MWidthsWithTheLmHeadInEightChunksMatchUnfusedAndCPUReference) {
    REQUIRE_GPU();
    check_against_cpu_and_unfused({"2 layers, C=768, 12 heads, T=1024", ModelConfig{2, 12, 768, 1024, 50257}, 1, 1024}, 8);
}

// The default cut of the LM head's rows (the fewest chunks within the cap, cut where the plan prices
// their dX GEMMs least), at 16384 rows of 124M's widths: more than one chunk, multiples of 128 rows
// but the last, covering the rows; and the step computes what the LM head in one chunk does, but
// for rounding: the chunks' LM head GEMMs and dX GEMMs may run other tiles and K splits than one
// chunk's, and the wte and LN_f gradients add up a chunk at a time. A chunk skipped, run twice or
// on the wrong rows gives errors of order 1.
TEST(CodaGPU, DefaultLmHeadCutMatchesOneChunk) {
    REQUIRE_GPU();
    const Case c{"2 layers, C=768, 12 heads, B=16, T=1024", ModelConfig{2, 12, 768, 1024, 50257}, 16, 1024};
    const std::vector<float> params = nonzero_mean_params(c.cfg);
    std::vector<int> rows;
    StepResult cut, one;
    {
        GPT2CodaGPU model(c.cfg, c.B, c.T, GPUModelOptions{});
        rows = model.lm_head_chunk_rows();
        model.set_params(params);
        cut = gpu_step(model, c, false);
    }
    {
        GPUModelOptions opt;
        opt.lm_head_chunks = 1;
        GPT2CodaGPU model(c.cfg, c.B, c.T, opt);
        EXPECT_EQ(model.lm_head_chunk_rows(), std::vector<int>{c.B * c.T});
        model.set_params(params);
        one = gpu_step(model, c, false);
    }
    std::string cut_text;
    int covered = 0;
    for (size_t i = 0; i < rows.size(); i++) {
        cut_text += (i ? " + " : "") + std::to_string(rows[i]);
        if (i + 1 < rows.size()) {
            EXPECT_EQ(rows[i] % 128, 0) << "chunk " << i;
        }
        covered += rows[i];
    }
    std::printf("%s: default LM head cut %s\n", c.name, cut_text.c_str());
    EXPECT_GT(rows.size(), 1u);
    EXPECT_EQ(covered, c.B * c.T);
    for (int s = 0; s < kMicroBatches; s++) {
        std::printf("  micro-batch %d loss: cut %.7f one chunk %.7f\n", s, cut.losses[s], one.losses[s]);
        EXPECT_NEAR(cut.losses[s], one.losses[s], 1e-5 * one.losses[s]) << "micro-batch " << s;
    }
    EXPECT_LE(rel_error(cut.token_losses, one.token_losses), 1e-5);
    const std::vector<ParamInfo> layout = param_layout(c.cfg);
    const std::vector<double> err = tensor_errors(cut.grads, one.grads, layout);
    for (size_t t = 0; t < layout.size(); t++) {
        std::printf("  grad %-9s rel err cut vs one chunk %.2e\n", layout[t].name.c_str(), err[t]);
        EXPECT_LE(err[t], 1e-3) << "gradient of " << layout[t].name;
    }
}

// The row finalize kernels (a warp a row) merge a row's partials in the host's order
// (coda::merge_row, which the CPU emulator uses): the same bits for the sums (another order would
// round differently); the Welford statistics and the loss within a few float roundings (the GPU
// contracts Chan's multiply-adds into FMAs, and its expf may differ from the host's in the last
// bit). Rows: 37, not a whole number of blocks; partials a row: 1 to 393 (8: 350M's residual rows,
// merged by 8 lanes a row; 393: the LM head's, by a warp), with empty ones after the first.
TEST(CodaFinalize, RowKernelsMergeInTheHostOrder) {
    REQUIRE_GPU();
    constexpr int M = 37, K = 4800;
    Rng rng(41);
    for (int n_tiles : {1, 8, 13, 50, 393}) {
        SCOPED_TRACE("n_tiles " + std::to_string(n_tiles));
        const size_t n = (size_t)M * n_tiles;
        std::vector<float> welford(3 * n), lse(2 * n), sums(n), target(M);
        for (size_t t = 0; t < n; t++) {
            const bool empty = t % n_tiles % 11 == 5;
            const float count = empty ? 0.f : (float)(1 + rng.next_u64() % 128);
            welford[3 * t] = count;
            welford[3 * t + 1] = empty ? 0.f : 20.f + (float)rng.normal();
            welford[3 * t + 2] = count * (float)(0.5 + rng.uniform());
            lse[2 * t] = empty ? -INFINITY : 5.f * (float)rng.normal();
            lse[2 * t + 1] = empty ? 0.f : 1.f + 127.f * (float)rng.uniform();
            sums[t] = (float)rng.normal();
        }
        for (float& x : target) x = (float)rng.normal();
        DeviceBuffer<float> d_welford(welford.size()), d_lse(lse.size()), d_sums(n), d_target(M);
        d_welford.upload(welford), d_lse.upload(lse), d_sums.upload(sums), d_target.upload(target);
        DeviceBuffer<float> mu(M), rstd(M), lse_out(M), loss(M), m1(M), m2(M);
        for (auto* b : {&mu, &rstd, &lse_out, &loss, &m1, &m2}) b->poison();
        coda_row_stats(mu, rstd, d_welford, M, n_tiles, 0);
        coda_token_loss(lse_out, loss, d_lse, d_target, M, n_tiles, 0);
        coda_fold_gradient_finalize(m1, m2, nullptr, d_sums, d_sums, nullptr, M, 0, K, n_tiles, 0, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        const auto h_mu = mu.download(), h_rstd = rstd.download(), h_lse = lse_out.download(), h_loss = loss.download();
        const auto h_m1 = m1.download(), h_m2 = m2.download();
        for (int i = 0; i < M; i++) {
            const coda::RowStats rs = coda::finalize_row_stats(welford.data(), i, n_tiles);
            EXPECT_NEAR(h_mu[i], rs.mu, 1e-6 * std::fabs(rs.mu)) << "row " << i;
            EXPECT_NEAR(h_rstd[i], rs.rstd, 1e-6 * rs.rstd) << "row " << i;
            const coda::TokenLoss tl = coda::finalize_loss(lse.data(), i, n_tiles, target[i]);
            EXPECT_NEAR(h_lse[i], tl.lse, 1e-6 * std::fabs(tl.lse)) << "row " << i;
            EXPECT_NEAR(h_loss[i], tl.loss, 1e-6 * std::fabs(tl.lse)) << "row " << i;
            EXPECT_EQ(h_m1[i], coda::finalize_row_sum(sums.data(), i, n_tiles, 1.f / K)) << "row " << i;
            EXPECT_EQ(h_m2[i], h_m1[i]) << "row " << i;
        }
    }
}

// The column finalizes, LnBackwardX's (three arrays) and a dz producer's bias gradient (one), each
// a thread per group of M-tiles (its loads batched), then the groups in order, add each column's
// sum in the host's order (coda::merge_col): the same bits. Columns: 1700, not a whole number of
// blocks; partials a column: 1 to 300 (128 at 16384 tokens: a group of 16, one batch; 300: groups
// of 37 and 38, three batches), fewer than the groups in the first. The three arrays differ, so a
// mixed-up pointer shows; bias_grad may be null.
TEST(CodaFinalize, ColumnSumsMergeInTheHostOrder) {
    REQUIRE_GPU();
    constexpr int N = 1700;
    Rng rng(42);
    for (int n_tiles : {1, 5, 13, 128, 300}) {
        SCOPED_TRACE("n_tiles " + std::to_string(n_tiles));
        std::vector<std::vector<float>> parts(3, std::vector<float>((size_t)n_tiles * N));
        for (auto& p : parts)
            for (float& x : p) x = (float)rng.normal();
        DeviceBuffer<float> bias_parts(parts[0].size()), dgamma_parts(parts[1].size()), dbeta_parts(parts[2].size());
        bias_parts.upload(parts[0]), dgamma_parts.upload(parts[1]), dbeta_parts.upload(parts[2]);
        std::vector<float> start(N);
        for (float& x : start) x = (float)rng.normal();
        for (const bool with_bias : {true, false}) {
            DeviceBuffer<float> bias(N), dgamma(N), dbeta(N);
            bias.upload(start), dgamma.upload(start), dbeta.upload(start);
            coda_ln_backward_finalize(with_bias ? (float*)bias : nullptr, dgamma, dbeta, bias_parts, dgamma_parts,
                                      dbeta_parts, N, n_tiles, 0);
            CUDA_CHECK(cudaDeviceSynchronize());
            const std::vector<float> got[3] = {bias.download(), dgamma.download(), dbeta.download()};
            for (int a = 0; a < 3; a++)
                for (int j = 0; j < N; j++) {
                    const float want = a == 0 && !with_bias ? start[j] : start[j] + coda::finalize_col_sum(parts[a].data(), j, n_tiles, N);
                    ASSERT_EQ(got[a][j], want) << "array " << a << " column " << j << (with_bias ? "" : ", bias_grad null");
                }
        }
        DeviceBuffer<float> db(N);
        db.upload(start);
        coda_fold_gradient_finalize(nullptr, nullptr, db, nullptr, nullptr, bias_parts, /*M=*/0, N, /*K=*/1,
                                    /*tiles_n=*/1, n_tiles, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> got_db = db.download();
        for (int j = 0; j < N; j++)
            ASSERT_EQ(got_db[j], start[j] + coda::finalize_col_sum(parts[0].data(), j, n_tiles, N)) << "db column " << j;
    }
}

// The LayerNorm fold against the textbook: W~ = bf16(gamma W) element for element (coda_fold_weight,
// a layer at a time, as the model calls it), c the column sums of that bf16 W~, c_bwd those of
// gamma W unrounded and b~ = beta W + b against fp64 (coda_fold_layernorm, both layers at once),
// for W stored row-major (16-byte vectors of 8 columns: N = 200 leaves the last block of 256
// columns part empty) and as W^T (the LM head); outputs poisoned. A row-major N that is no
// multiple of 8 is refused.
TEST(CodaFold, BothLayoutsAgainstTheTextbook) {
    REQUIRE_GPU();
    constexpr int K = 72, N = 200, L = 2;
    const std::vector<float> w = random_bf16_values((size_t)L * K * N, 43, 0.1f);
    const std::vector<float> gamma = random_bf16_values((size_t)L * K, 44, 0.2f, 1.f);
    const std::vector<float> beta = random_bf16_values((size_t)L * K, 45, 0.1f), b = random_bf16_values((size_t)L * N, 46, 0.1f);
    DeviceBuffer<bf16> d_w(w.size()), folded(w.size());
    DeviceBuffer<float> d_gamma(gamma.size()), d_beta(beta.size()), d_b(b.size()), c(L * N), c_bwd(L * N), b_folded(L * N);
    d_gamma.upload(gamma), d_beta.upload(beta), d_b.upload(b);
    for (bool transposed : {false, true}) {
        SCOPED_TRACE(transposed ? "W^T [N, K]" : "W [K, N]");
        auto at = [&](int l, int k, int j) { return (size_t)l * K * N + (transposed ? (size_t)j * K + k : (size_t)k * N + j); };
        d_w.upload(to_bf16(w));
        for (auto* buf : {&c, &c_bwd, &b_folded}) buf->poison();
        folded.poison();
        coda_fold_layernorm(c, c_bwd, b_folded, d_w, transposed, d_gamma, d_beta, d_b, K, N, L, 0);
        for (int l = 0; l < L; l++)
            coda_fold_weight((bf16*)folded + (size_t)l * K * N, (const bf16*)d_w + (size_t)l * K * N, transposed,
                             (const float*)d_gamma + (size_t)l * K, K, N, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        const std::vector<float> h_folded = to_float(folded.download());
        const std::vector<float> h_c = c.download(), h_cb = c_bwd.download(), h_b = b_folded.download();
        for (int l = 0; l < L; l++)
            for (int j = 0; j < N; j++) {
                double sum_c = 0, abs_c = 0, sum_cb = 0, abs_cb = 0, sum_b = b[l * N + j], abs_b = std::fabs(sum_b);
                for (int k = 0; k < K; k++) {
                    const double gw = (double)gamma[l * K + k] * w[at(l, k, j)];
                    const float expect = bf16_round(gamma[l * K + k] * w[at(l, k, j)]);
                    ASSERT_EQ(h_folded[at(l, k, j)], expect) << "layer " << l << " k " << k << " j " << j;
                    sum_c += expect, abs_c += std::fabs(expect);
                    sum_cb += gw, abs_cb += std::fabs(gw);
                    sum_b += (double)beta[l * K + k] * w[at(l, k, j)], abs_b += std::fabs(beta[l * K + k] * w[at(l, k, j)]);
                }
                // fp32 sums of K + 1 terms: within (K + 1) 2^-24 of the sum of magnitudes; a term
                // missing or wrong moves them by ~1/K of it
                const double tol = (K + 1) * std::ldexp(1.0, -24);
                EXPECT_NEAR(h_c[l * N + j], sum_c, tol * abs_c) << "layer " << l << " column " << j;
                EXPECT_NEAR(h_cb[l * N + j], sum_cb, tol * abs_cb) << "layer " << l << " column " << j;
                EXPECT_NEAR(h_b[l * N + j], sum_b, tol * abs_b) << "layer " << l << " column " << j;
            }
    }
    EXPECT_TRUE(mentions(
        error_of([&] { coda_fold_layernorm(c, c_bwd, b_folded, d_w, false, d_gamma, d_beta, d_b, K, 196, 1, 0); }),
        "multiple of 8"));
}

// W~ where its rows cannot be taken 8 elements at a time: rows of 13 or 21 elements, and rows of
// 16 at an address 2 bytes past a 16-byte boundary (and rows of 24 and 40, eight at a time). Each
// element bf16(gamma W), gamma indexing the rows of W [K, N] or the columns of W^T [N, K]; the
// element past the end keeps its poison (NaN).
TEST(CodaFold, WeightOfAnyShapeOrAlignment) {
    REQUIRE_GPU();
    struct Case {
        int K, N, offset;
    };
    for (const Case t : {Case{13, 21, 0}, Case{21, 13, 0}, Case{16, 16, 1}, Case{40, 24, 0}})
        for (bool transposed : {false, true}) {
            SCOPED_TRACE("K " + std::to_string(t.K) + " N " + std::to_string(t.N) + " offset " +
                         std::to_string(t.offset) + (transposed ? " W^T" : " W"));
            const size_t n = (size_t)t.K * t.N;
            const std::vector<float> w = random_bf16_values(n + t.offset, 47, 0.1f);
            const std::vector<float> gamma = random_bf16_values(t.K, 48, 0.2f, 1.f);
            DeviceBuffer<bf16> d_w(n + t.offset), folded(n + t.offset + 1);
            DeviceBuffer<float> d_gamma(t.K);
            d_w.upload(to_bf16(w)), d_gamma.upload(gamma);
            folded.poison();
            coda_fold_weight((bf16*)folded + t.offset, (const bf16*)d_w + t.offset, transposed, d_gamma, t.K, t.N, 0);
            CUDA_CHECK(cudaDeviceSynchronize());
            const std::vector<float> got = to_float(folded.download());
            for (size_t i = 0; i < n; i++) {
                const int k = transposed ? (int)(i % t.K) : (int)(i / t.N);
                ASSERT_EQ(got[t.offset + i], bf16_round(gamma[k] * w[t.offset + i])) << "element " << i;
            }
            EXPECT_TRUE(std::isnan(got[t.offset + n])) << "the element past the end was written";
        }
}

// A batch no GPU holds (1.5B's widths, 256 x 1024 tokens: ~160 GiB of activations): on both paths
// one error line that names the failed allocation and what to change, and every buffer given back.
TEST(GPUModels, OutOfMemoryIsOneLineAndFreesTheBuffers) {
    REQUIRE_GPU();
    const ModelConfig mc{48, 25, 1600, 1024, 50257};
    for (const bool fused : {true, false}) {
        SCOPED_TRACE(fused ? "fused" : "unfused");
        size_t free_before = 0, free_after = 0, total = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
        const std::string err = error_of([&] {
            if (fused) {
                GPT2CodaGPU model(mc, 256, 1024);
            } else {
                GPT2GPU model(mc, 256, 1024, {});
            }
        });
        EXPECT_TRUE(mentions(err, "out of GPU memory: a cudaMalloc of"));
        EXPECT_TRUE(mentions(err, "batch_size"));
        EXPECT_EQ(err.find('\n'), std::string::npos) << err;
        CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
        // library handles may keep a little; the model's buffers were tens of GiB
        EXPECT_GT(free_after + (512ull << 20), free_before) << "free before " << free_before << ", after " << free_after;
    }
}

TEST(KernelTrace, FunctionNames) {
    EXPECT_EQ(kernel_function_name("void codagpt::coda::sm90::gemm_kernel<Cfg<128, 256, 4>, true>(Params, P)"),
              "gemm_kernel");
    EXPECT_EQ(kernel_function_name("codagpt::(anonymous namespace)::gelu_forward_kernel(__nv_bfloat16*, long)"),
              "gelu_forward_kernel");
    EXPECT_EQ(kernel_function_name("sm90_xmma_gemm_bf16bf16_bf16f32"), "sm90_xmma_gemm_bf16bf16_bf16f32");
}

// Launches of the same kernel add up in one line, GEMMs are told apart by their program, the
// largest total comes first, and the shares add up to the sum.
TEST(KernelTrace, TimeTable) {
    const std::string qkv = "void codagpt::coda::sm90::gemm_kernel<codagpt::coda::sm90::Config<128, 128, 6, true>, "
                            "false, true, codagpt::coda::QkvForward<__nv_bfloat16> >(codagpt::coda::sm90::Params, "
                            "codagpt::coda::QkvForward<__nv_bfloat16>)";
    const std::string fin = "codagpt::(anonymous namespace)::finalize_row_stats_kernel(float*, float*, float const*, int, int)";
    const std::string pass = "void codagpt::coda::sm80::gemm_kernel<codagpt::coda::QkvGradient<__nv_bfloat16>, true, "
                             "true, true>(codagpt::coda::QkvGradient<__nv_bfloat16>, codagpt::coda::GemmProblem)";
    const std::string table =
        kernel_time_table({{fin, 0.5}, {qkv, 2.0, 0.125}, {fin, 0.25, 0.5}, {qkv, 1.0}, {pass, 0.25, 0.25}});
    std::printf("%s", table.c_str());
    const size_t gemm = table.find("gemm_kernel sm90 QkvForward"), finalize = table.find("finalize_row_stats_kernel");
    ASSERT_NE(gemm, std::string::npos);
    ASSERT_NE(finalize, std::string::npos);
    EXPECT_LT(gemm, finalize);
    EXPECT_NE(table.find("     3.000        2  75.0%  gemm_kernel sm90 QkvForward"), std::string::npos);
    EXPECT_NE(table.find("     0.750        2  18.8%  finalize_row_stats_kernel"), std::string::npos);
    EXPECT_NE(table.find("     0.250        1   6.2%  gemm_kernel sm80 QkvGradient"), std::string::npos);
    EXPECT_NE(table.find("     4.000        5 100.0%  all kernels"), std::string::npos);
    EXPECT_NE(table.find("     0.875                  GPU idle between kernels"), std::string::npos);
    EXPECT_EQ(table.find("memsets and copies"), std::string::npos);

    // Memsets and copies: one line of their own, outside the kernels' rows, sum and shares; their
    // idle time counts.
    const std::string with_memory = kernel_time_table(
        {{"[memset 5.80 GiB]", 2.0, 0.0, true}, {qkv, 2.0, 0.125}, {"[memcpy HtoD 64 KiB]", 0.5, 1.0, true}, {qkv, 1.0}});
    std::printf("%s", with_memory.c_str());
    EXPECT_NE(with_memory.find("     3.000        2 100.0%  gemm_kernel sm90 QkvForward"), std::string::npos);
    EXPECT_NE(with_memory.find("     3.000        2 100.0%  all kernels"), std::string::npos);
    EXPECT_NE(with_memory.find("     2.500        2         memsets and copies"), std::string::npos);
    EXPECT_NE(with_memory.find("     1.125                  GPU idle between kernels"), std::string::npos);
    EXPECT_EQ(with_memory.find("[memset"), std::string::npos);
}

// One training step (forward, backward, optimizer step) of each path, traced with CUPTI: the
// unfused step launches our LayerNorm, GELU, residual and bias kernels (so the check can fail),
// the fused step none of them.
TEST(KernelTrace, FusedStepLaunchesNoLayerNormGeluResidualOrBiasKernel) {
    REQUIRE_GPU();
    const TrainConfig cfg = tiny_train_config();
    const auto in = random_tokens(4 * 64, 50257, 1), tg = random_tokens(4 * 64, 50257, 2);
    auto one_step = [&](TrainBackend& model) {
        model.forward_backward(in.data(), tg.data(), 1.0f);  // the first step builds plans and workspaces
        model.update(1e-4, cfg);
        return trace_kernels([&] {
            model.zero_grad();
            model.forward_backward(in.data(), tg.data(), 1.0f);
            model.update(1e-4, cfg);
        });
    };
    const std::vector<TracedKernel> fused = one_step(*make_coda_gpu_backend(cfg));
    const std::vector<TracedKernel> unfused = one_step(*make_gpu_backend(cfg, {}));
    std::printf("fused step: %zu kernels\n%s", fused.size(), kernel_time_table(fused).c_str());
    std::printf("unfused step: %zu kernels\n", unfused.size());
    for (const TracedKernel& k : fused) {
        EXPECT_GE(k.ms, 0.0) << k.name;
        EXPECT_GE(k.idle_ms, 0.0) << k.name;
    }
    // zero_grad's memsets (of the gradients that kernels add into) are on the step's timeline, named so
    bool gradient_memset = false;
    for (const TracedKernel& k : fused) gradient_memset |= k.memory_op && k.name.rfind("[memset ", 0) == 0;
    EXPECT_TRUE(gradient_memset);

    auto launched = [](const std::vector<TracedKernel>& trace, const std::string& prefix) {
        std::set<std::string> names;
        for (const TracedKernel& k : trace) {
            const std::string f = kernel_function_name(k.name);
            if (f.rfind(prefix, 0) == 0) names.insert(f);
        }
        return names;
    };
    for (const char* family : {"layernorm", "gelu", "residual", "bias"}) {
        EXPECT_FALSE(launched(unfused, family).empty()) << "the unfused step launches no " << family << " kernel";
        for (const std::string& k : launched(fused, family)) ADD_FAILURE() << "the fused step launches " << k;
    }
    EXPECT_FALSE(launched(fused, "gemm_kernel").empty());
}
