// The training program end to end on the CPU reference: a tiny model on synthetic shards.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <utility>
#include <nlohmann/json.hpp>

#include "backend.hpp"
#include "checkpoint.hpp"
#include "config.hpp"
#include "data.hpp"
#include "device.hpp"
#include "gpt2_params.hpp"
#include "interchange.hpp"
#include "rng.hpp"
#include "step_phases.hpp"
#include "train.hpp"
#include "train_fixture.hpp"

namespace fs = std::filesystem;
using namespace codagpt;
using codagpt::test::error_of;
using codagpt::test::mentions;
using codagpt::test::SyntheticRun;

namespace {

struct TrainRun : ::testing::Test {
    SyntheticRun synth{"test-tiny", ModelConfig{/*n_layer=*/1, /*n_head=*/2, /*n_embd=*/32, /*max_seq_len=*/16, /*vocab_size=*/256}, 4, 16, 20000, 4000};
    fs::path dir = synth.dir.path;
    TrainConfig& cfg = synth.cfg;
    void SetUp() override {
        cfg.steps = 100;
        cfg.warmup_steps = 3;
        cfg.lr = 1e-2;
        cfg.eval_every = 25;
        cfg.eval_batches = 2;
    }

    std::vector<nlohmann::json> run(const std::string& out, TrainOptions opt = {}) {
        cfg.out_dir = (dir / out).string();
        opt.device = "cpu";
        opt.quiet = true;
        EXPECT_EQ(run_train(cfg, opt), 0);
        std::vector<nlohmann::json> lines;
        std::ifstream f(fs::path(cfg.out_dir) / "metrics.jsonl");
        for (std::string line; std::getline(f, line);) lines.push_back(nlohmann::json::parse(line));
        return lines;
    }
    // Run "base": 5 steps, evaluated and checkpointed after the last. Returns that evaluation's
    // loss; the checkpoint is checkpoint_path(cfg.out_dir, 5).
    double base_run_with_checkpoint() {
        cfg.steps = 5;
        cfg.eval_every = 5;
        cfg.ckpt_every = 5;
        const auto lines = run("base");
        std::vector<double> val;
        for (const auto& j : lines)
            if (j.contains("val_loss")) val.push_back(j["val_loss"].get<double>());
        return val.back();
    }
};

std::vector<double> field(const std::vector<nlohmann::json>& lines, const char* key) {
    std::vector<double> out;
    for (const auto& j : lines)
        if (j.contains(key)) out.push_back(j[key].get<double>());
    return out;
}

}  // namespace

TEST_F(TrainRun, WritesMetricsAndConfigAndLossFalls) {
    const auto lines = run("a");
    const auto loss = field(lines, "loss");
    const auto val = field(lines, "val_loss");
    ASSERT_EQ(loss.size(), 100u);
    ASSERT_EQ(val.size(), 5u);  // steps 0, 25, 50, 75 and after the last
    for (const char* key : {"lr", "grad_norm", "ms", "tok_s"}) EXPECT_EQ(field(lines, key).size(), 100u) << key;
    EXPECT_LT(val.back(), 0.5 * val.front());
    EXPECT_LT(loss.back(), 0.5 * loss.front());
    // The run directory holds the resolved config, which loads back to the same config.
    const TrainConfig back = load_config((fs::path(cfg.out_dir) / "config.json").string());
    EXPECT_EQ(config_to_json(back), config_to_json(cfg));
}

TEST_F(TrainRun, SameSeedIsBitIdenticalOtherSeedDiffers) {
    cfg.steps = 8;
    const auto a = field(run("a"), "loss");
    const auto b = field(run("b"), "loss");
    cfg.seed += 1;
    const auto c = field(run("c"), "loss");
    ASSERT_EQ(a.size(), 8u);
    EXPECT_EQ(a, b);  // exact: doubles round-trip through the JSON text
    EXPECT_NE(a, c);
}

