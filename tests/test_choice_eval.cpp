// Multiple-choice scoring (HellaSwag, choice_eval.hpp): the rows it builds and the losses it adds up,
// through a backend whose per-position loss is known; the HellaSwag reader; and a trained model
// that picks the continuation it learned.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend.hpp"
#include "checkpoint.hpp"
#include "choice_eval.hpp"
#include "interchange.hpp"
#include "rng.hpp"
#include "sample.hpp"
#include "test_util.hpp"
#include "train.hpp"
#include "train_fixture.hpp"

namespace fs = std::filesystem;
using namespace codagpt;
using codagpt::test::error_of;
using codagpt::test::mentions;

namespace {

// The loss at each position is its target token id, and each row's inputs are checked to be its
// targets one position earlier up to its padding (a row is one sequence): so a score is the sum of
// the ids it counts.
struct TargetIdLosses final : TrainBackend {
    int B, T, calls = 0;
    std::vector<std::vector<int>> rows;  // every row's inputs, in order
    TargetIdLosses(int b, int t) : B(b), T(t) {}
    std::vector<float> evaluate_tokens(const int* in, const int* tgt) override {
        calls++;
        std::vector<float> out((size_t)B * T);
        for (int r = 0; r < B; r++) rows.emplace_back(in + r * T, in + (r + 1) * T);
        for (int r = 0; r < B; r++)
            for (int t = 0; t < T; t++) {
                const bool padding = in[r * T + t] == 0 && tgt[r * T + t] == 0;  // the items' ids are >= 1
                if (t > 0 && !padding) {
                    EXPECT_EQ(in[r * T + t], tgt[r * T + t - 1]) << "row " << r << " position " << t;
                }
                out[r * T + t] = float(tgt[r * T + t]);
            }
        return out;
    }
    std::string describe() const override { return "target ids"; }
    size_t num_params() const override { return 0; }
    void zero_grad() override {}
    double forward_backward(const int*, const int*, float) override { return 0; }
    double evaluate(const int*, const int*) override { return 0; }
    double grad_norm() override { return 0; }
    std::vector<float> gradients() const override { return {}; }
    void apply_update(double, double, const TrainConfig&) override {}
    TrainState save_state() const override { return {}; }
    void load_state(const TrainState&) override {}
    void load_params(const std::vector<float>&) override {}
    std::unique_ptr<Decoder> make_decoder() const override { return nullptr; }
};

}  // namespace

// Context tokens are 60 and more, so counting one of them, or missing an ending token, changes every
// score.
TEST(ChoiceScoring, CountsExactlyTheEndingTokensSummedAndMeaned) {
    std::vector<int> long_context;
    for (int k = 0; k < 20; k++) long_context.push_back(60 + k);
    std::vector<ChoiceItem> items = {
        // sums 6, 5, 12: acc picks ending 1; means 3, 5, 4: acc_norm picks ending 0 (the label)
        {{90, 91, 92}, {{2, 4}, {5}, {3, 4, 5}}, 0},
        // sums 7, 7 tie: the lower index (ending 0, not the label); means 7, 3.5: ending 1 (the label)
        {{93}, {{7}, {3, 4}}, 1},
        // a context of 20 tokens, too long for T = 8 with a 3-token ending: cut to its last 6
        {long_context, {{1, 1, 1}, {9, 9, 9}}, 0},
    };
    for (int B : {1, 3, 8}) {  // rows spread over micro-batches, or all in one with padding rows
        SCOPED_TRACE(B);
        TargetIdLosses model(B, 8);
        const ChoiceScore s = score_choices(model, B, 8, 100, items);
        EXPECT_EQ(s.items, 3u);
        EXPECT_EQ(s.correct_sum, 1u);   // item 3 only
        EXPECT_EQ(s.correct_mean, 3u);  // all three
        EXPECT_EQ(s.cut, 1u);
        EXPECT_EQ(model.calls, (7 + B - 1) / B);  // 7 endings, B rows a call
        ASSERT_GE(model.rows.size(), 7u);
        EXPECT_EQ(model.rows[0], (std::vector<int>{90, 91, 92, 2, 0, 0, 0, 0}));  // the last token is a target only
        EXPECT_EQ(model.rows[5], (std::vector<int>{74, 75, 76, 77, 78, 79, 1, 1}));  // the context's last 6
    }
}

