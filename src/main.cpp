// codagpt: one binary, one subcommand per job.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backend.hpp"
#include "common.hpp"
#include "config.hpp"
#include "config_cli.hpp"
#include "fileio.hpp"
#include "plot.hpp"
#include "results.hpp"
#include "train.hpp"
#include "interchange.hpp"
#include "launcher.hpp"
#include "sample.hpp"
#ifdef CODAGPT_HAVE_TOKENIZER
#include "prepare.hpp"
#include "tokenizer.hpp"
#endif

namespace {
// CLI11's NonNegativeNumber writes the top of its range, the largest double, out in 309 digits.
const CLI::Validator kNonNegative(
    [](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0') return "expected a number, got " + text;
        return v >= 0 ? "" : "must be >= 0, got " + text;
    },
    "NONNEGATIVE");
}  // namespace

static int run_main(int argc, char** argv) {
    using namespace codagpt;
    // `train --nproc-per-node N`: this process becomes the launcher of N workers (launcher.hpp).
    if (const std::optional<int> rc = run_launcher_if_requested(argc, argv)) return *rc;
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
                      "none; gelu: keep no GELU outputs from forward, recompute them in backward; mlp: keep no "
                      "MLP activations, run the fc GEMM again in backward (GPU; less memory, more time)")
        ->check(CLI::IsMember({"none", "gelu", "mlp"}))
        ->capture_default_str();
    train->add_option("--recompute-layers", train_opt.recompute_layers,
                      "With --recompute gelu|mlp: recompute in the first N layers only and keep the others' "
                      "activations (between the two modes' memory and time; default: every layer)");
    train->add_option("--lm-head-chunks", train_opt.lm_head_chunks,
                      "Fused GPU path: run the LM head and its backward over N equal row chunks of the batch (less memory "
                      "for the logits; default 0: as few as fit the backward's scratch, cut where their GEMMs fill the GPU best)")
        ->check(kNonNegative);
    train->add_option("--fusion", train_opt.fusion,
                      "GPU path: coda (LayerNorm, GELU, bias and residual in GEMM epilogues), unfused, or auto "
                      "(coda on sm_80+ GPUs)")
        ->check(CLI::IsMember({"auto", "coda", "unfused"}))
        ->capture_default_str();
    train->add_option("--trace-kernels", train_opt.trace_kernels,
                      "Write the kernels (library internals included), memsets and copies of the run's last training step, "
                      "one a line, to FILE");
    train->add_flag("--nondeterministic-attention", train_opt.nondeterministic_attention,
                    "GPU: cuDNN's attention backward adds dQ with atomics (a step ~1% faster, a few hundred MiB "
                    "less memory; losses no longer repeat bit for bit from the same seed)");
    train->add_flag("--phase-times", train_opt.phase_times,
                    "Time each step's phases with CUDA events (forward+backward, gradient reductions and their "
                    "part not hidden by backward, optimizer): medians at the end, per step in metrics.jsonl");
    train->add_flag("--grad-norms", train_opt.grad_norms,
                    "Log each parameter tensor's gradient norm (per layer for the layers' tensors) in every step line "
                    "of metrics.jsonl: where a gradient spike comes from (one process; copies the gradients after each step)");
    train->add_flag("-q,--quiet", train_opt.quiet, "Print only evaluation and summary lines");
    train->add_option("--bench-json", train_opt.bench_json,
                      "Append a benchmark record (steady-state tok/s, ms/step, losses) to this JSON array file (checked before the "
                      "first step)");
    CLI::Option* resume_opt = train->add_option(
        "--resume", train_opt.resume, "Continue from a checkpoint: a path, latest (the newest ckpt_<step>.bin in out_dir), or auto (latest where "
        "out_dir holds one, else start a new run)");
    train->add_option("--init-from", train_opt.init_from,
                      "Start from these weights at step 0 with a fresh optimizer (fine-tuning): a codagpt checkpoint, "
                      ".safetensors or llm.c model .bin of the config's model shape")
        ->excludes(resume_opt);
    train->add_option("--stop-after", train_opt.stop_after,
                      "Stop after this step as on SIGINT: save a checkpoint and exit 0 (jobs with a time limit; counted from "
                      "the run's start, so past the step --resume continues from)")
        ->check(kNonNegative);
    add_config_options(*train, overrides);
    train->footer(launch_help());  // the launcher parses its flags before CLI11 runs

    // ---- eval (a model's validation loss, as training evaluates it)
    CLI::App* eval_cmd = app.add_subcommand("eval", "Validation loss (and HellaSwag accuracy) of a model's weights, as "
                                                    "a training run evaluates (GPU when present, else the CPU reference)");
    EvalOptions eval_opt;
    bool eval_json = false;
    eval_cmd->add_option("--checkpoint", eval_opt.weights, "A codagpt checkpoint, .safetensors or llm.c model .bin")
        ->required();
    eval_cmd->add_option("-c,--config", eval_opt.config,
                         "Config name or path for the data, batch_size, seq_len and eval_batches (default: a "
                         "checkpoint's own run config, else gpt2-tiny); the model's shape is the weights'");
    eval_cmd->add_option("--device", eval_opt.device, "auto (GPU when present), cpu or cuda")
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
        ->capture_default_str();
    eval_cmd->add_option("--fusion", eval_opt.fusion, "GPU path: coda, unfused, or auto (coda on sm_80+ GPUs)")
        ->check(CLI::IsMember({"auto", "coda", "unfused"}))
        ->capture_default_str();
    eval_cmd->add_flag("--all", eval_opt.all, "Every window of the validation data, not the first eval_batches");
    eval_cmd->add_flag("--json", eval_json, "Print one JSON object instead of the text lines");
    add_config_options(*eval_cmd, eval_opt.overrides);
    eval_cmd->footer("eval reads val_data, batch_size, seq_len, eval_batches, hellaswag_data and hellaswag_items of "
                     "the config keys (--hellaswag_data FILE also scores HellaSwag); the model keys are the weights'; "
                     "the others are accepted and unused.");

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
    prepare->add_option("--shard-tokens", prepare_opt.shard_tokens, "Tokens per shard file")
        ->check(kNonNegative)
        ->capture_default_str();
    prepare->add_flag("--split-on-blank-lines", prepare_opt.split_on_blank_lines,
                      "Treat every blank-line-separated section as its own document (llm.c's TinyShakespeare)");