TEST_F(TrainRun, BadDataIsAnErrorNamingIt) {
    cfg.train_data = (dir / "nothing_*.bin").string();
    TrainOptions opt;
    opt.device = "cpu";
    cfg.out_dir = (dir / "x").string();
    try {
        run_train(cfg, opt);
        FAIL() << "expected an error";
    } catch (const std::exception& e) {
        EXPECT_NE(std::string(e.what()).find("nothing_"), std::string::npos) << e.what();
    }
}

namespace {

std::vector<nlohmann::json> samples_of(const std::vector<nlohmann::json>& lines) {
    std::vector<nlohmann::json> out;
    for (const auto& j : lines)
        if (j.contains("sample")) out.push_back(j);
    return out;
}

// Text as one token per byte, so that the text path runs without the GPT-2 tokenizer (main's
// codec); ids come back as printable ASCII, one character each.
SampleText byte_text() {
    return {[](const std::string& text) { return std::vector<int>(text.begin(), text.end()); },
            [](const std::vector<int>& ids) {
                std::string s;
                for (int t : ids) s += char(' ' + t % 95);
                return s;
            }};
}

}  // namespace

// Samples at steps 0, 3, 6 and after the last, identical for the same seed, different as the
// weights change, and the losses bit-identical to those of the run without samples: the sampler
// has its own generator and buffers and only reads the weights.
TEST_F(TrainRun, SamplesLeaveLossesUnchanged) {
    cfg.steps = 8;
    cfg.eval_every = 4;
    cfg.sample_tokens = 10;
    const auto plain = run("plain");
    cfg.sample_every = 3;
    const auto a = run("a");
    const auto b = run("b");
    EXPECT_TRUE(samples_of(plain).empty());
    EXPECT_EQ(field(a, "loss"), field(plain, "loss"));
    EXPECT_EQ(field(a, "val_loss"), field(plain, "val_loss"));
    ASSERT_EQ(field(a, "loss").size(), 8u);
    const auto sa = samples_of(a);
    ASSERT_EQ(sa.size(), 4u);
    const std::vector<int> steps = {0, 3, 6, 8};
    for (size_t i = 0; i < sa.size(); i++) {
        EXPECT_EQ(sa[i]["step"].get<int>(), steps[i]);
        const auto tokens = sa[i]["sample_tokens"].get<std::vector<int>>();
        ASSERT_EQ(tokens.size(), 10u);
        // Without a tokenizer the text is the ids.
        std::string ids;
        for (int t : tokens) {
            EXPECT_TRUE(t >= 0 && t < cfg.model.vocab_size) << t;
            ids += (ids.empty() ? "" : " ") + std::to_string(t);
        }
        EXPECT_EQ(sa[i]["sample"].get<std::string>(), ids);
    }
    EXPECT_EQ(samples_of(b), sa);
    EXPECT_NE(sa.front()["sample_tokens"], sa.back()["sample_tokens"]);
}

// Samples survive an interruption: resumed from a checkpoint at step 4 of a run that went on to
// log samples at steps 4 and 6 (as a crash after the checkpoint leaves it), the log holds each
// sample of the uninterrupted run once.
TEST_F(TrainRun, ResumedRunLogsTheSameSamples) {
    cfg.steps = 6;
    cfg.sample_every = 2;
    cfg.sample_tokens = 5;
    cfg.ckpt_every = 2;
    const auto whole = samples_of(run("run"));
    ASSERT_EQ(whole.size(), 4u);
    TrainOptions resume;
    resume.resume = checkpoint_path(cfg.out_dir, 4);
    EXPECT_EQ(samples_of(run("run", resume)), whole);
}

