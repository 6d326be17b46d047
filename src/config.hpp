// Run configuration: one flat JSON object per file in configs/, validated against one schema
// (config.cpp) that also generates the `train` command-line options, so help never drifts.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>
#include <nlohmann/json.hpp>

namespace codagpt {

struct ModelConfig {
    int n_layer = 2;
    int n_head = 4;
    int n_embd = 64;
    int max_seq_len = 64;      // learned positions (GPT-2: 1024)
    int vocab_size = 50257;    // real vocabulary; tensors use padded_vocab()
    int padded_vocab() const { return (vocab_size + 127) / 128 * 128; }
    size_t num_params() const;  // with the padded vocabulary, tied embeddings counted once
};

constexpr int kMaxOutlierWindow = 1 << 20;  // steps of TrainConfig::outlier_window (and a checkpoint's)

struct TrainConfig {
    std::string name = "gpt2-tiny";
    std::string description;  // informational only
    ModelConfig model;
    // data
    std::string train_data = "data/tinyshakespeare/train_*.bin";  // glob of llm.c-format shards
    std::string val_data = "data/tinyshakespeare/val_*.bin";
    std::string out_dir = "runs/gpt2-tiny";
    bool shuffle = true;
    // batch: tokens per optimizer step = batch_size * seq_len * grad_accum (per process)
    int batch_size = 8;
    int seq_len = 64;
    int grad_accum = 1;
    // optimizer: AdamW; linear warmup to lr, then the lr_schedule down to lr * min_lr_frac at the
    // last step: cosine; linear; constant (lr throughout); wsd (warmup-stable-decay: lr until the
    // last cooldown_frac of the steps, then linear)
    int steps = 200;
    double lr = 1e-3;
    double min_lr_frac = 0.1;
    int warmup_steps = 10;
    std::string lr_schedule = "cosine";
    double cooldown_frac = 0.2;  // wsd only
    double weight_decay = 0.1;
    double beta1 = 0.9;
    double beta2 = 0.95;
    double adam_eps = 1e-8;
    double grad_clip = 1.0;  // global-norm clip; 0 disables
    // evaluation and logging
    int eval_every = 50;     // 0 disables; also evaluated after the last step
    int eval_batches = 8;
    // HellaSwag (choice_eval.hpp) scored at every evaluation, as llm.c does: its jsonl file (empty:
    // none) and at most this many of its items (0: all)
    std::string hellaswag_data;
    int hellaswag_items = 0;
    int log_every = 1;
    // checkpoints: out_dir/ckpt_<step>.bin every ckpt_every steps and after the last (0: only on
    // SIGINT/SIGTERM), keeping the newest ckpt_keep
    int ckpt_every = 0;
    int ckpt_keep = 3;
    // guards: a step whose loss or gradient norm is not finite is skipped (no update); this many
    // in a row stop the run with an error
    int max_bad_steps = 3;
    // outliers (as llm.c's -sl and -sg): a step whose loss (gradient norm, before clipping) lies more
    // than skip_loss_z (skip_grad_z) standard deviations above the mean of the previous
    // outlier_window steps' is skipped the same way, without counting towards max_bad_steps; 0
    // disables. The windows fill from the run's first step (checkpoints keep them) and take the
    // skipped steps' values too, so that a lasting change of level stops counting as an outlier.
    double skip_loss_z = 0;
    double skip_grad_z = 0;
    int outlier_window = 128;  // at most kMaxOutlierWindow
    // samples: every sample_every steps (and after the last; 0 disables) sample_tokens tokens that
    // continue sample_prompt (empty: the first token of the validation data, <|endoftext|> in
    // prepared shards), at temperature 1 over the whole vocabulary with Rng(seed) each time, so that
    // successive samples differ only through the weights and training draws nothing from them
    int sample_every = 50;
    int sample_tokens = 32;
    std::string sample_prompt;
    uint64_t seed = 1337;
};

// Parses and validates a config object. Unknown keys, wrong types and impossible values throw
// codagpt::Error naming the key. Keys missing from `j` keep the defaults above.
TrainConfig config_from_json(const nlohmann::json& j);
nlohmann::json config_to_json(const TrainConfig& c);
// Reads a config file: `name_or_path` is a path when it exists or ends in .json, else a name
// looked up as configs/<name>.json (relative to the working directory). Errors name the file.
TrainConfig load_config(const std::string& name_or_path);
// Applies "key=value" overrides in order (value parsed as the key's type), then re-validates.
void apply_overrides(TrainConfig& c, const std::vector<std::string>& key_values);
// Checks every value and the cross-key constraints (n_embd % n_head, seq_len <= max_seq_len, ...);
// throws Error naming the key.
void validate(const TrainConfig& c);

// The TrainConfig member a key reads and writes; the alternative held is the key's type.
using ConfigField = std::variant<int*, uint64_t*, double*, bool*, std::string*>;

// One schema row per key: drives parsing, serialization, overrides and the generated CLI options.
struct ConfigKey {
    const char* name;
    const char* type;  // "int", "uint64", "float", "bool", "string": from the member's C++ type
    const char* help;
    std::function<ConfigField(TrainConfig&)> field;
};
const std::vector<ConfigKey>& config_schema();

}  // namespace codagpt