#endif

    // ---- export (weights to Hugging Face safetensors or llm.c's .bin)
    CLI::App* export_cmd = app.add_subcommand("export", "Write a model's weights as Hugging Face safetensors or llm.c .bin");
    std::string export_in, export_out, export_format = "safetensors", export_dtype = "f32", export_logits;
    int export_logits_T = 64;
    export_cmd->add_option("--checkpoint", export_in, "A codagpt checkpoint, .safetensors file or llm.c model .bin")
        ->required();
    export_cmd->add_option("-o,--out", export_out, "Output file")->required();
    export_cmd->add_option("--format", export_format, "safetensors (GPT2LMHeadModel names) or llmc (llm.c model .bin)")
        ->check(CLI::IsMember({"safetensors", "llmc"}))
        ->capture_default_str();
    export_cmd->add_option("--dtype", export_dtype, "f32 or bf16")->check(CLI::IsMember({"f32", "bf16"}))->capture_default_str();
    export_cmd->add_option("--reference-logits", export_logits,
                           "Also write the CPU reference's logits for one random sequence here "
                           "(for scripts/check_hf_export.py)");
    export_cmd->add_option("--reference-tokens", export_logits_T, "Tokens in that sequence (at most max_seq_len)")
        ->capture_default_str();

    // ---- sample (text from a model, CPU, KV cache)