// With a text codec (main passes the GPT-2 tokenizer's) the samples continue sample_prompt and are
// logged as text; the codec is loaded once, at start-up.
TEST_F(TrainRun, SamplesContinueThePromptAsText) {
    cfg.steps = 2;
    cfg.sample_every = 2;
    cfg.sample_tokens = 6;
    int loads = 0;
    TrainOptions opt;
    opt.sample_text = [&] {
        loads++;
        return byte_text();
    };
    auto first_sample = [&](const std::string& prompt, const std::string& out) {
        cfg.sample_prompt = prompt;
        const auto s = samples_of(run(out, opt));
        EXPECT_EQ(s.size(), 2u);  // steps 0 and 2
        const auto tokens = s.at(0)["sample_tokens"].get<std::vector<int>>();
        EXPECT_EQ(s.at(0)["sample"].get<std::string>(), byte_text().decode(tokens));
        return tokens;
    };
    const auto ab = first_sample("ab", "ab");
    EXPECT_EQ(loads, 1);
    // The prompt is what the model continues: another prompt, another sample from the same draws.
    EXPECT_NE(first_sample("zq", "zq"), ab);
    // A sample may end inside a UTF-8 character: the log line stays valid JSON, with U+FFFD.
    opt.sample_text = [] { return SampleText{byte_text().encode, [](const std::vector<int>&) { return std::string("a\xC3"); }}; };
    const auto s = samples_of(run("utf8", opt));
    ASSERT_EQ(s.size(), 2u);
    EXPECT_EQ(s[0]["sample"].get<std::string>(), "a\xEF\xBF\xBD");
}

// Bad sample settings fail at start-up with a message naming the key, before anything is written.
TEST_F(TrainRun, BadSampleSettingsAreRefusedUpFront) {
    cfg.sample_every = 2;
    cfg.out_dir = (dir / "never").string();
    TrainOptions opt;
    opt.device = "cpu";
    cfg.sample_prompt = "ab";
    EXPECT_TRUE(mentions(error_of([&] { run_train(cfg, opt); }), "sample_prompt: this build has no tokenizer"));
    opt.sample_text = byte_text;
    cfg.sample_prompt = std::string(17, 'a');  // max_seq_len is 16
    EXPECT_TRUE(mentions(error_of([&] { run_train(cfg, opt); }), "sample_prompt: 17 tokens, more than max_seq_len"));
    cfg.sample_prompt = "a";  // through a codec whose ids do not fit the model's vocabulary of 256
    opt.sample_text = [] { return SampleText{[](const std::string&) { return std::vector<int>{300}; }, nullptr}; };
    EXPECT_TRUE(mentions(error_of([&] { run_train(cfg, opt); }), "token id 300 outside the vocabulary"));
    cfg.sample_tokens = 0;
    EXPECT_TRUE(mentions(error_of([&] { run_train(cfg, opt); }), "sample_tokens: must be >= 1"));
    EXPECT_FALSE(fs::exists(cfg.out_dir));
}

// --init-from starts a run from another run's weights, read from its checkpoint, a safetensors
// export or an llm.c export: the step-0 evaluation sees exactly those weights, the run counts its
// steps from 0 and its optimizer from scratch (AdamW's update count in its checkpoints starts anew).
TEST_F(TrainRun, InitFromStartsFromOtherWeightsAtStepZero) {
    const double base_val = base_run_with_checkpoint();
    const std::string ckpt = checkpoint_path(cfg.out_dir, 5);
    const ModelWeights w = load_weights(ckpt);
    export_safetensors((dir / "w.safetensors").string(), w.config, w.params.data());
    export_llmc((dir / "w.bin").string(), w.config, w.params.data());

    cfg.steps = 2;
    cfg.ckpt_every = 2;
    std::vector<double> first_losses;
    for (const std::string& path : {ckpt, (dir / "w.safetensors").string(), (dir / "w.bin").string()}) {
        SCOPED_TRACE(path);
        TrainOptions opt;
        opt.init_from = path;
        const auto lines = run("ft_" + fs::path(path).filename().string(), opt);
        EXPECT_EQ(field(lines, "val_loss").front(), base_val);
        const auto losses = field(lines, "loss");
        ASSERT_EQ(losses.size(), 2u);
        EXPECT_EQ(lines.at(1)["step"].get<int>(), 1);  // after the step-0 evaluation
        if (first_losses.empty()) first_losses = losses;
        EXPECT_EQ(losses, first_losses);  // the same weights from every format
        const Checkpoint ck = load_checkpoint(checkpoint_path(cfg.out_dir, 2));
        EXPECT_EQ(ck.step, 2);
        EXPECT_EQ(ck.state.t, 2);  // not 5 + 2: a fresh optimizer
    }
}

