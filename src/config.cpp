#include "config.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <type_traits>

#include "common.hpp"

namespace codagpt {
namespace {

using nlohmann::json;

template <class... F>
struct overloaded : F... {
    using F::operator()...;
};
template <class... F>
overloaded(F...) -> overloaded<F...>;

template <class T>
constexpr const char* type_name() {
    if constexpr (std::is_same_v<T, int>) return "int";
    else if constexpr (std::is_same_v<T, uint64_t>) return "uint64";
    else if constexpr (std::is_same_v<T, double>) return "float";
    else if constexpr (std::is_same_v<T, bool>) return "bool";
    else return "string";
}

// A schema row from an accessor `[](auto& c) { return &c.member; }`: the key's type is read off
// the member, so each key is written once.
template <class Get>
ConfigKey key(const char* name, const char* help, Get get) {
    using T = std::remove_pointer_t<decltype(get(std::declval<TrainConfig&>()))>;
    static_assert(std::is_constructible_v<ConfigField, T*>, "config member of an unsupported type");
    return {name, type_name<T>(), help, [get](TrainConfig& c) -> ConfigField { return get(c); }};
}

size_t edit_distance(const std::string& a, const std::string& b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        size_t diagonal = row[0];
        row[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            size_t substitute = diagonal + (a[i - 1] != b[j - 1]);
            diagonal = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitute});
        }
    }
    return row[b.size()];
}

const ConfigKey& find_key(const std::string& name) {
    const auto& schema = config_schema();
    for (const auto& k : schema)
        if (name == k.name) return k;
    const auto closest = std::min_element(schema.begin(), schema.end(), [&](const auto& a, const auto& b) {
        return edit_distance(name, a.name) < edit_distance(name, b.name);
    });
    std::string msg = "unknown config key '" + one_line(name) + "'";
    if (edit_distance(name, closest->name) <= 2) msg += " (did you mean '" + std::string(closest->name) + "'?)";
    throw Error(msg);
}

// How a rejected value reads in a message: `2.5`, `string "abc"`, `array`.
std::string describe(const json& v) {
    if (v.is_number()) return v.dump();
    if (v.is_structured() || v.is_null()) return v.type_name();
    return std::string(v.type_name()) + " " + v.dump();
}

// The value of an integral JSON number when it fits in T. JSON integers arrive as int64 or, when
// non-negative, as uint64, so both are range-checked here.
template <class T>
std::optional<T> integer_as(const json& v) {
    constexpr auto min = std::numeric_limits<T>::min();
    constexpr auto max = std::numeric_limits<T>::max();
    if (v.is_number_unsigned()) {
        const uint64_t u = v.get<uint64_t>();
        if (u <= uint64_t(max)) return T(u);
    } else if (v.is_number_integer()) {
        const int64_t i = v.get<int64_t>();
        if (i >= 0 ? uint64_t(i) <= uint64_t(max) : i >= int64_t(min)) return T(i);
    }
    return std::nullopt;
}

// Stores a JSON value into the key's member, checking its type (not its range: see validate).
void read_value(const ConfigKey& key, TrainConfig& c, const json& v) {
    auto fail = [&](const char* expected) {
        throw Error(std::string(key.name) + ": expected " + expected + ", got " + describe(v));
    };
    std::visit(overloaded{
                   [&](int* p) {
                       const auto i = integer_as<int>(v);
                       if (!i) fail(v.is_number_integer() ? "a 32-bit integer" : "an integer");
                       *p = *i;
                   },
                   [&](uint64_t* p) {
                       const auto u = integer_as<uint64_t>(v);
                       if (!u) fail("a non-negative integer");
                       *p = *u;
                   },
                   [&](double* p) {
                       if (!v.is_number() || !std::isfinite(v.get<double>())) fail("a finite number");
                       *p = v.get<double>();
                   },
                   [&](bool* p) {
                       if (!v.is_boolean()) fail("true or false");
                       *p = v.get<bool>();
                   },
                   [&](std::string* p) {
                       if (!v.is_string()) fail("a string");
                       *p = v.get<std::string>();
                   },
               },
               key.field(c));
}

