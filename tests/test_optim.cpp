// AdamW, clipping, the learning-rate schedule, the gradient norm, and a short training run.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "master_weights.cuh"
#include "model_cpu.hpp"
#include "optim_cpu.hpp"
#include "rng.hpp"
#include "test_util.hpp"

using namespace codagpt;

namespace {

std::vector<float> random_vector(size_t n, double std, uint64_t seed) {
    Rng rng(seed);
    std::vector<float> x(n);
    for (float& v : x) v = float(std * rng.normal());
    return x;
}

// The textbook AdamW update of one scalar, in double.
struct ScalarAdamW {
    double p, m = 0, v = 0;
    void step(double g, double lr, int t, bool decay, const TrainConfig& c) {
        m = c.beta1 * m + (1 - c.beta1) * g;
        v = c.beta2 * v + (1 - c.beta2) * g * g;
        const double m_hat = m / (1 - std::pow(c.beta1, t)), v_hat = v / (1 - std::pow(c.beta2, t));
        p -= lr * (m_hat / (std::sqrt(v_hat) + c.adam_eps) + (decay ? c.weight_decay * p : 0.0));
    }
};

}  // namespace

TEST(AdamW, MatchesScalarFormulaWithAndWithoutDecay) {
    const std::vector<ParamInfo> layout = {{"w", 5, true}, {"b", 3, false}};
    TrainConfig c;
    c.grad_clip = 0;
    c.weight_decay = 0.5;  // large, so a decay applied to the wrong tensor shows
    std::vector<float> params = random_vector(8, 1.0, 1);
    std::vector<ScalarAdamW> ref;
    for (float p : params) ref.push_back({p});
    AdamWCPU opt(layout);
    for (int t = 1; t <= 3; t++) {
        const std::vector<float> grads = random_vector(8, 0.1, 10 + t);
        const double lr = 1e-2 * t;
        opt.step(params.data(), grads.data(), lr, global_grad_norm(grads.data(), grads.size()), c);
        for (size_t i = 0; i < params.size(); i++) {
            ref[i].step(grads[i], lr, t, i < 5, c);
            EXPECT_NEAR(params[i], ref[i].p, 1e-6 * std::max(1.0, std::abs(ref[i].p))) << "step " << t << " element " << i;
        }
    }
    EXPECT_EQ(opt.t, 3);
}

TEST(AdamW, ClipsByGlobalNorm) {
    const std::vector<ParamInfo> layout = {{"w", 4, true}};
    TrainConfig c;
    c.grad_clip = 10.0;
    const std::vector<float> params = {0.5f, -0.25f, 1.0f, 2.0f};
    const std::vector<float> grads = {3.0f, -4.0f, 0.0f, 12.0f};  // norm 13
    const double norm = global_grad_norm(grads.data(), grads.size());
    ASSERT_DOUBLE_EQ(norm, 13.0);

    // Clipped: the first moment is (1 - beta1) * g * 10 / 13.
    AdamWCPU clipped(layout);
    std::vector<float> p1 = params;
    clipped.step(p1.data(), grads.data(), 1e-3, norm, c);
    for (size_t i = 0; i < grads.size(); i++)
        EXPECT_NEAR(clipped.m[i], (1 - c.beta1) * grads[i] * 10.0 / 13.0, 1e-6);

    // Below the threshold, or with clipping off, gradients are used as they are.
    for (double clip : {20.0, 0.0}) {
        c.grad_clip = clip;
        AdamWCPU opt(layout);
        std::vector<float> p2 = params;
        opt.step(p2.data(), grads.data(), 1e-3, norm, c);
        for (size_t i = 0; i < grads.size(); i++) EXPECT_NEAR(opt.m[i], (1 - c.beta1) * grads[i], 1e-6);
    }
}

// lr 1e-3 down to 1e-4, 10 steps of warmup, 111 steps: the decays run over steps 10..110.
static TrainConfig schedule_config(const std::string& schedule) {
    TrainConfig c;
    c.lr = 1e-3;
    c.min_lr_frac = 0.1;
    c.warmup_steps = 10;
    c.steps = 111;
    c.lr_schedule = schedule;
    return c;
}