TEST_F(TrainRun, InitFromRefusesAnotherShapeJunkAndResume) {
    ModelConfig wide = cfg.model;
    wide.n_embd = 64;
    const std::string wide_path = (dir / "wide.safetensors").string();
    export_safetensors(wide_path, wide, gpt2_init_params(wide, 1).data());
    cfg.out_dir = (dir / "never").string();
    TrainOptions opt;
    opt.device = "cpu";
    opt.init_from = wide_path;
    const std::string msg = error_of([&] { run_train(cfg, opt); });
    EXPECT_TRUE(mentions(msg, "--init-from " + wide_path));
    EXPECT_TRUE(mentions(msg, "n_embd 64 (config 32)"));
    EXPECT_FALSE(mentions(msg, "n_layer"));  // only what differs

    opt.init_from = synth.dir.write("junk.bin", "not a model");
    EXPECT_TRUE(mentions(error_of([&] { run_train(cfg, opt); }), "junk.bin"));
    opt.resume = "latest";
    EXPECT_TRUE(mentions(error_of([&] { run_train(cfg, opt); }), "--init-from and --resume exclude each other"));
    EXPECT_FALSE(fs::exists(cfg.out_dir));
}

// `codagpt eval`: a checkpoint's validation loss is the one its run logged at that step (the run's
// own config by default: its data, B, T and eval_batches), from every weights format; --all reads
// every window; model keys that contradict the weights are refused.
TEST_F(TrainRun, EvalOfACheckpointIsTheRunsValidationLoss) {
    const double logged = base_run_with_checkpoint();
    const std::string ckpt = checkpoint_path(cfg.out_dir, 5);
    EvalOptions e;
    e.weights = ckpt;
    e.device = "cpu";
    const EvalResult r = run_eval(e);
    EXPECT_EQ(r.val_loss, logged);
    EXPECT_EQ(r.batches, cfg.eval_batches);
    EXPECT_EQ(r.config.val_data, cfg.val_data);

    // Other formats carry no run config: the run's config.json gives the same data, B and T.
    const ModelWeights w = load_weights(ckpt);
    e.weights = (dir / "w.safetensors").string();
    export_safetensors(e.weights, w.config, w.params.data());
    e.config = (fs::path(cfg.out_dir) / "config.json").string();
    EXPECT_EQ(run_eval(e).val_loss, logged);

    // --all: every window, from the first; the first eval_batches of them are the logged mean's.
    e.all = true;
    const EvalResult all = run_eval(e);
    const size_t windows = (4000 - 1) / (cfg.batch_size * cfg.seq_len);
    EXPECT_EQ(all.batches, (int)windows);
    EXPECT_NE(all.val_loss, logged);
    e.all = false;
    e.overrides = {"eval_batches=1", "batch_size=2"};
    const EvalResult small = run_eval(e);
    EXPECT_EQ(small.batches, 1);
    EXPECT_EQ(small.config.batch_size, 2);
    EXPECT_NE(small.val_loss, logged);

    e.overrides = {"n_embd=64"};
    const std::string msg = error_of([&] { run_eval(e); });
    EXPECT_TRUE(mentions(msg, "n_embd 32 (config 64)")) << msg;
    // A bad key names itself and the weights evaluated.
    e.overrides = {"eval_batches=0"};
    const std::string bad = error_of([&] { run_eval(e); });
    EXPECT_TRUE(mentions(bad, "eval_batches: must be >= 1") && mentions(bad, "evaluating " + e.weights)) << bad;
    e.overrides = {};
    e.weights = synth.dir.write("junk.bin", "not a model");
    EXPECT_TRUE(mentions(error_of([&] { run_eval(e); }), "junk.bin"));
}