TEST(ChoiceScoring, RefusesWhatCannotBeScored) {
    TargetIdLosses model(4, 8);
    auto refusal = [&](const ChoiceItem& item) { return error_of([&] { score_choices(model, 4, 8, 100, {item}); }); };
    EXPECT_TRUE(mentions(refusal({{}, {{1}}, 0}), "item 1: empty context"));
    EXPECT_TRUE(mentions(refusal({{1}, {{1}, {}}, 0}), "item 1: ending 2 is empty"));
    EXPECT_TRUE(mentions(refusal({{1}, {}, 0}), "item 1: label 0 is not the index of one of its 0 endings"));
    EXPECT_TRUE(mentions(refusal({{1}, {{1}, {2}}, 2}), "label 2 is not the index"));
    EXPECT_TRUE(mentions(refusal({{1}, {std::vector<int>(9, 1)}, 0}), "ending 1 of 9 tokens does not fit seq_len 8"));
    EXPECT_TRUE(mentions(refusal({{1}, {{100}}, 0}), "token id 100 outside the vocabulary of 100"));
    EXPECT_NO_THROW(score_choices(model, 4, 8, 100, {{{1}, {std::vector<int>(8, 1)}, 0}}));  // T = 8 fits
}

TEST(HellaSwag, ReadsContextsAndSpacedEndings) {
    test::TempDir dir;
    const nlohmann::json a = {{"ind", 24}, {"ctx", "A man"}, {"endings", {"sits.", "runs."}}, {"label", 1}};
    const nlohmann::json b = {{"ctx", "It"}, {"endings", {"x", "y", "z"}}, {"label", 2}};
    const std::string path = dir.write("hs.jsonl", a.dump() + "\n\n" + b.dump() + "\n" + a.dump() + "\n");
    // Bytes as token ids: the reader's strings are visible in its items.
    auto bytes = [](const std::string& s) { return std::vector<int>(s.begin(), s.end()); };
    const std::vector<ChoiceItem> items = read_hellaswag(path, bytes);
    ASSERT_EQ(items.size(), 3u);  // the blank line skipped
    EXPECT_EQ(items[0].context, bytes("A man"));
    EXPECT_EQ(items[0].endings, (std::vector<std::vector<int>>{bytes(" sits."), bytes(" runs.")}));
    EXPECT_EQ(items[0].label, 1);
    EXPECT_EQ(items[1].endings.size(), 3u);
    EXPECT_EQ(items[1].label, 2);
    EXPECT_EQ(read_hellaswag(path, bytes, 2).size(), 2u);

    auto refusal = [&](const std::string& text) {
        return error_of([&] { read_hellaswag(dir.write("bad.jsonl", text), bytes); });
    };
    EXPECT_TRUE(mentions(refusal(a.dump() + "\n{\"ctx\": 1}\n"), "bad.jsonl line 2: no \"ctx\" string"));
    EXPECT_TRUE(mentions(refusal("{not json\n"), "line 1: not a JSON object"));
    EXPECT_TRUE(mentions(refusal(R"({"ctx": "a", "endings": ["b", "c"], "label": 2})"), "\"label\" is not the index"));
    EXPECT_TRUE(mentions(refusal(R"({"ctx": "a", "endings": ["b", 3], "label": 0})"), "an ending is not a string"));
    EXPECT_TRUE(mentions(refusal(R"({"ctx": "a", "endings": [], "label": 0})"), "no \"endings\" array"));
    EXPECT_TRUE(mentions(refusal("\n"), "holds no items"));
    EXPECT_TRUE(mentions(error_of([&] { read_hellaswag(dir / "none.jsonl", bytes); }), "cannot open"));
}

