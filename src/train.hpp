// `codagpt train`: the training program, top to bottom (train.cpp).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include "config.hpp"

namespace codagpt {

class TrainBackend;

struct TrainOptions {
    std::string device = "auto";  // auto | cpu | cuda
    std::string recompute = "none";  // none | gelu: recompute GELU outputs in backward (GPU memory)
    bool quiet = false;           // only the summary lines (metrics still go to the JSONL file)
    std::string bench_json;       // append a benchmark record (bench/results format) to this file
    std::string command;          // the command line, for that record
    std::string resume;           // checkpoint to continue from: a path, or "latest" in out_dir; empty: start fresh
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
// With opt.resume the run continues from a checkpoint exactly as it would have gone on without the
// interruption (same losses, same weights), appending to the run's metrics.jsonl.
int run_train(const TrainConfig& cfg, const TrainOptions& opt);

}  // namespace codagpt
