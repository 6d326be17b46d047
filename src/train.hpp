// `codagpt train`: the training program, top to bottom (train.cpp).
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include "choice_eval.hpp"
#include "config.hpp"

namespace codagpt {

class TrainBackend;

// Text for the samples taken during training (sample_every).
struct SampleText {
    std::function<std::vector<int>(const std::string&)> encode;
    std::function<std::string(const std::vector<int>&)> decode;
};

struct TrainOptions {
    std::string device = "auto";  // auto | cpu | cuda
    std::string recompute = "none";  // none | gelu | mlp: what backward recomputes (GPU memory; backend.hpp)
    int recompute_layers = 0;        // recompute in layers [0, n) only (needs recompute gelu|mlp); 0: every layer
    int lm_head_chunks = 0;          // fused GPU path: the LM head in N row chunks; 0: the model's choice
    bool nondeterministic_attention = false;  // GPU: cuDNN's attention backward with atomic dQ
    std::string fusion = "auto";     // GPU path: coda, unfused, or auto (coda on sm_80+ GPUs)
    std::string trace_kernels;       // write the last step's kernels, memsets and copies to this file; empty: none
    // Time each step's phases with CUDA events (step_phases.hpp; GPU): print their medians over the
    // steady steps at the end, add them to metrics.jsonl's step lines and to the bench_json record.
    bool phase_times = false;
    // Add each parameter tensor's gradient norm (per layer for the layers' tensors) to every step
    // line of metrics.jsonl ("grad_norms"): which tensor a gradient spike comes from. One process;
    // copies the gradients to the host after each step, outside its clock.
    bool grad_norms = false;
    bool quiet = false;           // only the summary lines (metrics still go to the JSONL file)
    std::string bench_json;       // append a benchmark record (bench/results format) to this file
    std::string command;          // the command line, for that record
    // Checkpoint to continue from: a path, "latest" (the newest in out_dir), or "auto" (latest where
    // out_dir holds a checkpoint, else start fresh: a job that is requeued); empty: start fresh.
    std::string resume;
    // Weights to start from instead of the seed's initialization (fine-tuning: step 0, zero AdamW
    // moments): a codagpt checkpoint, .safetensors or llm.c model .bin of the config's model shape.
    // Excludes `resume`, which continues a run.
    std::string init_from;
    // Called once at start-up when cfg.sample_every > 0 (main loads the GPT-2 tokenizer); empty: the
    // samples show token ids, and a non-empty sample_prompt is refused.
    std::function<SampleText()> sample_text;
    int stop_after = 0;           // stop after this step as on SIGINT (checkpoint, exit 0); 0: never
    // When stdout is a terminal (or with `live`) one progress line is rewritten in place every step
    // instead of a line per log_every steps; quiet wins over both.
    bool live = false;
    // For tests: wraps the backend the run built (fault injection); empty: none.
    std::function<std::unique_ptr<TrainBackend>(std::unique_ptr<TrainBackend>)> wrap_backend;
};

// Trains cfg and returns the process exit code. Bad input throws codagpt::Error.
// Checkpoints (checkpoint.hpp) go to cfg.out_dir every cfg.ckpt_every steps and after the last
// one. While it runs, SIGINT and SIGTERM end the run after the current step with a checkpoint and
// exit code 0 (a second signal ends it at once; the last checkpoint stays intact).
// A step whose loss or gradient norm is not finite is skipped (no optimizer update; logged, and
// recorded as {"step", "skipped"} in metrics.jsonl); cfg.max_bad_steps of them in a row throw Error.
// So is an outlier where cfg.skip_loss_z or skip_grad_z ask for it (config.hpp), without counting.
// With opt.resume the run continues from a checkpoint exactly as it would have gone on without the
// interruption (same losses, same weights), appending to the run's metrics.jsonl.
// With cfg.sample_every a sample of the model's text is printed and written to metrics.jsonl as
// {"step", "sample", "sample_tokens"} at steps 0, sample_every, ... and after the last; it draws
// from its own generator, so the losses are those of the same run without samples.
int run_train(const TrainConfig& cfg, const TrainOptions& opt);

// `codagpt eval`: the validation loss of a model's weights, computed as a training run's evaluation
// computes it (the same backends, batches and order), so a checkpoint's loss here is the one its
// run logged at that step for the same data, B, T, eval_batches, device and path, where that run
// was one process (a data-parallel run's ranks evaluate their own shares of the windows).
struct EvalOptions {
    std::string weights;   // a codagpt checkpoint, .safetensors or llm.c model .bin
    // Config name or path for the data, B, T and eval_batches; empty: a checkpoint's own run config,
    // or gpt2-tiny's for other weights. The model's shape is always the weights'.
    std::string config;
    std::vector<std::string> overrides;  // "key=value", applied after the config (config_cli.hpp)
    std::string device = "auto";         // auto | cpu | cuda
    std::string fusion = "auto";         // GPU path: coda, unfused, or auto
    bool all = false;                    // every window of the validation data instead of eval_batches
    // As TrainOptions::sample_text, called where the config names hellaswag_data (HellaSwag is then
    // scored too, as at a training run's evaluations); empty in builds without a tokenizer.
    std::function<SampleText()> sample_text;
};
struct EvalResult {
    double val_loss = 0;  // mean over the batches of each batch's mean token loss
    int batches = 0;
    TrainConfig config;   // as used: the weights' model, the data, B and T
    std::string backend;  // TrainBackend::describe()
    double seconds = 0;   // of the evaluation itself (not loading)
    std::optional<ChoiceScore> hellaswag;
    double hellaswag_seconds = 0;
};
// Bad input (weights, config, data, a model key that contradicts the weights) throws codagpt::Error.
EvalResult run_eval(const EvalOptions& opt);

}  // namespace codagpt
