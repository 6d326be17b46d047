#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common.hpp"
#include "test_util.hpp"
#include "config.hpp"
#include "config_cli.hpp"

using namespace codagpt;
using nlohmann::json;
namespace fs = std::filesystem;
using codagpt::test::error_of;
using codagpt::test::mentions;

namespace {

// The default config as JSON with `patch` merged in.
json defaults_with(const json& patch) {
    json j = config_to_json(TrainConfig{});
    j.update(patch);
    return j;
}

std::string temp_file(const std::string& name, const std::string& text) {
    const fs::path path = fs::temp_directory_path() / ("codagpt_test_config_" + name);
    std::ofstream(path) << text;
    return path.string();
}

}  // namespace

TEST(Config, SchemaKeysAreUniqueAndTyped) {
    std::set<std::string> names;
    for (const auto& k : config_schema()) {
        EXPECT_TRUE(names.insert(k.name).second) << "duplicate key " << k.name;
        EXPECT_STRNE(k.help, "") << k.name;
    }
    auto type_of = [](const std::string& name) {
        for (const auto& k : config_schema())
            if (name == k.name) return std::string(k.type);
        return std::string("missing");
    };
    EXPECT_EQ(type_of("n_layer"), "int");
    EXPECT_EQ(type_of("seed"), "uint64");
    EXPECT_EQ(type_of("lr"), "float");
    EXPECT_EQ(type_of("shuffle"), "bool");
    EXPECT_EQ(type_of("train_data"), "string");
    EXPECT_EQ(type_of("description"), "string");
}

TEST(Config, NumParamsMatchesGpt2) {
    ModelConfig m{12, 12, 768, 1024, 50257};
    EXPECT_EQ(m.padded_vocab(), 50304);
    EXPECT_EQ(m.num_params(), 124475904u);  // what llm.c reports for GPT-2 124M
}