// Turns override text into the JSON value read_value expects, so that overrides and files share
// one set of type checks and messages; text that is not of the key's type passes through as a
// string and is rejected there.
json value_from_text(const ConfigField& field, const std::string& text) {
    return std::visit(overloaded{
                          [&](std::string*) { return json(text); },
                          [&](bool*) {
                              if (text == "true" || text == "1") return json(true);
                              if (text == "false" || text == "0") return json(false);
                              return json(text);
                          },
                          [&](auto*) {  // numbers, in JSON syntax
                              json number = json::parse(text, nullptr, /*allow_exceptions=*/false);
                              return number.is_number() ? number : json(text);
                          },
                      },
                      field);
}

template <class T>
std::string str(T v) {
    std::ostringstream s;
    s << v;
    return s.str();
}

void require(bool ok, const char* key, const std::string& what) {
    if (!ok) throw Error(std::string(key) + ": " + what);
}

template <class T>
void require_at_least(const char* key, T v, T min) {
    require(v >= min, key, "must be >= " + str(min) + ", got " + str(v));
}

}  // namespace

const std::vector<ConfigKey>& config_schema() {
    static const std::vector<ConfigKey> schema = {
        key("name", "run name, shown in logs", [](auto& c) { return &c.name; }),
        key("description", "what the config is for (informational)", [](auto& c) { return &c.description; }),
        key("n_layer", "transformer blocks", [](auto& c) { return &c.model.n_layer; }),
        key("n_head", "attention heads per block; must divide n_embd", [](auto& c) { return &c.model.n_head; }),
        key("n_embd", "model width (channels)", [](auto& c) { return &c.model.n_embd; }),
        key("max_seq_len", "learned positions: the longest context", [](auto& c) { return &c.model.max_seq_len; }),
        key("vocab_size", "vocabulary size, at most 65536 (uint16 tokens); tensors pad it to a multiple of 128",
            [](auto& c) { return &c.model.vocab_size; }),
        key("train_data", "glob of llm.c-format training shards", [](auto& c) { return &c.train_data; }),
        key("val_data", "glob of llm.c-format validation shards", [](auto& c) { return &c.val_data; }),
        key("out_dir", "folder for logs and checkpoints (in a config without it: runs/<name>)", [](auto& c) { return &c.out_dir; }),
        key("shuffle", "visit training windows in a seeded random order each epoch",
            [](auto& c) { return &c.shuffle; }),
        key("batch_size", "sequences per micro-batch (per process)", [](auto& c) { return &c.batch_size; }),
        key("seq_len", "tokens per sequence; at most max_seq_len", [](auto& c) { return &c.seq_len; }),
        key("grad_accum", "micro-batches accumulated per optimizer step", [](auto& c) { return &c.grad_accum; }),
        key("steps", "optimizer steps", [](auto& c) { return &c.steps; }),
        key("lr", "peak learning rate (AdamW)", [](auto& c) { return &c.lr; }),
        key("min_lr_frac", "learning rate at the last step, as a fraction of lr (not for the constant schedule; a run of no more "
            "steps than warmup_steps ends still warming up)",
            [](auto& c) { return &c.min_lr_frac; }),
        key("warmup_steps", "steps of linear learning-rate warmup", [](auto& c) { return &c.warmup_steps; }),
        key("lr_schedule",
            "after the warmup: cosine, linear (both to lr * min_lr_frac at the last step), constant, or wsd (lr, then "
            "linear to lr * min_lr_frac over the last cooldown_frac of the steps)",
            [](auto& c) { return &c.lr_schedule; }),
        key("cooldown_frac", "wsd: the share of the steps over which the learning rate decays at the end",
            [](auto& c) { return &c.cooldown_frac; }),
        key("weight_decay", "AdamW decoupled weight decay", [](auto& c) { return &c.weight_decay; }),
        key("beta1", "AdamW first-moment decay", [](auto& c) { return &c.beta1; }),
        key("beta2", "AdamW second-moment decay", [](auto& c) { return &c.beta2; }),
        key("adam_eps", "AdamW epsilon", [](auto& c) { return &c.adam_eps; }),
        key("grad_clip", "clip the global gradient norm to this; 0 disables", [](auto& c) { return &c.grad_clip; }),
        key("eval_every", "steps between validation passes (also after the last step); 0 disables",
            [](auto& c) { return &c.eval_every; }),
        key("eval_batches", "validation batches per pass", [](auto& c) { return &c.eval_batches; }),
        key("hellaswag_data",
            "HellaSwag jsonl (scripts/get_hellaswag.sh) scored at every evaluation (needs the tokenizer); empty: none",
            [](auto& c) { return &c.hellaswag_data; }),
        key("hellaswag_items", "HellaSwag items scored at each evaluation (the first ones); 0: all",
            [](auto& c) { return &c.hellaswag_items; }),
        key("log_every", "steps between training log lines", [](auto& c) { return &c.log_every; }),
        key("ckpt_every", "steps between checkpoints (also after the last step); 0: only on SIGINT/SIGTERM",
            [](auto& c) { return &c.ckpt_every; }),
        key("ckpt_keep", "checkpoints kept in out_dir (the newest)", [](auto& c) { return &c.ckpt_keep; }),
        key("max_bad_steps", "non-finite loss or gradient norm: steps skipped in a row before the run stops with an error",
            [](auto& c) { return &c.max_bad_steps; }),
        key("skip_loss_z",
            "skip the update of a step whose loss is this many standard deviations above the mean of the last "
            "outlier_window steps' (a loss spike); 0 disables",
            [](auto& c) { return &c.skip_loss_z; }),
        key("skip_grad_z", "the same for the gradient norm (before clipping); 0 disables",
            [](auto& c) { return &c.skip_grad_z; }),
        key("outlier_window", "steps whose losses and gradient norms skip_loss_z and skip_grad_z compare with",
            [](auto& c) { return &c.outlier_window; }),
        key("sample_every", "steps between text samples printed and logged (also after the last step); 0 disables",
            [](auto& c) { return &c.sample_every; }),
        key("sample_tokens", "tokens per sample (fewer when the context fills)", [](auto& c) { return &c.sample_tokens; }),
        key("sample_prompt", "text the samples continue (needs the tokenizer); empty: the first validation token",
            [](auto& c) { return &c.sample_prompt; }),
        key("seed", "seed of initialization and data order", [](auto& c) { return &c.seed; }),
    };
    return schema;
}