// The master weights' two halves (master_weights.cuh), on the host: the pair is the fp32 weight
// bit for bit, and the bf16 half is the weight rounded to nearest with ties away from zero, checked
// against the two bf16 neighbours picked by distance in double.
namespace {
float from_bits(uint32_t u) {
    float x;
    std::memcpy(&x, &u, 4);
    return x;
}
uint32_t to_bits(float x) {
    uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
}
}  // namespace

TEST(MasterWeights, HalvesJoinToTheSameBitsAndRoundToNearestTiesAway) {
    std::vector<uint32_t> cases = {0x00000000u, 0x80000000u, 0x3f800000u, 0x3f808000u /* tie, even below */,
                                   0x3f818000u /* tie, odd below */, 0xbf808000u, 0x3f7fffffu, 0x3f7f8000u,
                                   0x3f80ffffu, 0x00008000u, 0x00000001u, 0x807fffffu, 0x7f7fffffu /* rounds to inf */,
                                   0x7f800000u, 0xff800000u, 0x477fe000u, 0x4effffffu};
    Rng rng(5);
    for (int i = 0; i < 200000; i++) cases.push_back((uint32_t)rng.next_u64());                // any bits
    for (int i = 0; i < 200000; i++) cases.push_back(to_bits(float(0.02 * rng.normal())));  // weights
    for (int i = 0; i < 20000; i++) cases.push_back((to_bits(float(rng.normal())) & 0xffff0000u) | 0x8000u);  // ties
    long ties_up = 0, ties_down = 0;
    for (uint32_t u : cases) {
        const float x = from_bits(u);
        const uint16_t hi = master_hi(x), lo = master_lo(x);
        const float w = from_bits((uint32_t)hi << 16), back = master_join(hi, lo);
        if (std::isnan(x)) {
            EXPECT_TRUE(std::isnan(w) && std::isnan(back)) << std::hex << u;
            continue;
        }
        ASSERT_EQ(to_bits(back), u) << std::hex << u;
        ASSERT_EQ(to_bits(w), to_bits(test::nearest_bf16_ties_away(x))) << std::hex << u;
        if ((u & 0xffffu) == 0x8000u) (std::fabs(w) > std::fabs(x) ? ties_up : ties_down)++;
    }
    EXPECT_GT(ties_up, 20000);  // every tie went away from zero
    EXPECT_EQ(ties_down, 0);
    const float nan = from_bits(0x7f800001u);  // a NaN whose payload lies in the low half only
    EXPECT_TRUE(std::isnan(from_bits((uint32_t)master_hi(nan) << 16)));
    EXPECT_TRUE(std::isnan(master_join(master_hi(nan), master_lo(nan))));
}

TEST(Schedule, WarmupThenCosineToMinimum) {
    TrainConfig c = schedule_config("cosine");
    EXPECT_DOUBLE_EQ(lr_at(c, 0), 1e-4);
    EXPECT_DOUBLE_EQ(lr_at(c, 4), 5e-4);
    EXPECT_DOUBLE_EQ(lr_at(c, 9), 1e-3);
    EXPECT_DOUBLE_EQ(lr_at(c, 10), 1e-3);
    EXPECT_NEAR(lr_at(c, 60), 0.55e-3, 1e-15);  // halfway through the decay: (lr + min) / 2
    EXPECT_NEAR(lr_at(c, 110), 1e-4, 1e-15);
    for (int s = 1; s < 10; s++) EXPECT_GT(lr_at(c, s), lr_at(c, s - 1));
    for (int s = 11; s < 111; s++) EXPECT_LT(lr_at(c, s), lr_at(c, s - 1)) << s;

    c.warmup_steps = 0;  // no warmup: the first step runs at lr
    EXPECT_DOUBLE_EQ(lr_at(c, 0), 1e-3);
    EXPECT_NEAR(lr_at(c, 110), 1e-4, 1e-15);
}