TEST(Config, ShippedConfigsLoadAndValidate) {
    const fs::path dir = fs::path(CODAGPT_SOURCE_DIR) / "configs";
    std::set<std::string> found;
    for (const auto& entry : fs::directory_iterator(dir)) {
        if (entry.path().extension() != ".json") continue;
        const std::string stem = entry.path().stem().string();
        SCOPED_TRACE(stem);
        TrainConfig c;
        ASSERT_NO_THROW(c = load_config(entry.path().string()));
        EXPECT_EQ(c.name, stem);
        EXPECT_EQ(c.out_dir, "runs/" + stem);
        EXPECT_FALSE(c.description.empty());
        EXPECT_EQ(c.seed, 1337u);
        // Files spell out every key, so that a reader sees the whole run in one place.
        EXPECT_EQ(json::parse(std::ifstream(entry.path())).size(), config_schema().size());
        found.insert(stem);
    }
    EXPECT_EQ(found, (std::set<std::string>{"gpt2-tiny", "gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b"}));

    EXPECT_EQ(load_config("gpt2-124m").model.num_params(), 124475904u);
    const size_t p350 = load_config("gpt2-350m").model.num_params();
    EXPECT_GT(p350, 340'000'000u);
    EXPECT_LT(p350, 370'000'000u);
    const size_t p774 = load_config("gpt2-774m").model.num_params();
    EXPECT_GT(p774, 750'000'000u);
    EXPECT_LT(p774, 800'000'000u);
    const size_t p1558 = load_config("gpt2-1.5b").model.num_params();
    EXPECT_GT(p1558, 1'500'000'000u);
    EXPECT_LT(p1558, 1'600'000'000u);
}

TEST(Config, LargeConfigsFollowGpt3Recipe) {
    const std::vector<std::pair<std::string, double>> lrs = {
        {"gpt2-124m", 6e-4}, {"gpt2-350m", 3e-4}, {"gpt2-774m", 2.5e-4}, {"gpt2-1.5b", 2e-4}};
    for (const auto& [name, lr] : lrs) {
        SCOPED_TRACE(name);
        const TrainConfig c = load_config(name);
        EXPECT_EQ(c.lr, lr);
        EXPECT_EQ(c.model.max_seq_len, 1024);
        EXPECT_EQ(c.seq_len, 1024);
        EXPECT_EQ(c.batch_size, 16);
        EXPECT_EQ(c.model.vocab_size, 50257);
        EXPECT_EQ(c.min_lr_frac, 0.1);
        EXPECT_EQ(c.weight_decay, 0.1);
        EXPECT_EQ(c.beta2, 0.95);
        EXPECT_EQ(c.grad_clip, 1.0);
    }
}

TEST(Config, TinyConfigIsTheDefault) {
    json tiny = config_to_json(load_config("gpt2-tiny"));
    json defaults = config_to_json(TrainConfig{});
    tiny.erase("description");
    defaults.erase("description");
    EXPECT_EQ(tiny, defaults);
}

TEST(Config, MissingKeysKeepDefaults) {
    const TrainConfig c = config_from_json(json{{"steps", 7}});
    EXPECT_EQ(c.steps, 7);
    EXPECT_EQ(c.model.n_layer, TrainConfig{}.model.n_layer);
}

// A config without out_dir writes into runs/<name>, not into the default config's folder.
TEST(Config, OutDirDefaultsToTheConfigsName) {
    EXPECT_EQ(config_from_json(json{{"name", "mine"}}).out_dir, "runs/mine");
    EXPECT_EQ(config_from_json(json{{"name", "a/b"}}).out_dir, "runs/a_b");
    EXPECT_EQ(config_from_json(json{{"name", ".."}}).out_dir, "runs/unnamed");
    EXPECT_EQ(config_from_json(json{{"name", "mine"}, {"out_dir", "elsewhere"}}).out_dir, "elsewhere");
}

TEST(Config, UnknownKeyIsNamedWithSuggestion) {
    const std::string msg = error_of([] { config_from_json(defaults_with({{"n_layers", 2}})); });
    EXPECT_NE(msg.find("'n_layers'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("did you mean 'n_layer'"), std::string::npos) << msg;
    const std::string far = error_of([] { config_from_json(defaults_with({{"zzzzzzzz", 2}})); });
    EXPECT_NE(far.find("'zzzzzzzz'"), std::string::npos) << far;
    EXPECT_EQ(far.find("did you mean"), std::string::npos) << far;
}

TEST(Config, WrongTypesAreNamed) {
    EXPECT_EQ(error_of([] { config_from_json(defaults_with({{"n_layer", "2"}})); }),
              "n_layer: expected an integer, got string \"2\"");
    const std::vector<std::pair<std::string, json>> cases = {
        {"n_layer", 2.5},
        {"n_layer", 10'000'000'000LL},
        {"n_embd", true},
        {"seed", -1},
        {"seed", 1.0},
        {"lr", "3e-4"},
        {"lr", nullptr},
        {"shuffle", 1},
        {"train_data", 5},
        {"name", json::array()},
    };
    for (const auto& [key, value] : cases) {
        const std::string msg = error_of([&] { config_from_json(defaults_with({{key, value}})); });
        EXPECT_EQ(msg.rfind(key + ": expected ", 0), 0u) << key << " = " << value.dump() << ": " << msg;
    }
    EXPECT_NE(error_of([] { config_from_json(json::array()); }).find("JSON object"), std::string::npos);
}

TEST(Config, ImpossibleValuesAreNamed) {
    // {key whose message it must be, patch}
    const std::vector<std::pair<std::string, json>> cases = {
        {"n_layer", {{"n_layer", 0}}},
        {"n_head", {{"n_head", 0}}},
        {"n_embd", {{"n_embd", 0}}},
        {"n_head", {{"n_head", 5}}},  // 64 % 5 != 0
        {"max_seq_len", {{"max_seq_len", 0}, {"seq_len", 0}}},
        {"vocab_size", {{"vocab_size", 0}}},
        {"vocab_size", {{"vocab_size", 65537}}},
        {"train_data", {{"train_data", ""}}},
        {"val_data", {{"val_data", ""}}},
        {"out_dir", {{"out_dir", ""}}},
        {"name", {{"name", ""}}},
        {"batch_size", {{"batch_size", 0}}},
        {"seq_len", {{"seq_len", 0}}},
        {"seq_len", {{"seq_len", 65}}},  // > max_seq_len 64
        {"batch_size", {{"batch_size", 65536}}},
        {"batch_size", {{"batch_size", 32768}, {"max_seq_len", 65536}, {"seq_len", 65536}}},  // 2^31 tokens
        {"grad_accum", {{"grad_accum", 0}}},
        {"steps", {{"steps", 0}}},
        {"lr", {{"lr", 0}}},
        {"lr", {{"lr", -1e-3}}},
        {"min_lr_frac", {{"min_lr_frac", -0.1}}},
        {"min_lr_frac", {{"min_lr_frac", 1.1}}},
        {"warmup_steps", {{"warmup_steps", -1}}},
        {"lr_schedule", {{"lr_schedule", "cosine2"}}},
        {"cooldown_frac", {{"cooldown_frac", 0}}},
        {"cooldown_frac", {{"cooldown_frac", 1.5}}},
        {"skip_loss_z", {{"skip_loss_z", -1}}},
        {"outlier_window", {{"outlier_window", 1}}},
        {"outlier_window", {{"outlier_window", (1 << 20) + 1}}},
        {"weight_decay", {{"weight_decay", -0.1}}},
        {"beta1", {{"beta1", 1.0}}},
        {"beta1", {{"beta1", -0.1}}},
        {"beta2", {{"beta2", 1.0}}},
        {"beta2", {{"beta2", -0.1}}},
        {"adam_eps", {{"adam_eps", 0}}},
        {"grad_clip", {{"grad_clip", -1}}},
        {"eval_every", {{"eval_every", -1}}},
        {"eval_batches", {{"eval_batches", 0}}},
        {"log_every", {{"log_every", 0}}},
    };
    for (const auto& [key, patch] : cases) {
        const std::string msg = error_of([&] { config_from_json(defaults_with(patch)); });
        EXPECT_EQ(msg.rfind(key + ": ", 0), 0u) << patch.dump() << ": " << msg;
    }
}

TEST(Config, BoundaryValuesAreAccepted) {
    const json patch = {{"vocab_size", 65536}, {"min_lr_frac", 0},  {"warmup_steps", 0}, {"weight_decay", 0},
                        {"beta1", 0},          {"grad_clip", 0},    {"eval_every", 0},   {"seq_len", 64},
                        {"lr", 1},             {"seed", 18446744073709551615ULL}};
    EXPECT_NO_THROW(config_from_json(defaults_with(patch)));
    EXPECT_NO_THROW(config_from_json(defaults_with({{"min_lr_frac", 1}, {"vocab_size", 1}})));
    EXPECT_NO_THROW(config_from_json(defaults_with({{"batch_size", 32767}, {"max_seq_len", 65536}, {"seq_len", 65536}})));
}

TEST(Config, LoadConfigErrorsNameTheFile) {
    const std::string missing = error_of([] { load_config("no-such-config"); });
    EXPECT_NE(missing.find("configs/no-such-config.json"), std::string::npos) << missing;
    const std::string missing_path = error_of([] { load_config("/nonexistent/x.json"); });
    EXPECT_NE(missing_path.find("/nonexistent/x.json"), std::string::npos) << missing_path;

    const std::string bad_json = temp_file("bad.json", "{\"n_layer\": 2,\n}");
    const std::string msg = error_of([&] { load_config(bad_json); });
    EXPECT_EQ(msg.rfind(bad_json + ": invalid JSON", 0), 0u) << msg;
    EXPECT_NE(msg.find("line 2"), std::string::npos) << msg;  // nlohmann's position

    const std::string bad_value = temp_file("bad_value.json", "{\"n_layer\": -2}");
    const std::string value_msg = error_of([&] { load_config(bad_value); });
    EXPECT_EQ(value_msg.rfind(bad_value + ": n_layer: ", 0), 0u) << value_msg;
    fs::remove(bad_json);
    fs::remove(bad_value);
}

TEST(Config, OverridesOfEachType) {
    TrainConfig c;
    apply_overrides(c, {"n_layer=4", "seed=18446744073709551615", "lr=3e-4", "shuffle=false", "out_dir=runs/x",
                        "description=a=b", "min_lr_frac=0"});
    EXPECT_EQ(c.model.n_layer, 4);
    EXPECT_EQ(c.seed, 18446744073709551615ULL);
    EXPECT_EQ(c.lr, 3e-4);
    EXPECT_FALSE(c.shuffle);
    EXPECT_EQ(c.out_dir, "runs/x");
    EXPECT_EQ(c.description, "a=b");  // only the first '=' separates
    EXPECT_EQ(c.min_lr_frac, 0.0);
    apply_overrides(c, {"shuffle=1", "steps=5", "steps=7"});
    EXPECT_TRUE(c.shuffle);
    EXPECT_EQ(c.steps, 7);  // the last one wins
    apply_overrides(c, {"shuffle=0", "shuffle=true"});
    EXPECT_TRUE(c.shuffle);
}

TEST(Config, OverridesValidateAfterAllAreApplied) {
    TrainConfig c;
    apply_overrides(c, {"seq_len=128", "max_seq_len=128"});  // invalid in between
    EXPECT_EQ(c.seq_len, 128);
}

TEST(Config, BadOverridesAreNamedAndLeaveConfigUnchanged) {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"n_layer=2.5", "n_layer"},   {"n_layer=abc", "n_layer"}, {"n_layer=", "n_layer"},
        {"n_layer=3x", "n_layer"},    {"seed=-1", "seed"},        {"lr=abc", "lr"},
        {"lr=nan", "lr"},             {"shuffle=yes", "shuffle"}, {"n_layers=2", "n_layers"},
        {"n_layer", "n_layer"},       {"n_head=5", "n_head"},     {"lr=0", "lr"},
    };
    for (const auto& [kv, key] : cases) {
        TrainConfig c;
        const std::string msg = error_of([&] { apply_overrides(c, {"steps=3", kv}); });
        EXPECT_NE(msg.find(key), std::string::npos) << kv << ": " << msg;
        EXPECT_EQ(c.steps, TrainConfig{}.steps) << kv;
    }
    EXPECT_NE(error_of([] {
                  TrainConfig c;
                  apply_overrides(c, {"n_layer"});
              }).find("KEY=VALUE"),
              std::string::npos);
}

TEST(Config, JsonRoundTrip) {
    TrainConfig c = load_config("gpt2-124m");
    apply_overrides(c, {"seed=18446744073709551615", "shuffle=false", "lr=1.25e-4", "description=x\ny"});
    const json j = config_to_json(c);
    EXPECT_EQ(j.size(), config_schema().size());
    for (const auto& k : config_schema()) EXPECT_TRUE(j.contains(k.name)) << k.name;
    EXPECT_EQ(config_to_json(config_from_json(j)), j);
    EXPECT_EQ(config_from_json(json::parse(j.dump())).seed, 18446744073709551615ULL);
}

TEST(ConfigCli, OptionsAppendOverridesInCommandLineOrder) {
    CLI::App app;
    std::vector<std::string> overrides;
    add_config_options(app, overrides);
    app.parse("--steps 20 --lr 3e-4 --set steps=30 --n_layer=3 --set shuffle=false --steps 40", false);
    EXPECT_EQ(overrides,
              (std::vector<std::string>{"steps=20", "lr=3e-4", "steps=30", "n_layer=3", "shuffle=false", "steps=40"}));
    TrainConfig c;
    apply_overrides(c, overrides);
    EXPECT_EQ(c.steps, 40);
    EXPECT_EQ(c.lr, 3e-4);
    EXPECT_EQ(c.model.n_layer, 3);
    EXPECT_FALSE(c.shuffle);
}

TEST(ConfigCli, EveryKeyHasADocumentedOption) {
    CLI::App app;
    std::vector<std::string> overrides;
    add_config_options(app, overrides);
    const std::string help = app.help();
    for (const auto& k : config_schema()) {
        std::string type = k.type;
        for (char& ch : type) ch = char(std::toupper(static_cast<unsigned char>(ch)));
        EXPECT_NE(help.find("--" + std::string(k.name) + " " + type + " "), std::string::npos) << k.name;
        EXPECT_NE(help.find(k.help), std::string::npos) << k.name;
        app.parse("--" + std::string(k.name) + " v", false);
        EXPECT_EQ(overrides.back(), std::string(k.name) + "=v");
    }
    EXPECT_NE(help.find("--set"), std::string::npos);
}

TEST(ConfigCli, BadKeysAreRejected) {
    CLI::App app;
    std::vector<std::string> overrides;
    add_config_options(app, overrides);
    EXPECT_THROW(app.parse("--n_layers 2", false), CLI::ParseError);
    app.parse("--set n_layers=2", false);
    TrainConfig c;
    const std::string msg = error_of([&] { apply_overrides(c, overrides); });
    EXPECT_NE(msg.find("'n_layers'"), std::string::npos) << msg;
}
