// Guards of the training loop on the CPU reference: a step whose loss or gradient norm is not
// finite is skipped (no optimizer update), logged, and max_bad_steps of them in a row stop the run.
// Faults are injected by a backend wrapper (TrainOptions::wrap_backend).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "backend.hpp"
#include "sample.hpp"
#include "config.hpp"
#include "data.hpp"
#include "outlier_window.hpp"
#include "rng.hpp"
#include "test_util.hpp"
#include "train.hpp"
#include "train_fixture.hpp"

namespace fs = std::filesystem;
using namespace codagpt;
using codagpt::test::SyntheticRun;

namespace {

// Passes everything through to the real backend, except that the steps (1-based) in nan_loss
// return a NaN loss and those in nan_norm a NaN gradient norm, and those in spike_loss (spike_norm)
// a loss (gradient norm) 100 times the real one. Counts optimizer updates.
struct FaultyBackend final : TrainBackend {
    std::unique_ptr<TrainBackend> inner;
    std::set<int> nan_loss, nan_norm, spike_loss, spike_norm;
    int* updates;
    int step = 0;  // of the current step, 1-based (zero_grad starts a step)
    bool in_step = false;

    FaultyBackend(std::unique_ptr<TrainBackend> b, std::set<int> loss, std::set<int> norm, int* n)
        : inner(std::move(b)), nan_loss(std::move(loss)), nan_norm(std::move(norm)), updates(n) {}
    std::string describe() const override { return "faulty " + inner->describe(); }
    size_t num_params() const override { return inner->num_params(); }
    void zero_grad() override {
        if (!in_step) step++;  // the loop also zeroes the gradients of a skipped step
        in_step = true;
        inner->zero_grad();
    }
    double forward_backward(const int* in, const int* tgt, float scale) override {
        in_step = false;
        const double loss = inner->forward_backward(in, tgt, scale);
        if (nan_loss.count(step)) return std::numeric_limits<double>::quiet_NaN();
        return spike_loss.count(step) ? 100 * loss : loss;
    }
    double evaluate(const int* in, const int* tgt) override { return inner->evaluate(in, tgt); }
    std::vector<float> evaluate_tokens(const int* in, const int* tgt) override {
        return inner->evaluate_tokens(in, tgt);
    }
    double grad_norm() override {
        const double n = inner->grad_norm();
        return nan_norm.count(step) ? std::numeric_limits<double>::infinity() : spike_norm.count(step) ? 100 * n : n;
    }
    std::vector<float> gradients() const override { return inner->gradients(); }
    void apply_update(double lr, double norm, const TrainConfig& c) override {
        EXPECT_TRUE(std::isfinite(norm)) << "update with a non-finite norm at step " << step;
        ++*updates;
        inner->apply_update(lr, norm, c);
    }
    TrainState save_state() const override { return inner->save_state(); }
    void load_state(const TrainState& s) override { inner->load_state(s); }
    void load_params(const std::vector<float>& p) override { inner->load_params(p); }
    std::unique_ptr<Decoder> make_decoder() const override { return inner->make_decoder(); }
};

struct Guards : ::testing::Test {
    SyntheticRun synth{"guards", ModelConfig{1, 2, 32, 16, 256}, 2, 16, 4000, 4000, /*noise=*/1.0};
    fs::path dir = synth.dir.path;
    TrainConfig& cfg = synth.cfg;
    int updates = 0;
    void SetUp() override {
        cfg.steps = 10;
        cfg.eval_every = 0;
        cfg.eval_batches = 1;
        cfg.max_bad_steps = 3;
    }

    TrainOptions options(std::set<int> nan_loss, std::set<int> nan_norm, std::set<int> spike_loss = {},
                         std::set<int> spike_norm = {}) {
        TrainOptions opt;
        opt.device = "cpu";
        opt.quiet = true;
        opt.wrap_backend = [=](std::unique_ptr<TrainBackend> b) -> std::unique_ptr<TrainBackend> {
            auto faulty = std::make_unique<FaultyBackend>(std::move(b), nan_loss, nan_norm, &updates);
            faulty->spike_loss = spike_loss;
            faulty->spike_norm = spike_norm;
            return faulty;
        };
        return opt;
    }
    std::vector<nlohmann::json> metrics() const {
        std::vector<nlohmann::json> lines;
        std::ifstream f(fs::path(cfg.out_dir) / "metrics.jsonl");
        for (std::string line; std::getline(f, line);) lines.push_back(nlohmann::json::parse(line));
        return lines;
    }
};

}  // namespace

