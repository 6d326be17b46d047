// The CPU reference GPT-2: gradients against finite differences (fp64), fp32 against fp64, the
// padded vocabulary, causality, gradient accumulation, init and determinism; CODAGPT_DUMP.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "common.hpp"
#include "model_cpu.hpp"
#include "rng.hpp"
#include "tensor_dump.hpp"
#include "test_util.hpp"

using namespace codagpt;

namespace {

// Small enough for finite differences; vocabulary 200 pads to 256, so padded rows exist.
ModelConfig small_config() {
    ModelConfig m;
    m.n_layer = 2;
    m.n_head = 2;
    m.n_embd = 16;
    m.max_seq_len = 8;
    m.vocab_size = 200;
    return m;
}

std::vector<int> random_tokens(size_t n, int vocab, uint64_t seed) {
    Rng rng(seed);
    std::vector<int> t(n);
    for (int& x : t) x = (int)rng.below(vocab);
    return t;
}

// Init values (zero biases, unit LayerNorm, 0.02 weights, near-uniform attention) would hide
// errors in the terms they make vanish, so the gradient checks run on wide random parameters.
template <typename F>
void randomize(GPT2CPU<F>& model, uint64_t seed) {
    Rng rng(seed);
    for (F& x : model.params) x = F(0.4 * rng.normal());
    const ModelConfig& m = model.config();
    F* wte = model.p().wte;
    std::fill(wte + (size_t)m.vocab_size * m.n_embd, wte + (size_t)m.padded_vocab() * m.n_embd, F(0));
}

size_t offset_of(const std::vector<ParamInfo>& layout, const std::string& name) {
    size_t off = 0;
    for (const ParamInfo& t : layout) {
        if (t.name == name) return off;
        off += t.size;
    }
    ADD_FAILURE() << "no tensor " << name;
    return 0;
}

}  // namespace

TEST(ModelCPU, LayoutDecaysOnlyMatrices) {
    const ModelConfig m = small_config();
    const std::vector<ParamInfo> layout = param_layout(m);
    ASSERT_EQ(layout.size(), 16u);
    EXPECT_EQ(layout[0].name, "wte");
    EXPECT_EQ(layout[0].size, (size_t)m.padded_vocab() * m.n_embd);
    const std::vector<std::string> matrices = {"wte", "wpe", "qkv_w", "proj_w", "fc_w", "fcproj_w"};
    for (const ParamInfo& t : layout) {
        const bool matrix = std::find(matrices.begin(), matrices.end(), t.name) != matrices.end();
        EXPECT_EQ(t.decay, matrix) << t.name;
    }
}

TEST(ModelCPU, GradientsMatchFiniteDifferences) {
    const ModelConfig m = small_config();
    const int B = 2, T = 7;
    GPT2CPU<double> model(m);
    randomize(model, 11);
    const std::vector<int> inputs = random_tokens(B * T, m.vocab_size, 12);
    const std::vector<int> targets = random_tokens(B * T, m.vocab_size, 13);

    model.zero_grad();
    model.forward(inputs.data(), targets.data(), B, T);
    model.backward();
    const std::vector<double> grads = model.grads;

    // Padded vocabulary rows: no gradient at all.
    const size_t wte = offset_of(model.layout(), "wte");
    for (size_t i = (size_t)m.vocab_size * m.n_embd; i < (size_t)m.padded_vocab() * m.n_embd; i++)
        ASSERT_EQ(grads[wte + i], 0.0) << "padded wte element " << i;

    // Fourth-order central differences: truncation ~h^4 and rounding ~1e-16/h stay near 1e-12;
    // the relative-error floor of 1e-3 keeps near-zero gradients from dominating.
    const double h = 1e-4;
    auto loss_at = [&](size_t i, double value) {
        const double saved = model.params[i];
        model.params[i] = value;
        const double loss = model.forward(inputs.data(), targets.data(), B, T);
        model.params[i] = saved;
        return loss;
    };
    Rng pick(14);
    size_t checked = 0, large = 0;
    size_t off = 0;
    for (const ParamInfo& t : model.layout()) {
        const size_t real = off == wte ? (size_t)m.vocab_size * m.n_embd : t.size;
        const size_t n = std::min<size_t>(real, 64);
        double worst = 0;
        for (size_t j = 0; j < n; j++) {
            const size_t i = off + (real <= 64 ? j : pick.below(real));
            const double x = model.params[i];
            const double fd = (8 * (loss_at(i, x + h) - loss_at(i, x - h)) - (loss_at(i, x + 2 * h) - loss_at(i, x - 2 * h))) / (12 * h);
            const double rel = std::abs(fd - grads[i]) / std::max({std::abs(fd), std::abs(grads[i]), 1e-3});
            worst = std::max(worst, rel);
            large += std::abs(grads[i]) > 1e-3;
            checked++;
        }
        std::printf("%-9s worst relative error %.2e\n", t.name.c_str(), worst);
        EXPECT_LT(worst, 1e-6) << t.name;
        off += t.size;
    }
    // The check means something only if most checked gradients are far from zero.
    EXPECT_GT(large, checked * 3 / 4);
}