TEST(Schedule, LinearConstantAndWarmupStableDecay) {
    TrainConfig c = schedule_config("linear");
    EXPECT_DOUBLE_EQ(lr_at(c, 4), 5e-4);  // the same warmup
    EXPECT_DOUBLE_EQ(lr_at(c, 10), 1e-3);
    EXPECT_NEAR(lr_at(c, 35), 1e-3 - 0.25 * 0.9e-3, 1e-15);  // a quarter of the way down
    EXPECT_NEAR(lr_at(c, 110), 1e-4, 1e-15);
    for (int s = 11; s < 111; s++) EXPECT_NEAR(lr_at(c, s - 1) - lr_at(c, s), 0.9e-3 / 100, 1e-15) << s;

    c.lr_schedule = "constant";
    EXPECT_DOUBLE_EQ(lr_at(c, 4), 5e-4);
    for (int s : {10, 50, 110}) EXPECT_DOUBLE_EQ(lr_at(c, s), 1e-3);

    c.lr_schedule = "wsd";
    c.cooldown_frac = 0.2;  // round(0.2 x 111) = 22 steps of decay: 88..110
    EXPECT_DOUBLE_EQ(lr_at(c, 4), 5e-4);
    for (int s = 10; s <= 88; s++) EXPECT_DOUBLE_EQ(lr_at(c, s), 1e-3) << s;
    for (int s = 89; s < 111; s++) EXPECT_LT(lr_at(c, s), lr_at(c, s - 1)) << s;
    EXPECT_NEAR(lr_at(c, 99), 0.5 * (1e-3 + 1e-4), 1e-15);
    EXPECT_NEAR(lr_at(c, 110), 1e-4, 1e-15);

    // A cooldown too short to round to a step: lr until the last step, which runs at the minimum.
    c.cooldown_frac = 0.001;
    for (int s = 10; s < 110; s++) EXPECT_DOUBLE_EQ(lr_at(c, s), 1e-3) << s;
    EXPECT_DOUBLE_EQ(lr_at(c, 110), 1e-4);

    // A cooldown over every step after the warmup is the linear schedule.
    c.cooldown_frac = 1;
    const TrainConfig linear = schedule_config("linear");
    for (int s = 0; s < 111; s++) EXPECT_EQ(lr_at(c, s), lr_at(linear, s)) << s;
}

TEST(GradNorm, MatchesDirectSum) {
    const std::vector<float> g = random_vector(300001, 0.01, 7);  // several chunks plus a tail
    double sum = 0;
    for (float x : g) sum += double(x) * x;
    EXPECT_NEAR(global_grad_norm(g.data(), g.size()), std::sqrt(sum), 1e-12 * std::sqrt(sum));
    EXPECT_EQ(global_grad_norm(g.data(), 0), 0.0);
}

// gpt2-tiny on one fixed batch of a learnable sequence (each token determines the next): the loss
// must fall far below its initial ~log(V). Also reports the time of a training step.
TEST(Training, LossFallsOnFixedBatch) {
    TrainConfig c;  // gpt2-tiny defaults: L=2, C=64, 4 heads, vocabulary 50257, B=8, T=64
    c.steps = 50;
    // Adam moves each weight by about lr per step: at 1e-3, 50 steps only reach loss ~7.5 from
    // 0.02-sized weights; 3e-3 (with the default warmup and cosine) reaches ~2.6.
    c.lr = 3e-3;
    const int B = c.batch_size, T = c.seq_len;
    std::vector<int> tokens(B * T + 1);
    tokens[0] = 1;
    for (size_t i = 1; i < tokens.size(); i++) tokens[i] = (tokens[i - 1] * 37 + 11) % 500;
    const std::vector<int> inputs(tokens.begin(), tokens.end() - 1), targets(tokens.begin() + 1, tokens.end());

    GPT2CPU<float> model(c.model);
    model.init(c.seed);
    AdamWCPU opt(model.layout());
    float first = 0, last = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int step = 0; step < c.steps; step++) {
        model.zero_grad();
        last = model.forward(inputs.data(), targets.data(), B, T);
        if (step == 0) first = last;
        model.backward();
        const double norm = global_grad_norm(model.grads.data(), model.grads.size());
        opt.step(model.params.data(), model.grads.data(), lr_at(c, step), norm, c);
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / c.steps;
    std::printf("gpt2-tiny B=%d T=%d: %.1f ms per step (forward+backward+AdamW), loss %.3f -> %.3f\n", B, T, ms,
                first, last);
    RecordProperty("ms_per_step", std::to_string(ms));
    EXPECT_NEAR(first, std::log(50257.0), 0.1);
    EXPECT_LT(last, 0.5 * first);
}