TEST_F(Guards, BadStepsAreSkippedAndTheRunRecovers) {
    // Two bad steps in a row (fewer than max_bad_steps), then a third one later: all skipped.
    ASSERT_EQ(run_train(cfg, options({3, 4}, {7})), 0);
    EXPECT_EQ(updates, 7);  // 10 steps, 3 skipped: the optimizer never sees them
    std::map<int, std::string> skipped;
    std::vector<int> trained;
    for (const auto& j : metrics()) {
        if (j.contains("skipped")) skipped[j["step"].get<int>()] = j["skipped"].get<std::string>();
        if (j.contains("loss")) {
            trained.push_back(j["step"].get<int>());
            EXPECT_TRUE(std::isfinite(j["loss"].get<double>()));
            EXPECT_TRUE(std::isfinite(j["grad_norm"].get<double>()));
        }
    }
    EXPECT_EQ(skipped, (std::map<int, std::string>{
                           {3, "non-finite loss"}, {4, "non-finite loss"}, {7, "non-finite grad norm"}}));
    EXPECT_EQ(trained, (std::vector<int>{1, 2, 5, 6, 8, 9, 10}));
}

TEST_F(Guards, SkippedStepLeavesTheWeightsAlone) {
    // A 2-step run whose step 2 has a poisoned norm ends with the weights and moments of a 1-step run.
    // (Warmup: the first step's learning rate does not depend on `steps`.)
    cfg.steps = 2;
    TrainConfig one = cfg;
    one.steps = 1;
    one.out_dir = (dir / "one").string();
    one.ckpt_every = 1;
    ASSERT_EQ(run_train(one, options({}, {})), 0);
    updates = 0;
    TrainConfig skip = cfg;
    skip.out_dir = (dir / "skip").string();
    skip.ckpt_every = 2;
    ASSERT_EQ(run_train(skip, options({}, {2})), 0);
    EXPECT_EQ(updates, 1);
    std::ifstream a(fs::path(one.out_dir) / "ckpt_1.bin", std::ios::binary), b(fs::path(skip.out_dir) / "ckpt_2.bin", std::ios::binary);
    ASSERT_TRUE(a && b);
    // Compare the tensor data: the metadata differs in step and out_dir, the weights must not.
    const std::string sa((std::istreambuf_iterator<char>(a)), {}), sb((std::istreambuf_iterator<char>(b)), {});
    ASSERT_GT(sa.size(), 1000u);
    const size_t tensors = 12 * ModelConfig{1, 2, 32, 16, 256}.num_params();
    ASSERT_GE(sa.size(), tensors + 4);
    ASSERT_GE(sb.size(), tensors + 4);
    EXPECT_TRUE(sa.compare(sa.size() - 4 - tensors, tensors, sb, sb.size() - 4 - tensors, tensors) == 0)
        << "a skipped step changed the weights or AdamW moments";
}

TEST_F(Guards, MaxBadStepsInARowStopTheRun) {
    const std::string msg = test::error_of([&] { run_train(cfg, options({2}, {3, 4})); });
    EXPECT_TRUE(test::mentions(msg, "stopping at step 4"));
    EXPECT_TRUE(test::mentions(msg, "3 steps in a row"));
    EXPECT_TRUE(test::mentions(msg, "max_bad_steps 3"));
    EXPECT_EQ(msg.find('\n'), std::string::npos);
    EXPECT_EQ(updates, 1);
    const auto lines = metrics();
    ASSERT_EQ(lines.size(), 4u);
    EXPECT_EQ(lines[1]["skipped"], "non-finite loss");
    EXPECT_EQ(lines[3]["skipped"], "non-finite grad norm");
}

// max_bad_steps counts on across a resume: a run stopped inside a streak of bad steps and resumed
// stops at the step where the uninterrupted run stops.
TEST_F(Guards, BadStepsInARowCountAcrossAResume) {
    cfg.ckpt_every = 100;  // the --stop-after checkpoint only
    TrainOptions first = options({2}, {3});
    first.stop_after = 3;
    ASSERT_EQ(run_train(cfg, first), 0);
    TrainOptions rest = options({1}, {});  // the resumed run's first step is step 4
    rest.resume = "latest";
    const std::string msg = test::error_of([&] { run_train(cfg, rest); });
    EXPECT_TRUE(test::mentions(msg, "stopping at step 4"));
    EXPECT_TRUE(test::mentions(msg, "3 steps in a row"));
}

TEST_F(Guards, MaxBadStepsIsAValidatedConfigKey) {
    cfg.max_bad_steps = 1;
    EXPECT_TRUE(test::mentions(test::error_of([&] { run_train(cfg, options({5}, {})); }), "stopping at step 5"));
    cfg.max_bad_steps = 0;
    EXPECT_TRUE(test::mentions(test::error_of([&] { validate(cfg); }), "max_bad_steps: must be >= 1"));
    EXPECT_EQ(TrainConfig{}.max_bad_steps, 3);
}