size_t ModelConfig::num_params() const {
    const size_t C = n_embd, L = n_layer;
    // Per block, weights + biases: ln1 2C, qkv 3C^2+3C, attention projection C^2+C, ln2 2C,
    // fc 4C^2+4C, fc projection 4C^2+C.
    const size_t per_layer = 12 * C * C + 13 * C;
    // wte (shared with the classifier, so counted once), wpe, blocks, final layernorm.
    return size_t(padded_vocab()) * C + size_t(max_seq_len) * C + L * per_layer + 2 * C;
}

void validate(const TrainConfig& c) {
    const ModelConfig& m = c.model;
    require(!c.name.empty(), "name", "must not be empty");
    require_at_least("n_layer", m.n_layer, 1);
    require_at_least("n_head", m.n_head, 1);
    require_at_least("n_embd", m.n_embd, 1);
    require(m.n_embd % m.n_head == 0, "n_head",
            "must divide n_embd (n_embd " + str(m.n_embd) + ", n_head " + str(m.n_head) + ")");
    require_at_least("max_seq_len", m.max_seq_len, 1);
    // Shards store tokens as uint16.
    require(m.vocab_size >= 1 && m.vocab_size <= 65536, "vocab_size",
            "must be in [1, 65536], got " + str(m.vocab_size));
    require(!c.train_data.empty(), "train_data", "must not be empty");
    require(!c.val_data.empty(), "val_data", "must not be empty");
    require(!c.out_dir.empty(), "out_dir", "must not be empty");
    require_at_least("batch_size", c.batch_size, 1);
    require_at_least("seq_len", c.seq_len, 1);
    require(c.seq_len <= m.max_seq_len, "seq_len",
            "must be <= max_seq_len (" + str(m.max_seq_len) + "), got " + str(c.seq_len));
    // The GPU kernels index a micro-batch's tokens with int and launch attention with a grid of
    // batch_size blocks in z (at most 65535).
    require(c.batch_size <= 65535, "batch_size", "must be <= 65535, got " + str(c.batch_size));
    require((long long)c.batch_size * c.seq_len < (1LL << 31), "batch_size",
            "times seq_len (the tokens of a micro-batch) must be below 2^31, got " + str(c.batch_size) + " x " +
                str(c.seq_len));
    require_at_least("grad_accum", c.grad_accum, 1);
    require_at_least("steps", c.steps, 1);
    require(c.lr > 0, "lr", "must be > 0, got " + str(c.lr));
    require(c.min_lr_frac >= 0 && c.min_lr_frac <= 1, "min_lr_frac", "must be in [0, 1], got " + str(c.min_lr_frac));
    require_at_least("warmup_steps", c.warmup_steps, 0);
    require(c.lr_schedule == "cosine" || c.lr_schedule == "linear" || c.lr_schedule == "constant" ||
                c.lr_schedule == "wsd",
            "lr_schedule", "must be cosine, linear, constant or wsd, got '" + one_line(c.lr_schedule) + "'");
    require(c.cooldown_frac > 0 && c.cooldown_frac <= 1, "cooldown_frac",
            "must be in (0, 1], got " + str(c.cooldown_frac));
    require_at_least("weight_decay", c.weight_decay, 0.0);
    require(c.beta1 >= 0 && c.beta1 < 1, "beta1", "must be in [0, 1), got " + str(c.beta1));
    require(c.beta2 >= 0 && c.beta2 < 1, "beta2", "must be in [0, 1), got " + str(c.beta2));
    require(c.adam_eps > 0, "adam_eps", "must be > 0, got " + str(c.adam_eps));
    require_at_least("grad_clip", c.grad_clip, 0.0);
    require_at_least("eval_every", c.eval_every, 0);
    require_at_least("eval_batches", c.eval_batches, 1);
    require_at_least("hellaswag_items", c.hellaswag_items, 0);
    require_at_least("log_every", c.log_every, 1);
    require_at_least("ckpt_every", c.ckpt_every, 0);
    require_at_least("ckpt_keep", c.ckpt_keep, 1);
    require_at_least("max_bad_steps", c.max_bad_steps, 1);
    require_at_least("skip_loss_z", c.skip_loss_z, 0.0);
    require_at_least("skip_grad_z", c.skip_grad_z, 0.0);
    require(c.outlier_window >= 2 && c.outlier_window <= kMaxOutlierWindow, "outlier_window",
            "must be in [2, " + str(kMaxOutlierWindow) + "], got " + str(c.outlier_window));
    require_at_least("sample_every", c.sample_every, 0);
    require_at_least("sample_tokens", c.sample_tokens, 1);
}