#ifdef CODAGPT_HAVE_TOKENIZER
    CLI::App* sample_cmd = app.add_subcommand(
        "sample", "Generate text from a model with a KV cache (GPU when present, else CPU), streamed to stdout");
    std::string sample_in, sample_prompt, sample_device = "auto";
    SampleOptions sample_opt;
    sample_cmd->add_option("--checkpoint", sample_in, "A codagpt checkpoint, .safetensors file or llm.c model .bin")
        ->required();
    sample_cmd->add_option("--prompt", sample_prompt, "Text to continue (default: start from <|endoftext|>)");
    sample_cmd->add_option("--max-tokens", sample_opt.max_tokens, "Tokens to generate (fewer when the context fills)")
        ->check(kNonNegative)
        ->capture_default_str();
    sample_cmd->add_option("--temperature", sample_opt.temperature, "Softmax temperature; 0 is greedy")
        ->check(kNonNegative)
        ->capture_default_str();
    sample_cmd->add_option("--top-k", sample_opt.top_k, "Sample among the K likeliest tokens; 0: all")
        ->check(kNonNegative)
        ->capture_default_str();
    sample_cmd->add_option("--seed", sample_opt.seed, "Random seed (same seed, same text)")
        ->check(kNonNegative)
        ->capture_default_str();
    sample_cmd->add_option("--device", sample_device, "auto (GPU when present), cpu or cuda (bf16 weights)")
        ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
        ->capture_default_str();
#endif

    // ---- plot (runs' metrics.jsonl as one SVG)
    CLI::App* plot_cmd = app.add_subcommand(
        "plot", "Draw loss, val loss and tok/s against step from RUN_DIR/metrics.jsonl into an SVG; several runs overlaid");
    std::vector<std::string> plot_dirs, plot_labels;
    std::string plot_out;
    plot_cmd->add_option("run_dirs", plot_dirs, "Run directories (train runs' out_dir), one colour each")->required();
    plot_cmd->add_option("-o,--out", plot_out, "SVG file to write (one run: default RUN_DIR/metrics.svg; several: required)");
    plot_cmd->add_option("--labels", plot_labels, "Legend names of the runs, comma-separated, in order (default: folder names)")
        ->delimiter(',')
        ->allow_extra_args(false);  // one comma-separated word, so run directories after it stay run directories

    CLI11_PARSE(app, argc, argv);
    // The GPT-2 tokenizer as text for train (samples, HellaSwag) and eval (HellaSwag): loaded where a
    // run needs it, so that runs without text need no tokenizer files. Empty without the tokenizer.
    std::function<SampleText()> gpt2_text;
#ifdef CODAGPT_HAVE_TOKENIZER
    gpt2_text = [] {
        std::shared_ptr<const Tokenizer> tok;
        try {
            tok = std::make_shared<const Tokenizer>(Tokenizer::load(find_tokenizer_dir()));
        } catch (const Error& e) {
            throw Error(std::string("samples (sample_every) and HellaSwag (hellaswag_data) need the GPT-2 "
                                    "tokenizer: ") +
                        e.what() + " (or set sample_every 0 and no hellaswag_data)");
        }
        return SampleText{[tok](const std::string& text) { return tok->encode(text); },
                          [tok](const std::vector<int>& ids) { return tok->decode(ids); }};
    };
