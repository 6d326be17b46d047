// `codagpt train`: the training program, top to bottom (train.cpp).
#pragma once
#include <string>
#include "config.hpp"

namespace codagpt {

struct TrainOptions {
    std::string device = "auto";  // auto | cpu | cuda
    std::string recompute = "none";  // none | gelu: recompute GELU outputs in backward (GPU memory)
    bool quiet = false;           // only the summary lines (metrics still go to the JSONL file)
    std::string bench_json;       // append a benchmark record (bench/results format) to this file
    std::string command;          // the command line, for that record
};

// Trains cfg and returns the process exit code. Bad input throws codagpt::Error.
int run_train(const TrainConfig& cfg, const TrainOptions& opt);

}  // namespace codagpt
