// Sampling: the KV-cache decoder against the CPU reference's full forward, and the sampler's
// determinism, greedy limit, top-k and temperature.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "model_cpu.hpp"
#include "rng.hpp"
#include "sample.hpp"
#include "test_util.hpp"

namespace codagpt {
namespace {

ModelConfig tiny_model() {
    ModelConfig m;
    m.n_layer = 2;
    m.n_head = 4;
    m.n_embd = 32;
    m.max_seq_len = 24;
    m.vocab_size = 300;
    return m;
}

// GPT-2 init, then every tensor (LayerNorm and biases too) perturbed so that no term vanishes.
std::vector<float> tiny_params(const ModelConfig& m) {
    GPT2CPU<float> model(m);
    model.init(7);
    Rng rng(11);
    for (float& x : model.params) x += float(0.05 * rng.normal());
    for (size_t i = size_t(m.vocab_size) * m.n_embd; i < size_t(m.padded_vocab()) * m.n_embd; i++)
        model.params[i] = 0;
    return model.params;
}

TEST(Sample, KvCacheLogitsEqualFullForwardAtEveryPosition) {
    const ModelConfig m = tiny_model();
    const std::vector<float> params = tiny_params(m);
    const int T = m.max_seq_len;
    std::vector<int> tokens(T);
    for (int t = 0; t < T; t++) tokens[t] = (t * 37 + 5) % m.vocab_size;

    GPT2CPU<float> full(m);
    full.params = params;
    full.forward(tokens.data(), nullptr, 1, T);

    GPT2Decoder dec(m, params.data());
    double worst = 0, scale = 0;
    for (int t = 0; t < T; t++) {
        const float* logits = dec.step(tokens[t]);
        const float* ref = full.logits() + size_t(t) * m.padded_vocab();
        for (int v = 0; v < m.vocab_size; v++) {
            worst = std::max(worst, std::abs(double(logits[v]) - ref[v]));
            scale = std::max(scale, std::abs(double(ref[v])));
        }
    }
    EXPECT_GT(scale, 0.1);
    EXPECT_LT(worst, 2e-5 * std::max(1.0, scale)) << "largest |logit| " << scale;
    EXPECT_EQ(dec.position(), T);
    EXPECT_TRUE(test::mentions(test::error_of([&] { dec.step(0); }), "context full"));
    dec.reset();
    EXPECT_TRUE(test::mentions(test::error_of([&] { dec.step(m.vocab_size); }), "outside the vocabulary"));
}

// A prompt in one call (the prefill) leaves the cache as feeding it token by token does: the same
// logits after it, and after every later token, bit for bit.
TEST(Sample, PrefillEqualsOneTokenAtATime) {
    const ModelConfig m = tiny_model();
    const std::vector<float> params = tiny_params(m);
    const std::vector<int> prompt = {9, 8, 7, 6, 5}, rest = {4, 3, 2};
    GPT2Decoder a(m, params.data()), b(m, params.data());
    const float* la = a.feed(prompt.data(), int(prompt.size()));
    std::vector<float> got(la, la + m.vocab_size);
    const float* lb = nullptr;
    for (int t : prompt) lb = b.step(t);
    EXPECT_EQ(got, std::vector<float>(lb, lb + m.vocab_size));
    EXPECT_EQ(a.position(), 5);
    for (int t : rest) {
        la = a.step(t);
        lb = b.step(t);
        EXPECT_EQ(std::vector<float>(la, la + m.vocab_size), std::vector<float>(lb, lb + m.vocab_size));
    }
}

// Refused calls change nothing: the next call continues where the last good one left off.
TEST(Sample, BadFeedsAreRefusedWithoutEffect) {
    const ModelConfig m = tiny_model();
    const std::vector<float> params = tiny_params(m);
    GPT2Decoder dec(m, params.data()), ref(m, params.data());
    const std::vector<int> prompt(20, 3);
    dec.feed(prompt.data(), 20);
    ref.feed(prompt.data(), 20);
    const std::vector<int> five(5, 1);
    EXPECT_TRUE(test::mentions(test::error_of([&] { dec.feed(five.data(), 5); }), "context full"));
    EXPECT_TRUE(test::mentions(test::error_of([&] { dec.feed(five.data(), 0); }), "at least one token"));
    const std::vector<int> bad = {1, -1};
    EXPECT_TRUE(test::mentions(test::error_of([&] { dec.feed(bad.data(), 2); }), "token id -1"));
    EXPECT_EQ(dec.position(), 20);
    const float* l = dec.step(2);
    const float* r = ref.step(2);
    EXPECT_EQ(std::vector<float>(l, l + m.vocab_size), std::vector<float>(r, r + m.vocab_size));
}

TEST(Sample, SameSeedSameTokens) {
    const ModelConfig m = tiny_model();
    const std::vector<float> params = tiny_params(m);
    GPT2Decoder dec(m, params.data());
    SampleOptions opt;
    opt.max_tokens = 12;
    opt.temperature = 1.5;
    opt.top_k = 50;
    opt.seed = 42;
    const std::vector<int> a = generate(dec, {1, 2, 3}, opt);
    const std::vector<int> b = generate(dec, {1, 2, 3}, opt);
    EXPECT_EQ(a.size(), 12u);
    EXPECT_EQ(a, b);
    opt.seed = 43;
    EXPECT_NE(generate(dec, {1, 2, 3}, opt), a);
}

TEST(Sample, TopKOneIsGreedy) {
    const ModelConfig m = tiny_model();
    const std::vector<int> prompt = {3, 1, 4};
    const std::vector<float> params = tiny_params(m);
    GPT2Decoder dec(m, params.data());
    SampleOptions opt;
    opt.max_tokens = 8;
    opt.top_k = 1;
    opt.temperature = 3.0;
    const std::vector<int> got = generate(dec, prompt, opt);

    // Greedy by the full forward: argmax of the last row, appended, repeated.
    std::vector<int> seq = prompt;
    GPT2CPU<float> full(m);
    full.params = params;
    for (int i = 0; i < opt.max_tokens; i++) {
        full.forward(seq.data(), nullptr, 1, int(seq.size()));
        const float* last = full.logits() + (seq.size() - 1) * m.padded_vocab();
        seq.push_back(int(std::max_element(last, last + m.vocab_size) - last));
    }
    EXPECT_EQ(got, std::vector<int>(seq.begin() + prompt.size(), seq.end()));
    opt.top_k = 0;
    opt.temperature = 0;  // temperature 0 is greedy too
    EXPECT_EQ(generate(dec, prompt, opt), got);
}

TEST(Sample, StopsWhenTheContextIsFull) {
    const ModelConfig m = tiny_model();
    const std::vector<float> params = tiny_params(m);
    GPT2Decoder dec(m, params.data());
    SampleOptions opt;
    opt.max_tokens = 100;
    int seen = 0;
    const std::vector<int> got = generate(dec, std::vector<int>(20, 1), opt, [&](int) { seen++; });
    EXPECT_EQ(got.size(), 5u);  // positions 20..23 fed, and the token after the last
    EXPECT_EQ(seen, 5);
}

// Two logits 0 and log 2: P(1) = 2^(1/T) / (1 + 2^(1/T)).
TEST(Sample, TemperatureScalesTheDistribution) {
    const float logits[2] = {0.0f, float(std::log(2.0))};
    for (double temp : {0.5, 1.0, 2.0}) {
        Rng rng(5);
        const int n = 40000;
        int ones = 0;
        for (int i = 0; i < n; i++) ones += sample_token(logits, 2, temp, 0, rng);
        const double want = std::pow(2.0, 1 / temp) / (1 + std::pow(2.0, 1 / temp));
        EXPECT_NEAR(double(ones) / n, want, 0.01) << "temperature " << temp;
    }
}

TEST(Sample, TopKNeverLeavesTheTopK) {
    std::vector<float> logits(50);
    for (int i = 0; i < 50; i++) logits[i] = float((i * 17) % 50) * 0.01f;  // a permutation
    Rng rng(9);
    std::vector<int> hits(50);
    for (int i = 0; i < 5000; i++) hits[sample_token(logits.data(), 50, 10.0, 3, rng)]++;
    for (int i = 0; i < 50; i++) {
        const bool top3 = (i * 17) % 50 >= 47;
        if (top3)
            EXPECT_GT(hits[i], 1000) << i;
        else
            EXPECT_EQ(hits[i], 0) << i;
    }
}

TEST(Sample, Utf8StreamHoldsPartialCharacters) {
    Utf8Stream s;
    EXPECT_EQ(s.push("ab\xC3"), "ab");        // é = C3 A9, split across tokens
    EXPECT_EQ(s.push("\xA9 x"), "\xC3\xA9 x");
    EXPECT_EQ(s.push("\xF0\x9F"), "");        // a 4-byte emoji in three pieces
    EXPECT_EQ(s.push("\x98"), "");
    EXPECT_EQ(s.push("\x80!"), "\xF0\x9F\x98\x80!");
    EXPECT_EQ(s.push("\xE2\x82"), "");
    EXPECT_EQ(s.flush(), "\xE2\x82");         // an unfinished character is still printed at the end
    EXPECT_EQ(s.push("\x80\x80"), "\x80\x80"); // stray continuation bytes pass through
}

}  // namespace
}  // namespace codagpt