TEST(OutlierWindow, ZAgainstAFullWindowOfThePreviousValues) {
    OutlierWindow w(4);
    for (double v : {1.0, 2.0, 3.0}) w.push(v);
    EXPECT_TRUE(std::isnan(w.z(10)));  // not full yet
    w.push(4);
    const double mean = 2.5, sd = std::sqrt((1.5 * 1.5 + 0.5 * 0.5) * 2 / 4);
    EXPECT_DOUBLE_EQ(w.z(10), (10 - mean) / sd);
    EXPECT_DOUBLE_EQ(w.z(2), (2 - mean) / sd);  // below the mean: negative
    w.push(5);
    EXPECT_EQ(w.values(), (std::vector<double>{2, 3, 4, 5}));
    w.restore({1, 2, 3, 4, 5, 6});  // a larger window's checkpoint: the newest four
    EXPECT_EQ(w.values(), (std::vector<double>{3, 4, 5, 6}));
    w.restore({7, 7, 7, 7});
    EXPECT_TRUE(std::isnan(w.z(8)));  // no spread: no outlier
}

// A loss spike and a gradient-norm spike (100x) are skipped, with their values and z in the log, only
// where skip_loss_z / skip_grad_z ask for it; they do not count towards max_bad_steps, and the
// windows take them, so the steps after a spike are not outliers.
TEST_F(Guards, OutliersAreSkippedOnlyWhenAsked) {
    cfg.steps = 24;
    cfg.outlier_window = 8;
    cfg.max_bad_steps = 1;
    const std::set<int> loss_spike{12}, norm_spike{22};
    ASSERT_EQ(run_train(cfg, options({}, {}, loss_spike, norm_spike)), 0);  // off by default
    EXPECT_EQ(updates, 24);

    updates = 0;
    cfg.skip_loss_z = 10;
    cfg.skip_grad_z = 10;
    ASSERT_EQ(run_train(cfg, options({}, {}, loss_spike, norm_spike)), 0);
    EXPECT_EQ(updates, 22);
    std::map<int, nlohmann::json> skipped;
    for (const auto& j : metrics())
        if (j.contains("skipped")) skipped[j["step"].get<int>()] = j;
    ASSERT_EQ(skipped.size(), 2u);
    EXPECT_EQ(skipped[12]["skipped"], "loss outlier");
    EXPECT_EQ(skipped[22]["skipped"], "grad norm outlier");
    for (int step : {12, 22}) {
        EXPECT_GT(skipped[step]["z"].get<double>(), 10);
        EXPECT_TRUE(skipped[step].contains("loss") && skipped[step].contains("grad_norm"));
    }
}

// Not a guard, but the same small run: the output modes of the step loop.
TEST_F(Guards, LiveLineLogLinesAndQuiet) {
    auto output = [&](bool live, bool quiet) {
        TrainOptions opt = options({4}, {});
        opt.live = live;
        opt.quiet = quiet;
        testing::internal::CaptureStdout();
        run_train(cfg, opt);
        std::fflush(stdout);
        return testing::internal::GetCapturedStdout();
    };
    const std::string live = output(true, false);
    EXPECT_TRUE(test::mentions(live, "\rstep 10/10 | loss "));
    EXPECT_TRUE(test::mentions(live, " | ETA 0s\033[K"));
    EXPECT_TRUE(test::mentions(live, "\r\033[Kstep     4/10 | skipped: non-finite loss"));  // cleared first
    EXPECT_TRUE(test::mentions(live, "\r\033[Kstep    10/10 | val loss"));
    EXPECT_EQ(live.find("step     3/10 | loss"), std::string::npos);

    const std::string log = output(false, false);
    EXPECT_EQ(log.find('\r'), std::string::npos);
    EXPECT_TRUE(test::mentions(log, "step     3/10 | loss "));
    EXPECT_TRUE(test::mentions(log, "step     4/10 | skipped"));

    const std::string quiet = output(true, true);
    EXPECT_EQ(quiet.find('\r'), std::string::npos);
    EXPECT_EQ(quiet.find("| loss "), std::string::npos);
    EXPECT_EQ(quiet.find("codagpt train:"), std::string::npos);
    EXPECT_TRUE(test::mentions(quiet, "step    10/10 | val loss"));
    EXPECT_TRUE(test::mentions(quiet, "done: 9 steps"));
    EXPECT_TRUE(test::mentions(quiet, "step     4/10 | skipped"));  // warnings stay
}