#endif
    try {
        if (train->parsed()) {
            TrainConfig cfg = load_config(config_name);
            apply_overrides(cfg, overrides);
            train_opt.command = join_command(argc, argv);
            train_opt.sample_text = gpt2_text;
            return run_train(cfg, train_opt);
        }
        if (eval_cmd->parsed()) {
            eval_opt.sample_text = gpt2_text;
            const EvalResult r = run_eval(eval_opt);
            const TrainConfig& c = r.config;
            const long tokens = (long)r.batches * c.batch_size * c.seq_len;
            const std::optional<ChoiceScore>& h = r.hellaswag;
            if (eval_json) {
                nlohmann::json j = {{"weights", eval_opt.weights}, {"val_loss", r.val_loss},
                                    {"perplexity", std::exp(r.val_loss)}, {"batches", r.batches},
                                    {"batch_size", c.batch_size}, {"seq_len", c.seq_len}, {"tokens", tokens},
                                    {"val_data", c.val_data}, {"backend", r.backend}, {"seconds", r.seconds}};
                if (h)
                    j["hellaswag"] = {{"items", h->items}, {"acc_norm", h->acc_norm()}, {"acc", h->acc()},
                                      {"contexts_cut", h->cut}, {"seconds", r.hellaswag_seconds}};
                std::printf("%s\n", j.dump().c_str());
            } else {
                std::printf("val loss %.4f | perplexity %.2f | %d batches of %d x %d = %ld tokens of %s | %s | "
                            "%.1f s\n",
                            r.val_loss, std::exp(r.val_loss), r.batches, c.batch_size, c.seq_len, tokens,
                            c.val_data.c_str(), r.backend.c_str(), r.seconds);
                if (h)
                    std::printf("hellaswag acc_norm %.4f | acc %.4f | %zu items, %zu contexts cut to seq_len %d | "
                                "%.1f s\n",
                                h->acc_norm(), h->acc(), h->items, h->cut, c.seq_len, r.hellaswag_seconds);
            }
            return 0;
        }
        if (plot_cmd->parsed()) {
            std::printf("wrote %s\n", plot_runs(plot_dirs, plot_out, plot_labels).c_str());
            return 0;
        }
        if (export_cmd->parsed()) {
            check_not_overwriting(export_out, export_in, "--checkpoint");
            if (!export_logits.empty()) {
                check_not_overwriting(export_logits, export_in, "--checkpoint");
                check_not_overwriting(export_logits, export_out, "--out");
            }
            const ModelWeights w = load_weights(export_in);
            if (!export_logits.empty()) check_reference_tokens(w.config, export_logits_T);
            const WeightsDtype dtype = export_dtype == "bf16" ? WeightsDtype::bf16 : WeightsDtype::f32;
            if (export_format == "llmc")
                export_llmc(export_out, w.config, w.params.data(), dtype);
            else
                export_safetensors(export_out, w.config, w.params.data(), dtype);
            std::printf("wrote %s (%s, %s): %d layers, %d heads, width %d, %d positions, vocabulary %d\n",
                        export_out.c_str(), export_format.c_str(), export_dtype.c_str(), w.config.n_layer,
                        w.config.n_head, w.config.n_embd, w.config.max_seq_len, w.config.vocab_size);
            if (!export_logits.empty()) {
                write_reference_logits(export_logits, w, export_logits_T, 1337);
                std::printf("wrote reference logits for %d tokens to %s\n", export_logits_T, export_logits.c_str());
            }
            return 0;
        }
#ifdef CODAGPT_HAVE_TOKENIZER
        if (sample_cmd->parsed()) {
            const ModelWeights w = load_weights(sample_in);
            const Tokenizer tok = Tokenizer::load(find_tokenizer_dir());
            std::vector<int> prompt = tok.encode(sample_prompt);
            if (prompt.empty()) prompt.push_back(Tokenizer::kEot);
            const std::unique_ptr<Decoder> dec = use_gpu(sample_device)
                                                     ? make_gpu_decoder(w.config, w.params)
                                                     : std::make_unique<GPT2Decoder>(w.config, w.params.data());
            Utf8Stream text;
            std::fwrite(sample_prompt.data(), 1, sample_prompt.size(), stdout);
            const std::vector<int> out = generate(*dec, prompt, sample_opt, [&](int t) {
                const std::string s = text.push(tok.decode(&t, 1));
                std::fwrite(s.data(), 1, s.size(), stdout);
                std::fflush(stdout);
            });
            const std::string rest = text.flush();
            std::fwrite(rest.data(), 1, rest.size(), stdout);
            std::printf("\n");
            if ((int)out.size() < sample_opt.max_tokens)
                std::fprintf(stderr, "codagpt: note: %zu of the %d tokens asked for: the model's context of %d positions "
                             "(max_seq_len) is full\n", out.size(), sample_opt.max_tokens, w.config.max_seq_len);
            return 0;
        }
#endif
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

int main(int argc, char** argv) {
    const int rc = run_main(argc, argv);
    // What a command printed (eval --json, sample's text, ...) is its result: a full disk must not
    // end it with 0.
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
        std::fprintf(stderr, "codagpt: error: cannot write standard output: %s\n", std::strerror(errno));
        return 1;
    }
    return rc;
}