namespace {

// Items whose right ending continues the training shards' pattern (i * 7) % 61 after 8 of its
// tokens, the 3 others 4 random tokens below 128.
std::vector<ChoiceItem> pattern_items(size_t n) {
    Rng rng(5);
    auto pattern = [](long i) { return int(i * 7 % 61); };
    std::vector<ChoiceItem> items(n);
    for (ChoiceItem& item : items) {
        const long at = (long)rng.below(1000);
        for (long k = 0; k < 8; k++) item.context.push_back(pattern(at + k));
        item.label = (int)rng.below(4);
        for (int e = 0; e < 4; e++) {
            std::vector<int> ending;
            for (long k = 0; k < 4; k++) ending.push_back(e == item.label ? pattern(at + 8 + k) : (int)rng.below(128));
            item.endings.push_back(ending);
        }
    }
    return items;
}

// The pattern run of 100 steps: a 1-layer model on the pattern shards.
struct PatternRun {
    test::SyntheticRun synth{"choice", ModelConfig{1, 2, 32, 16, 256}, 4, 16, 20000, 4000};
    TrainConfig& cfg = synth.cfg;
    PatternRun() {
        cfg.steps = 100;
        cfg.warmup_steps = 3;
        cfg.lr = 1e-2;
        cfg.eval_every = 0;
    }
    static TrainOptions options() {
        TrainOptions opt;
        opt.device = "cpu";
        opt.quiet = true;
        return opt;
    }
};

}  // namespace

// A model trained on the pattern picks the pattern's continuation among random endings; with the
// labels moved to a wrong ending it is almost never right.
TEST(ChoiceScoring, ATrainedModelPicksTheContinuationItLearned) {
    PatternRun run;
    TrainConfig& cfg = run.cfg;
    test::SyntheticRun& synth = run.synth;
    cfg.ckpt_every = 100;
    ASSERT_EQ(run_train(cfg, PatternRun::options()), 0);

    std::vector<ChoiceItem> items = pattern_items(40);
    auto model = make_cpu_backend(cfg);
    const std::string ckpt = checkpoint_path(cfg.out_dir, 100);
    model->load_params(load_weights(ckpt).params);
    const ChoiceScore right = score_choices(*model, cfg.batch_size, cfg.seq_len, 256, items);
    EXPECT_GE(right.correct_mean, 36u);
    EXPECT_GE(right.correct_sum, 36u);
    for (ChoiceItem& item : items) item.label = (item.label + 1) % 4;
    const ChoiceScore wrong = score_choices(*model, cfg.batch_size, cfg.seq_len, 256, items);
    EXPECT_LE(wrong.correct_mean, 4u);

    // `codagpt eval` with hellaswag_data: the file read with the encoder given and scored by the checkpoint's
    // model and shape: the scores of those items scored here.
    auto encode = [](const std::string& s) { return std::vector<int>(s.begin(), s.end()); };
    std::string text;
    for (const char* ending : {"xyz", "uvw", "abc"})
        text += nlohmann::json{{"ctx", "abcdefgh"}, {"endings", {"ijk", ending, "ijkl"}}, {"label", 1}}.dump() + "\n";
    EvalOptions e;
    e.weights = ckpt;
    e.device = "cpu";
    const std::string path = synth.dir.write("hs.jsonl", text);
    e.overrides = {"hellaswag_data=" + path};
    EXPECT_TRUE(mentions(error_of([&] { run_eval(e); }), "hellaswag_data: this build has no tokenizer"));
    e.sample_text = [&] { return SampleText{encode, nullptr}; };
    const EvalResult r = run_eval(e);
    ASSERT_TRUE(r.hellaswag.has_value());
    const ChoiceScore direct =
        score_choices(*model, cfg.batch_size, cfg.seq_len, 256, read_hellaswag(path, encode));
    EXPECT_EQ(r.hellaswag->items, 3u);
    EXPECT_EQ(r.hellaswag->correct_mean, direct.correct_mean);
    EXPECT_EQ(r.hellaswag->correct_sum, direct.correct_sum);
    // Items that cannot be scored are refused before anything runs.
    e.overrides = {"hellaswag_data=" + synth.dir.write("long.jsonl", nlohmann::json{{"ctx", "a"},
                                                                                    {"endings", {std::string(17, 'b')}},
                                                                                    {"label", 0}}.dump())};
    EXPECT_TRUE(mentions(error_of([&] { run_eval(e); }), "ending 1 of 18 tokens does not fit seq_len 16"));
}