TEST(ModelCPU, PaddedVocabularyIsExcluded) {
    const ModelConfig m = small_config();
    const int B = 2, T = 8;
    GPT2CPU<float> model(m);
    model.init(1);
    const std::vector<int> inputs = random_tokens(B * T, m.vocab_size, 2), targets = random_tokens(B * T, m.vocab_size, 3);
    for (size_t i = (size_t)m.vocab_size * m.n_embd; i < (size_t)m.padded_vocab() * m.n_embd; i++)
        ASSERT_EQ(model.p().wte[i], 0.0f);
    const float loss = model.forward(inputs.data(), targets.data(), B, T);
    // Large padded logits would dominate the softmax if they were part of it.
    float* wte = model.p().wte;
    for (size_t i = (size_t)m.vocab_size * m.n_embd; i < (size_t)m.padded_vocab() * m.n_embd; i++) wte[i] = 5.0f;
    EXPECT_EQ(model.forward(inputs.data(), targets.data(), B, T), loss);
}

TEST(ModelCPU, Fp32LossAndGradientsMatchFp64) {
    const ModelConfig m = small_config();
    const int B = 2, T = 8;
    GPT2CPU<double> ref(m);
    randomize(ref, 21);
    GPT2CPU<float> model(m);
    std::transform(ref.params.begin(), ref.params.end(), model.params.begin(), [](double x) { return float(x); });
    for (double& x : ref.params) x = double(float(x));  // both models see the same weights
    const std::vector<int> inputs = random_tokens(B * T, m.vocab_size, 22), targets = random_tokens(B * T, m.vocab_size, 23);

    ref.zero_grad();
    model.zero_grad();
    const double ref_loss = ref.forward(inputs.data(), targets.data(), B, T);
    const double loss = model.forward(inputs.data(), targets.data(), B, T);
    EXPECT_NEAR(loss, ref_loss, 1e-5 * ref_loss);
    ref.backward();
    model.backward();
    size_t off = 0;
    for (const ParamInfo& t : ref.layout()) {
        double diff = 0, norm = 0;
        for (size_t i = off; i < off + t.size; i++) {
            diff += (model.grads[i] - ref.grads[i]) * (model.grads[i] - ref.grads[i]);
            norm += ref.grads[i] * ref.grads[i];
        }
        EXPECT_LT(std::sqrt(diff), 1e-4 * std::sqrt(norm)) << t.name;
        off += t.size;
    }
}