// --phase-times: the arithmetic of a step's phases from its event times, and the medians reported.
TEST(StepPhases, ExposedReductionIsWhatEndsAfterBackward) {
    // Three buckets reduced while backward runs until 10 ms; the last one ends at 12.5 ms.
    StepMarks m{/*backward_end=*/10, /*optimizer_begin=*/12.5, /*optimizer_end=*/15, {{4, 5}, {6, 8}, {10, 12.5}}};
    StepPhases p = step_phases(m);
    EXPECT_EQ(p.fwd_bwd, 10);
    EXPECT_EQ(p.reduce, 8.5);             // 4 -> 12.5
    EXPECT_EQ(p.reduce_busy, 1 + 2 + 2.5);
    EXPECT_EQ(p.exposed_reduce, 2.5);     // 12.5 - 10
    EXPECT_EQ(p.optimizer, 2.5);
    // Reductions all done before backward ends (in any order): nothing exposed.
    m.reductions = {{7, 9.5}, {2, 3}};
    p = step_phases(m);
    EXPECT_EQ(p.reduce, 7.5);
    EXPECT_EQ(p.reduce_busy, 3.5);
    EXPECT_EQ(p.exposed_reduce, 0);
    // One process: no reductions.
    m.reductions.clear();
    p = step_phases(m);
    EXPECT_EQ(p.reduce, 0);
    EXPECT_EQ(p.reduce_busy, 0);
    EXPECT_EQ(p.exposed_reduce, 0);
    EXPECT_EQ(p.fwd_bwd, 10);
}

TEST(StepPhases, MediansSkipTheFirstStepsAndReportJsonAndText) {
    std::vector<StepPhases> steps;
    for (double ms : {100.0, 50.0, 3.0, 1.0, 2.0, 4.0}) steps.push_back({ms, ms / 2, ms / 4, ms / 10, ms + 1});
    const StepPhases med = median_phases(steps, 2);  // of 3, 1, 2, 4: the upper median, 3
    EXPECT_EQ(med.fwd_bwd, 3);
    EXPECT_EQ(med.reduce, 1.5);
    EXPECT_EQ(med.reduce_busy, 0.75);
    EXPECT_EQ(med.exposed_reduce, 0.3);
    EXPECT_EQ(med.optimizer, 4);
    EXPECT_EQ(median_phases(steps, 6).fwd_bwd, 0);  // no steady steps: zeros
    EXPECT_EQ(median({5, 1, 3}), 3);

    const nlohmann::json dp = phases_json(med, /*reduced=*/true);
    EXPECT_EQ(dp, (nlohmann::json{{"fwd_bwd", 3.0}, {"reduce", 1.5}, {"reduce_busy", 0.75},
                                  {"exposed_reduce", 0.3}, {"optimizer", 4.0}}));
    EXPECT_EQ(phases_json(med, false), (nlohmann::json{{"fwd_bwd", 3.0}, {"optimizer", 4.0}}));
    EXPECT_EQ(phases_text(med, true),
              "fwd_bwd 3.00 | reduce 1.50 | reduce_busy 0.75 | exposed_reduce 0.30 | optimizer 4.00");
    EXPECT_EQ(phases_text(med, false), "fwd_bwd 3.00 | optimizer 4.00");
}

// StepEnergy against a fake counter and clock: each reading takes 3 s of the fake clock at 100 W
// and returns the counter as it was at the call's start.
namespace {
struct FakeMeter {
    double joules = 0, seconds = 0;
    int reads = 0;
    int fail_read = -1;  // which reading (0-based) fails
    StepEnergy::Clock::time_point now() const {
        return StepEnergy::Clock::time_point(std::chrono::duration_cast<StepEnergy::Clock::duration>(
                std::chrono::duration<double>(seconds)));
    }
    double read() {
        const double j = reads == fail_read ? -1 : joules;
        reads++;
        run(3, 100);
        return j;
    }
    void run(double s, double watts) { seconds += s, joules += s * watts; }
};
}  // namespace