TrainConfig config_from_json(const json& j) {
    if (!j.is_object()) throw Error("a config must be a JSON object of \"key\": value, got " + describe(j));
    TrainConfig c;
    for (const auto& item : j.items()) read_value(find_key(item.key()), c, item.value());
    // A config that names no folder writes into one of its own, not into gpt2-tiny's.
    if (!j.contains("out_dir")) {
        std::string folder = c.name;
        std::replace(folder.begin(), folder.end(), '/', '_');
        c.out_dir = "runs/" + (folder.empty() || folder == "." || folder == ".." ? "unnamed" : folder);
    }
    validate(c);
    return c;
}

json config_to_json(const TrainConfig& c) {
    TrainConfig copy = c;  // schema accessors hand out mutable pointers
    json j = json::object();
    for (const auto& k : config_schema()) std::visit([&](auto* p) { j[k.name] = *p; }, k.field(copy));
    return j;
}

TrainConfig load_config(const std::string& name_or_path) {
    namespace fs = std::filesystem;
    fs::path path = name_or_path;
    if (!fs::exists(path) && path.extension() != ".json") path = fs::path("configs") / (name_or_path + ".json");
    std::ifstream in(path);
    if (!in || fs::is_directory(path))
        throw Error("cannot read config " + path.string() + " (--config takes a .json path or a name from configs/)");
    json j;
    try {
        j = json::parse(in);
    } catch (const json::exception& e) {  // parse_error, and out_of_range for numbers such as 1e400
        throw Error(path.string() + ": invalid JSON: " + e.what());
    }
    try {
        return config_from_json(j);
    } catch (const Error& e) {
        throw Error(path.string() + ": " + e.what());
    }
}

void apply_overrides(TrainConfig& c, const std::vector<std::string>& key_values) {
    TrainConfig updated = c;  // `c` stays untouched when an override is rejected
    for (const auto& kv : key_values) {
        const size_t eq = kv.find('=');
        if (eq == std::string::npos) throw Error("override '" + one_line(kv) + "': expected KEY=VALUE");
        const ConfigKey& k = find_key(kv.substr(0, eq));
        read_value(k, updated, value_from_text(k.field(updated), kv.substr(eq + 1)));
    }
    validate(updated);
    c = std::move(updated);
}

}  // namespace codagpt