// hellaswag_data: the items scored at every evaluation of a training run, into its metrics lines,
// changing no loss of the run. The pattern items as text whose bytes are the ids (the encoder drops
// the space read_hellaswag puts before an ending).
TEST(ChoiceScoring, TrainingScoresHellaSwagAtEachEvaluation) {
    PatternRun run;
    TrainConfig& cfg = run.cfg;
    cfg.eval_every = 50;
    std::string text;
    auto chars = [](const std::vector<int>& ids) { return std::string(ids.begin(), ids.end()); };
    for (const ChoiceItem& item : pattern_items(40)) {
        nlohmann::json endings = nlohmann::json::array();
        for (const auto& e : item.endings) endings.push_back(chars(e));
        text += nlohmann::json{{"ctx", chars(item.context)}, {"endings", endings}, {"label", item.label}}.dump() + "\n";
    }
    cfg.hellaswag_data = run.synth.dir.write("hs.jsonl", text);
    TrainOptions opt = PatternRun::options();
    EXPECT_TRUE(mentions(error_of([&] { run_train(cfg, opt); }), "hellaswag_data: this build has no tokenizer"));
    opt.sample_text = [] {
        return SampleText{[](const std::string& s) {
                              const size_t from = !s.empty() && s[0] == ' ' ? 1 : 0;
                              return std::vector<int>(s.begin() + from, s.end());
                          },
                          nullptr};
    };
    auto losses_and_acc = [&](std::vector<double>& losses, std::vector<double>& acc_norm) {
        ASSERT_EQ(run_train(cfg, opt), 0);
        std::ifstream f(fs::path(cfg.out_dir) / "metrics.jsonl");
        for (std::string line; std::getline(f, line);) {
            const nlohmann::json j = nlohmann::json::parse(line);
            if (j.contains("loss")) losses.push_back(j["loss"].get<double>());
            if (j.contains("val_loss") && !cfg.hellaswag_data.empty()) {
                ASSERT_TRUE(j.contains("hellaswag_acc_norm") && j.contains("hellaswag_acc")) << line;
                acc_norm.push_back(j["hellaswag_acc_norm"].get<double>());
            }
        }
    };
    cfg.ckpt_every = 100;
    std::vector<double> losses, acc_norm, plain_losses, none;
    losses_and_acc(losses, acc_norm);
    ASSERT_EQ(acc_norm.size(), 3u);  // steps 0, 50, 100
    EXPECT_GE(acc_norm.back(), 0.9);
    EXPECT_LT(acc_norm.front(), acc_norm.back());
    // `codagpt eval` of the last checkpoint scores the run's items as its last evaluation did.
    EvalOptions e;
    e.weights = checkpoint_path(cfg.out_dir, 100);
    e.device = "cpu";
    e.sample_text = opt.sample_text;
    const EvalResult r = run_eval(e);
    ASSERT_TRUE(r.hellaswag.has_value());
    EXPECT_EQ(double(r.hellaswag->correct_mean) / r.hellaswag->items, acc_norm.back());
    cfg.hellaswag_data.clear();
    cfg.out_dir += "_plain";
    losses_and_acc(plain_losses, none);
    ASSERT_EQ(losses.size(), 100u);
    EXPECT_EQ(losses, plain_losses);
}