TEST(StepEnergy, BackToBackStepsShareReadingsAndBreaksAreLeftOut) {
    FakeMeter m;
    StepEnergy e([&] { return m.read(); }, [&] { return m.now(); });
    auto step = [&](double seconds, double watts) {
        e.before_step();
        m.run(seconds, watts);
        e.after_step();
    };
    step(10, 700);  // reads before and after
    step(10, 700);  // shares the reading after the first step
    EXPECT_EQ(m.reads, 3);
    m.run(100, 300);  // an evaluation, say: not a step's
    e.interrupt();
    step(20, 500);
    EXPECT_EQ(m.reads, 5);
    ASSERT_EQ(e.steps(), 3u);
    // A step's interval runs from the start of the reading before it to the start of the one
    // after: the step and one reading (3 s at 100 W); the evaluation is in none.
    const StepEnergy::Summary all = e.summary(0);
    EXPECT_DOUBLE_EQ(all.joules_per_step, (7300.0 + 7300.0 + 10300.0) / 3);
    EXPECT_DOUBLE_EQ(all.watts, (7300.0 + 7300.0 + 10300.0) / (13 + 13 + 23));
    const StepEnergy::Summary last = e.summary(2);
    EXPECT_DOUBLE_EQ(last.joules_per_step, 10300.0);
    EXPECT_DOUBLE_EQ(last.watts, 10300.0 / 23);
    EXPECT_TRUE(std::isnan(e.summary(3).joules_per_step));  // no step left
    EXPECT_TRUE(std::isnan(e.summary(3).watts));
}

TEST(StepEnergy, AFailedReadingLeavesItsStepsUnknown) {
    FakeMeter m;
    m.fail_read = 1;  // the reading after the first step, which the second step shares
    StepEnergy e([&] { return m.read(); }, [&] { return m.now(); });
    for (int i = 0; i < 3; i++) {
        e.before_step();
        m.run(10, 700);
        e.after_step();
    }
    EXPECT_TRUE(std::isnan(e.summary(0).joules_per_step));
    EXPECT_TRUE(std::isnan(e.summary(1).watts));
    EXPECT_DOUBLE_EQ(e.summary(2).joules_per_step, 7300.0);
    EXPECT_DOUBLE_EQ(e.summary(2).watts, 7300.0 / 13);
}

// The SM clock samples: the fake driver takes one a second of its clock, at 345 MHz while a
// reading runs (3 s) and at the work's clock otherwise; each reading takes those since the last.
namespace {
struct FakeClockMeter : FakeMeter {
    std::vector<double> pending;
    double read() {
        const double j = FakeMeter::read();  // 3 s idle
        pending.insert(pending.end(), 3, 345.0);
        return j;
    }
    void work(double s, double watts, double mhz) {
        run(s, watts);
        pending.insert(pending.end(), (size_t)s, mhz);
    }
    std::vector<double> samples() { return std::exchange(pending, {}); }
};
}  // namespace

TEST(StepEnergy, ClockSamplesAreTheStepsOwnAndOtherWorksAreDropped) {
    FakeClockMeter m;
    StepEnergy e([&] { return m.read(); }, [&] { return m.now(); }, [&] { return m.samples(); });
    auto step = [&](double seconds, double mhz) {
        e.before_step();
        m.work(seconds, 700, mhz);
        e.after_step();
    };
    m.work(50, 100, 210);  // idle before the run: the first reading's samples, dropped
    step(20, 1500);
    step(20, 1500);
    m.work(100, 300, 1980);  // an evaluation between steps: its samples are no step's
    e.interrupt();
    step(10, 1400);
    ASSERT_EQ(e.steps(), 3u);
    // Each step keeps its own samples and the 3 of the reading after it: 9 at 345, 40 at 1500
    // and 10 at 1400 in all, whose upper median is 1500; any of the 150 at 210 or 1980 left in
    // would move it to one of those.
    const StepEnergy::Summary all = e.summary(0);
    EXPECT_EQ(all.clock_samples, 59u);
    EXPECT_DOUBLE_EQ(all.sm_clock_mhz, 1500.0);
    const StepEnergy::Summary last = e.summary(2);
    EXPECT_EQ(last.clock_samples, 13u);
    EXPECT_DOUBLE_EQ(last.sm_clock_mhz, 1400.0);
    // Without a clock source, or with no sample in the steps: no clock.
    FakeMeter plain;
    StepEnergy no_clock([&] { return plain.read(); }, [&] { return plain.now(); });
    no_clock.before_step();
    plain.run(10, 700);
    no_clock.after_step();
    EXPECT_EQ(no_clock.summary(0).clock_samples, 0u);
    EXPECT_TRUE(std::isnan(no_clock.summary(0).sm_clock_mhz));
}