TEST(ModelCPU, InitMatchesGpt2) {
    ModelConfig m;  // gpt2-tiny: L=2, C=64, 4 heads, vocabulary 50257
    GPT2CPU<float> model(m);
    model.init(1337);
    const GPT2Params<float> p = model.p();
    auto stddev = [](const float* x, size_t n) {
        double s = 0;
        for (size_t i = 0; i < n; i++) s += double(x[i]) * x[i];
        return std::sqrt(s / n);
    };
    const size_t C = m.n_embd, L = m.n_layer;
    EXPECT_NEAR(stddev(p.wte, m.vocab_size * C), 0.02, 0.0005);
    EXPECT_NEAR(stddev(p.qkv_w, L * C * 3 * C), 0.02, 0.0005);
    EXPECT_NEAR(stddev(p.fcproj_w, L * 4 * C * C), 0.02 / std::sqrt(2.0 * L), 0.0005);
    EXPECT_EQ(stddev(p.wte + m.vocab_size * C, (m.padded_vocab() - m.vocab_size) * C), 0.0);
    EXPECT_EQ(stddev(p.qkv_b, L * 3 * C), 0.0);
    for (size_t i = 0; i < L * C; i++) ASSERT_EQ(p.ln1_w[i], 1.0f);

    // With small weights the logits are nearly uniform: loss ~ log(V) (+ var(logits)/2 ~ 0.013).
    const int B = 2, T = 64;
    const std::vector<int> inputs = random_tokens(B * T, m.vocab_size, 2), targets = random_tokens(B * T, m.vocab_size, 3);
    const float loss = model.forward(inputs.data(), targets.data(), B, T);
    EXPECT_NEAR(loss, std::log(50257.0), 0.05);
}

TEST(ModelCPU, LogitsDoNotDependOnLaterTokens) {
    const ModelConfig m = small_config();
    const int B = 2, T = 8, t0 = 5;
    const size_t Vp = m.padded_vocab();
    GPT2CPU<float> model(m);
    model.init(3);
    std::vector<int> inputs = random_tokens(B * T, m.vocab_size, 4);
    model.forward(inputs.data(), nullptr, B, T);
    const std::vector<float> before(model.logits(), model.logits() + B * T * Vp);
    inputs[t0] = (inputs[t0] + 1) % m.vocab_size;  // batch row 0, position t0
    model.forward(inputs.data(), nullptr, B, T);
    const float* after = model.logits();
    EXPECT_EQ(std::memcmp(before.data(), after, t0 * Vp * sizeof(float)), 0) << "positions before t0 changed";
    EXPECT_NE(std::memcmp(before.data() + t0 * Vp, after + t0 * Vp, Vp * sizeof(float)), 0) << "position t0 did not change";
    EXPECT_EQ(std::memcmp(before.data() + T * Vp, after + T * Vp, T * Vp * sizeof(float)), 0) << "batch row 1 changed";
}

TEST(ModelCPU, AccumulatedMicroBatchesMatchFullBatch) {
    const ModelConfig m = small_config();
    const int B = 2, T = 8;
    GPT2CPU<double> model(m);
    randomize(model, 31);
    const std::vector<int> inputs = random_tokens(B * T, m.vocab_size, 32), targets = random_tokens(B * T, m.vocab_size, 33);

    model.zero_grad();
    const double full_loss = model.forward(inputs.data(), targets.data(), B, T);
    model.backward();
    const std::vector<double> full = model.grads;

    model.zero_grad();
    double loss = 0;
    for (int half = 0; half < 2; half++) {
        loss += model.forward(inputs.data() + half * T, targets.data() + half * T, 1, T) / 2;
        model.backward(0.5);
    }
    EXPECT_NEAR(loss, full_loss, 1e-12 * full_loss);
    double max_grad = 0, max_diff = 0;
    for (size_t i = 0; i < full.size(); i++) {
        max_grad = std::max(max_grad, std::abs(full[i]));
        max_diff = std::max(max_diff, std::abs(full[i] - model.grads[i]));
    }
    EXPECT_LT(max_diff, 1e-12 * max_grad);
}

