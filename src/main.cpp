// codagpt: one binary, one subcommand per job.
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common.hpp"
#include "config.hpp"
#include "config_cli.hpp"
#include "results.hpp"
#include "train.hpp"
#ifdef CODAGPT_HAVE_TOKENIZER
#include "prepare.hpp"
#include "tokenizer.hpp"
#endif

int main(int argc, char** argv) {
    using namespace codagpt;
    CLI::App app{"codagpt: GPT-2 training with LayerNorm, GELU, bias and residual work fused into GEMM "
                 "epilogues (CODA), with an unfused baseline and an fp32 CPU reference"};
    app.require_subcommand(1);
    app.failure_message([](const CLI::App*, const CLI::Error& e) {
        return std::string("codagpt: error: ") + e.what() + " (see --help)\n";
    });

    // ---- train
    CLI::App* train = app.add_subcommand("train", "Train a GPT-2 model (GPU when present, else the CPU reference)");
    std::string config_name = "gpt2-tiny";
    TrainOptions train_opt;
    std::vector<std::string> overrides;
    train->add_option("-c,--config", config_name, "Config name in configs/ or path to a JSON config")
        ->capture_default_str();
    train->add_option("--device", train_opt.device, "auto (GPU when present), cpu or cuda")
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
        ->capture_default_str();
    train->add_option("--recompute", train_opt.recompute,
                      "none, or gelu: keep no GELU outputs from forward, recompute them in backward (GPU)")
        ->check(CLI::IsMember({"none", "gelu"}))
        ->capture_default_str();
    train->add_flag("-q,--quiet", train_opt.quiet, "Print only evaluation and summary lines");
    train->add_option("--bench-json", train_opt.bench_json,
                      "Append a benchmark record (steady-state tok/s, ms/step, losses) to this JSON file");
    train->add_option("--resume", train_opt.resume,
                      "Continue from a checkpoint: a path, or latest (the newest ckpt_<step>.bin in out_dir)");
    train->add_option("--stop-after", train_opt.stop_after,
                      "Stop after this step as on SIGINT: save a checkpoint and exit 0 (jobs with a time limit)")
        ->check(CLI::NonNegativeNumber);
    add_config_options(*train, overrides);

    // ---- prepare
#ifdef CODAGPT_HAVE_TOKENIZER
    CLI::App* prepare = app.add_subcommand("prepare", "Tokenize text files into llm.c-format train/val shards");
    std::vector<std::string> prepare_inputs;
    std::string prepare_out;
    PrepareOptions prepare_opt;
    prepare->add_option("-i,--input", prepare_inputs, "Text files (UTF-8); each is one document")
        ->required()
        ->check(CLI::ExistingFile);
    prepare->add_option("-o,--out", prepare_out, "Output folder for train_*.bin and val_*.bin")->required();
    prepare->add_option("--val-fraction", prepare_opt.val_fraction,
                        "Share of tokens (leading documents) for validation")
        ->capture_default_str();
    prepare->add_option("--shard-tokens", prepare_opt.shard_tokens, "Tokens per shard file")->capture_default_str();
    prepare->add_flag("--split-on-blank-lines", prepare_opt.split_on_blank_lines,
                      "Treat every blank-line-separated section as its own document (llm.c's TinyShakespeare)");
#endif

    CLI11_PARSE(app, argc, argv);
    try {
        if (train->parsed()) {
            TrainConfig cfg = load_config(config_name);
            apply_overrides(cfg, overrides);
            train_opt.command = join_command(argc, argv);
            return run_train(cfg, train_opt);
        }
#ifdef CODAGPT_HAVE_TOKENIZER
        if (prepare->parsed()) {
            const Tokenizer tok = Tokenizer::load(find_tokenizer_dir());
            const PrepareStats s = prepare_shards(prepare_inputs, prepare_out, prepare_opt, tok);
            std::printf("prepared %zu documents: %zu train tokens, %zu val tokens in %zu shards under %s\n",
                        s.documents, s.train_tokens, s.val_tokens, s.shards.size(), prepare_out.c_str());
            return 0;
        }
#endif
    } catch (const std::exception& e) {
        std::fprintf(stderr, "codagpt: error: %s\n", e.what());
        return 1;
    }
    return 0;
}