TEST_F(TrainRun, PhaseTimesNeedAGpu) {
    cfg.out_dir = (dir / "never").string();
    TrainOptions opt;
    opt.device = "cpu";
    opt.phase_times = true;
    EXPECT_TRUE(mentions(error_of([&] { run_train(cfg, opt); }), "--phase-times"));
    EXPECT_FALSE(fs::exists(cfg.out_dir));
}

// --grad-norms: every step line names every tensor, a list over the layers for the layers' ones,
// and the parts add up (in squares) to the step's global gradient norm.
TEST_F(TrainRun, GradNormsSplitTheGlobalNormByTensorAndLayer) {
    cfg.model.n_layer = 2;
    cfg.steps = 3;
    TrainOptions opt;
    opt.grad_norms = true;
    int steps = 0;
    for (const nlohmann::json& line : run("norms", opt)) {
        if (!line.contains("loss")) continue;
        ASSERT_TRUE(line.contains("grad_norms")) << line.dump();
        const nlohmann::json& norms = line["grad_norms"];
        double squares = 0;
        for (const ParamInfo& p : param_layout(cfg.model)) {
            ASSERT_TRUE(norms.contains(p.name)) << p.name;
            const nlohmann::json& n = norms[p.name];
            const bool per_layer = p.name != "wte" && p.name != "wpe" && p.name.rfind("lnf_", 0) != 0;
            ASSERT_EQ(n.is_array(), per_layer) << p.name;
            if (per_layer) {
                ASSERT_EQ(n.size(), 2u) << p.name;
            }
            for (double v : per_layer ? n.get<std::vector<double>>() : std::vector<double>{n.get<double>()}) {
                EXPECT_GE(v, 0.0);
                squares += v * v;
            }
        }
        EXPECT_NEAR(std::sqrt(squares), line["grad_norm"].get<double>(), 1e-5 * line["grad_norm"].get<double>());
        steps++;
    }
    EXPECT_EQ(steps, 3);
}

// --recompute-layers: refused without a --recompute mode or outside [1, n_layer], before anything
// runs; the layers it names share one activation buffer, the others keep one each.
TEST_F(TrainRun, RecomputeLayersAreValidatedAndShareOneSlot) {
    cfg.out_dir = (dir / "never").string();
    TrainOptions opt;
    opt.device = "cpu";
    opt.recompute_layers = 1;
    EXPECT_TRUE(mentions(error_of([&] { run_train(cfg, opt); }), "--recompute-layers needs --recompute"));
    opt.recompute = "mlp";
    opt.recompute_layers = cfg.model.n_layer + 1;
    EXPECT_TRUE(mentions(error_of([&] { run_train(cfg, opt); }), "between 1 and n_layer"));
    EXPECT_FALSE(fs::exists(cfg.out_dir));

    EXPECT_EQ(recomputed_layers(Recompute::none, 3, 12), 0);
    EXPECT_EQ(recomputed_layers(Recompute::mlp, 0, 12), 12);  // 0: every layer
    EXPECT_EQ(recomputed_layers(Recompute::gelu, 5, 12), 5);
    EXPECT_EQ(recomputed_layers(Recompute::mlp, 12, 12), 12);
    const LayerSlots none{0}, first5{5}, all{12};
    EXPECT_EQ(none.count(12), 12u);
    EXPECT_EQ(first5.count(12), 8u);  // one shared by layers 0-4, then 5-11
    EXPECT_EQ(all.count(12), 1u);
    for (int l = 0; l < 12; l++) {
        EXPECT_EQ(none.of(l), (size_t)l);
        EXPECT_EQ(first5.of(l), l < 5 ? 0u : (size_t)(l - 4));
        EXPECT_EQ(all.of(l), 0u);
    }
}