TEST(ModelCPU, BitIdenticalAcrossRunsAndThreadCounts) {
    // Large enough that every matmul has several tiles and K-blocks.
    ModelConfig m;
    m.vocab_size = 1000;
    const int B = 4, T = 64;
    const std::vector<int> inputs = random_tokens(B * T, m.vocab_size, 5), targets = random_tokens(B * T, m.vocab_size, 6);
    auto run = [&](uint64_t seed, int threads, std::vector<float>* grads) {
        const int saved = omp_get_max_threads();
        omp_set_num_threads(threads);
        GPT2CPU<float> model(m);
        model.init(seed);
        model.zero_grad();
        const float loss = model.forward(inputs.data(), targets.data(), B, T);
        model.backward();
        omp_set_num_threads(saved);
        *grads = model.grads;
        return loss;
    };
    std::vector<float> g1, g2, g3, g4;
    const float loss1 = run(7, 2, &g1), loss2 = run(7, 2, &g2), loss3 = run(7, 1, &g3), loss4 = run(8, 2, &g4);
    EXPECT_EQ(loss1, loss2);
    EXPECT_TRUE(g1 == g2);
    EXPECT_EQ(loss1, loss3) << "result depends on the thread count";
    EXPECT_TRUE(g1 == g3) << "gradients depend on the thread count";
    EXPECT_NE(loss1, loss4) << "the seed does not change the model";
}

namespace {

std::vector<float> read_floats(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::vector<float> v(std::filesystem::file_size(path) / sizeof(float));
    f.read(reinterpret_cast<char*>(v.data()), (std::streamsize)(v.size() * sizeof(float)));
    return v;
}

}  // namespace

// CODAGPT_DUMP=DIR:0: layer 0's tensors of the first step, as fp32 [tokens, width]; x is the
// embedding (wte[token] + wpe[position]); a later step leaves them as they are; other layers write nothing.
TEST(ModelCPU, DumpWritesTheListedLayersOfTheFirstStep) {
    test::TempDir dir;
    test::ScopedEnv env("CODAGPT_DUMP", dir.path.string() + ":0");
    ASSERT_TRUE(check_dump_env());
    const ModelConfig m = small_config();
    GPT2CPU<float> model(m);
    randomize(model, 5);
    const int B = 2, T = 8, C = m.n_embd;
    const std::vector<int> in = random_tokens(B * T, m.vocab_size, 6), tgt = random_tokens(B * T, m.vocab_size, 7);
    model.forward(in.data(), tgt.data(), B, T);
    model.backward(1.f);
    const std::vector<float> x = read_floats(dir / "x_0.f32");
    ASSERT_EQ(x.size(), (size_t)B * T * C);
    const GPT2Params<float> p = model.p();
    for (int i = 0; i < B * T; i++)
        for (int c = 0; c < C; c++)
            ASSERT_EQ(x[(size_t)i * C + c], p.wte[(size_t)in[i] * C + c] + p.wpe[(size_t)(i % T) * C + c]) << i << " " << c;
    for (const char* name : {"qkv", "dqkv"}) EXPECT_EQ(read_floats(dir / (name + std::string("_0.f32"))).size(), (size_t)B * T * 3 * C) << name;
    for (const char* name : {"y", "dout", "dy"}) {
        const std::vector<float> v = read_floats(dir / (name + std::string("_0.f32")));
        ASSERT_EQ(v.size(), (size_t)B * T * C) << name;
        EXPECT_TRUE(std::any_of(v.begin(), v.end(), [](float a) { return a != 0.f; })) << name;
    }
    EXPECT_FALSE(std::filesystem::exists(dir / "x_1.f32"));

    const std::vector<int> other = random_tokens(B * T, m.vocab_size, 8);
    model.forward(other.data(), tgt.data(), B, T);
    EXPECT_EQ(read_floats(dir / "x_0.f32"), x);
}

TEST(ModelCPU, DumpRefusesAMalformedSetting) {
    test::TempDir dir;
    const std::pair<std::string, const char*> cases[] = {
        {"no_colon", "must be DIR:LAYER"},
        {dir.path.string() + ":", "must be DIR:LAYER"},
        {dir.path.string() + ":1,x", "'x' is not a layer number"},
        {dir.path.string() + ":-2", "'-2' is not a layer number"},
        {"/nonexistent_dir:1", "no directory /nonexistent_dir"},
    };
    for (const auto& [value, message] : cases) {
        test::ScopedEnv env("CODAGPT_DUMP", value);
        EXPECT_TRUE(test::mentions(test::error_of([] { check_dump_env(); }), message)) << value;
    }
    test::ScopedEnv off("CODAGPT_DUMP", "");
    EXPECT_FALSE(check_dump_env());
    EXPECT_FALSE(dump_layer(0));
}
