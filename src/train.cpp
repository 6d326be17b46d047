// The training program, top to bottom: read the checkpoint to resume from (or the weights to start
// from), pick the backend, build the model, the data loaders and the optimizer, then the step loop
// with logging, periodic evaluation, samples and checkpoints.
#include "train.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <unistd.h>

#include "backend.hpp"
#include "checkpoint.hpp"
#include "common.hpp"
#include "data.hpp"
#include "data_parallel.hpp"
#include "device.hpp"
#include "dist_env.hpp"
#include "fileio.hpp"
#include "gpt2_params.hpp"
#include "interchange.hpp"
#include "kernel_trace.hpp"
#include "optim_cpu.hpp"
#include "outlier_window.hpp"
#include "rendezvous.hpp"
#include "results.hpp"
#include "sample.hpp"
#include "step_phases.hpp"
#include "tensor_dump.hpp"

namespace codagpt {
namespace fs = std::filesystem;

namespace {

// One JSON object per line; flushed per line so a killed run keeps every finished step.
// A resumed run (resume_step set) keeps the lines of the steps before its checkpoint and appends;
// lines a crashed run wrote after that checkpoint are dropped, as the resumed run redoes them.
class MetricsLog {
public:
    MetricsLog(const fs::path& path, std::optional<int> resume_step) : path_(path.string()) {
        if (resume_step) keep_lines_before(path, *resume_step);
        f_.open(path, resume_step ? std::ios::app : std::ios::trunc);
        if (!f_) throw Error("cannot open metrics file " + path_);
    }
    // Invalid UTF-8 (a sample may end inside a character) becomes U+FFFD instead of an exception.
    // A line that cannot be written (a full disk) stops the run: its log is its record.
    void write(const nlohmann::json& j) {
        f_ << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n' << std::flush;
        if (!f_) throw Error("cannot write metrics file " + path_ + " (disk full?)");
    }

private:
    // Keeps the training lines of steps <= step and the evaluation and sample lines of steps < step
    // (those at `step` are taken after the checkpoint, so the resumed run writes them).
    static void keep_lines_before(const fs::path& path, int step) {
        std::ifstream in(path);
        std::string kept;
        for (std::string line; std::getline(in, line);) {
            const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
            if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) continue;  // a torn last line
            const int s = j["step"].get<int>();
            if (s < step || (s == step && (j.contains("loss") || j.contains("skipped")))) kept += line + "\n";
        }
        write_file_atomic(path.string(), kept);
    }
    std::string path_;
    std::ofstream f_;
};

// SIGINT/SIGTERM set this; the step loop reads it after each step. Global because a signal
// handler can reach nothing else.
std::atomic<int> g_stop_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the signal handler needs a lock-free flag");

extern "C" void on_stop_signal(int sig) {
    // The first signal asks for a clean stop; a second one ends the process at once (the last
    // checkpoint on disk is intact: they are written atomically).
    if (g_stop_signal.exchange(sig) != 0) {
        std::signal(sig, SIG_DFL);
        std::raise(sig);
    }
}

// Installs the stop handlers for the life of a run and restores the previous ones after it.
class StopSignals {
public:
    StopSignals() {
        g_stop_signal = 0;
        struct sigaction sa {};
        sa.sa_handler = on_stop_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART;  // file reads and writes carry on; the loop notices at the step's end
        sigaction(SIGINT, &sa, &old_int_);
        sigaction(SIGTERM, &sa, &old_term_);
    }
    ~StopSignals() {
        sigaction(SIGINT, &old_int_, nullptr);
        sigaction(SIGTERM, &old_term_, nullptr);
    }
    StopSignals(const StopSignals&) = delete;
    StopSignals& operator=(const StopSignals&) = delete;
    int received() const { return g_stop_signal.load(); }

private:
    struct sigaction old_int_ {}, old_term_ {};
};

// --grad-norms: the L2 norm of each tensor's gradient (param_layout() order), a list over the
// layers for the layers' tensors.
nlohmann::json tensor_grad_norms(const std::vector<float>& grads, const std::vector<ParamInfo>& layout) {
    nlohmann::json out = nlohmann::json::object();
    size_t at = 0;
    for (const ParamInfo& p : layout) {
        const size_t per_layer = p.size / p.layers;
        std::vector<double> norms;
        for (int l = 0; l < p.layers; l++, at += per_layer) {
            double sum = 0;
            for (size_t i = at; i < at + per_layer; i++) sum += (double)grads[i] * grads[i];
            norms.push_back(std::sqrt(sum));
        }
        out[p.name] = p.layers == 1 ? nlohmann::json(norms[0]) : nlohmann::json(norms);
    }
    if (at != grads.size())
        throw Error("--grad-norms: " + std::to_string(grads.size()) + " gradients for a layout of " + std::to_string(at));
    return out;
}

// dp: this process's rank of a data-parallel job (GPU only), or null.
std::unique_ptr<TrainBackend> make_backend(const TrainConfig& cfg, const std::string& device, const std::string& fusion,
                                           const GPUBackendOptions& gpu, const std::shared_ptr<DataParallel>& dp) {
    if (use_gpu(device)) return use_coda(fusion) ? make_coda_gpu_backend(cfg, gpu, dp) : make_gpu_backend(cfg, gpu, dp);
    return make_cpu_backend(cfg);
}

// Per-rank values summed over the ranks of `dp` in rank order (the same bits on every rank and run
// to run); the values themselves for a single process.
std::vector<double> sum_over_ranks(DataParallel* dp, const std::vector<double>& values) {
    if (!dp) return values;
    const std::vector<double> all = dp->all_gather(values);
    std::vector<double> sum(values.size(), 0.0);
    for (size_t i = 0; i < all.size(); i++) sum[i % values.size()] += all[i];
    return sum;
}

// The model keys in which a weights file's model differs from a config's: "n_embd 32 (config 64), ...";
// empty when they agree.
std::string model_differences(const ModelConfig& file, const ModelConfig& config) {
    std::string diff;
    auto compare = [&](const char* key, int f, int c) {
        if (f != c)
            diff += std::string(diff.empty() ? "" : ", ") + key + " " + std::to_string(f) + " (config " +
                    std::to_string(c) + ")";
    };
    compare("n_layer", file.n_layer, config.n_layer);
    compare("n_head", file.n_head, config.n_head);
    compare("n_embd", file.n_embd, config.n_embd);
    compare("max_seq_len", file.max_seq_len, config.max_seq_len);
    compare("vocab_size", file.vocab_size, config.vocab_size);
    return diff;
}

// Weights for --init-from: any weights file, of exactly the config's model shape.
ModelWeights load_init_weights(const std::string& path, const ModelConfig& mc) {
    ModelWeights w = load_weights(path);
    const std::string diff = model_differences(w.config, mc);
    if (!diff.empty())
        throw Error("--init-from " + path + ": the file's model does not match the config's: " + diff +
                    "; set these config keys to the file's values");
    return w;
}

// The ids as text, for samples when no tokenizer decodes them.
std::string token_ids_text(const std::vector<int>& tokens) {
    std::string s;
    for (int t : tokens) s += (s.empty() ? "" : " ") + std::to_string(t);
    return s;
}

// Mean loss over up to eval_batches batches of this rank's share of the validation data, from its
// beginning, averaged over the ranks.
double evaluate(TrainBackend& model, DataLoader& val, int eval_batches, std::vector<int>& inputs,
                std::vector<int>& targets, DataParallel* dp) {
    val.reset();
    const int n = (int)std::min<size_t>(eval_batches, val.windows_per_rank());
    double sum = 0;
    for (int i = 0; i < n; i++) {
        val.next_batch(inputs.data(), targets.data());
        sum += model.evaluate(inputs.data(), targets.data());
    }
    return sum_over_ranks(dp, {sum / n})[0] / (dp ? dp->world_size() : 1);
}

// The items of the config's hellaswag_data (none where it is empty), read with the tokenizer of
// `text` and checked against micro-batches of cfg's seq_len before anything runs.
std::vector<ChoiceItem> configured_hellaswag(const TrainConfig& cfg, const SampleText& text) {
    if (cfg.hellaswag_data.empty()) return {};
    if (!text.encode) throw Error("hellaswag_data: this build has no tokenizer to encode it");
    std::vector<ChoiceItem> items = read_hellaswag(cfg.hellaswag_data, text.encode, cfg.hellaswag_items);
    check_choices(items, cfg.seq_len, cfg.model.vocab_size);
    return items;
}

// "1h02m", "3m07s", "12s": what is left of the run, for the live line.
std::string duration_text(double seconds) {
    const long s = std::lround(std::max(0.0, seconds));
    char buf[32];
    if (s >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, s / 60 % 60);
    else if (s >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
    else std::snprintf(buf, sizeof buf, "%lds", s);
    return buf;
}

}  // namespace

int run_train(const TrainConfig& cfg, const TrainOptions& opt) {
    validate(cfg);
    const Recompute recompute = parse_recompute(opt.recompute);  // refused before anything runs
    const ModelConfig& mc = cfg.model;
    if (opt.recompute_layers != 0) {
        if (recompute == Recompute::none)
            throw Error("--recompute-layers needs --recompute gelu or mlp: it limits their recomputation to the first layers");
        if (opt.recompute_layers < 1 || opt.recompute_layers > mc.n_layer)
            throw Error("--recompute-layers must be between 1 and n_layer " + std::to_string(mc.n_layer) + ", got " +
                        std::to_string(opt.recompute_layers));
    }
    if (opt.lm_head_chunks != 0 && !use_gpu(opt.device))
        throw Error("--lm-head-chunks applies to the fused GPU path (--fusion coda), not the CPU reference");
    if (opt.nondeterministic_attention && !use_gpu(opt.device))
        throw Error("--nondeterministic-attention applies to the GPU paths, not the CPU reference");
    const int B = cfg.batch_size, T = cfg.seq_len;
    if (opt.stop_after < 0) throw Error("--stop-after must be >= 0, got " + std::to_string(opt.stop_after));
    if (!opt.init_from.empty() && !opt.resume.empty())
        throw Error("--init-from and --resume exclude each other: --resume continues a run, --init-from starts one "
                    "from other weights");

    if (!opt.trace_kernels.empty() && !use_gpu(opt.device))
        throw Error("--trace-kernels lists GPU kernels: it needs a GPU run (--device cuda or auto with a GPU)");
    if (opt.phase_times && !use_gpu(opt.device))
        throw Error("--phase-times times CUDA streams: it needs a GPU run (--device cuda or auto with a GPU)");
    // The record is appended at the end of the run: a file it could not go into is refused now.
    if (!opt.bench_json.empty()) read_records(opt.bench_json);
    const bool dumps = check_dump_env();
    // ---- ranks: one process, or one of several started by the launcher, srun or mpirun. A rank of
    // a job, and the one worker of `--nproc-per-node 1` (the same path on one GPU), trains data
    // parallel over NCCL: it joins the rendezvous (which also tells a launcher that start-up went
    // well) and the communicator on GPU local_rank. Rank 0 alone logs and writes files.
    const DistContext dist = dist_context_from_env();
    std::shared_ptr<DataParallel> dp;
    if (dist.world_size > 1 || dist.ready_fd >= 0) {
        if (!use_gpu(opt.device))
            throw Error("rank " + std::to_string(dist.rank) + " of " + std::to_string(dist.world_size) +
                        ": data-parallel training runs on GPUs (NCCL); the CPU reference trains in one process");
        if (opt.grad_norms)
            throw Error("--grad-norms: one process only (a data-parallel rank holds the reduced gradients of its "
                        "shard alone)");
        if (dumps) throw Error("CODAGPT_DUMP: one process only (every rank would write the same files)");
        dp = make_data_parallel(dist, mc);
    }
    const int ranks = dist.world_size;
    const bool lead = dist.rank == 0;
    const bool quiet = opt.quiet || !lead;
    const long tokens_per_step = (long)ranks * B * T * cfg.grad_accum;

    // ---- the checkpoint to resume from, or the weights to start from, read and checked before
    // anything is written
    std::optional<Checkpoint> resume;
    std::string resume_path;
    // auto: latest where out_dir holds a checkpoint, else a new run
    const std::string resume_from =
        opt.resume == "auto" ? (list_checkpoints(cfg.out_dir).empty() ? "" : "latest") : opt.resume;
    if (!resume_from.empty()) {
        resume_path = resume_from == "latest" ? latest_checkpoint(cfg.out_dir) : resume_from;
        resume = load_checkpoint(resume_path);
        check_resumable(*resume, cfg, resume_path);
    }
    // The run folder must hold this run's past only (check_run_folder); the checkpoints after the
    // one resumed from are set aside when the run starts writing.
    const std::string metrics_path = (fs::path(cfg.out_dir) / "metrics.jsonl").string();
    const std::vector<CheckpointFile> later_checkpoints =
        check_run_folder(cfg.out_dir, metrics_path, resume_path, resume ? std::optional<int>(resume->step) : std::nullopt);
    const int first_step = resume ? resume->step : 0;
    // A step the run resumes past would never come: refused rather than running to cfg.steps.
    if (opt.stop_after > 0 && opt.stop_after <= first_step)
        throw Error("--stop-after " + std::to_string(opt.stop_after) + " is not after step " +
                    std::to_string(first_step) + ", where " + resume_path +
                    " resumes (it counts steps from the run's start)");
    std::optional<ModelWeights> init;
    if (!opt.init_from.empty()) init = load_init_weights(opt.init_from, mc);

    // ---- data: bad shards fail before any memory is taken
    DataLoader train_data(cfg.train_data, B, T, dist.rank, ranks, cfg.shuffle, cfg.seed, mc.vocab_size, cfg.grad_accum);
    DataLoader val_data(cfg.val_data, B, T, dist.rank, ranks, /*shuffle=*/false, cfg.seed, mc.vocab_size);
    if (resume) train_data.set_state(loader_state_for(*resume, ranks, cfg.grad_accum, train_data.windows_per_rank()));
    std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);

    // ---- samples and HellaSwag: the text codec, the prompt's tokens and the items, checked before
    // anything is written
    SampleText text;
    if ((cfg.sample_every > 0 || !cfg.hellaswag_data.empty()) && opt.sample_text) text = opt.sample_text();
    std::vector<int> sample_prompt;
    if (cfg.sample_every > 0) {
        if (cfg.sample_prompt.empty()) {
            val_data.next_batch(inputs.data(), targets.data());
            sample_prompt = {inputs[0]};
            val_data.reset();
        } else {
            if (!text.encode)
                throw Error("sample_prompt: this build has no tokenizer to encode it; leave it empty (samples then "
                            "start from the first validation token)");
            sample_prompt = text.encode(cfg.sample_prompt);
        }
        if ((int)sample_prompt.size() > mc.max_seq_len)
            throw Error("sample_prompt: " + std::to_string(sample_prompt.size()) + " tokens, more than max_seq_len (" +
                        std::to_string(mc.max_seq_len) + ")");
        for (int t : sample_prompt)
            if (t >= mc.vocab_size)
                throw Error("sample_prompt: token id " + std::to_string(t) + " outside the vocabulary of " +
                            std::to_string(mc.vocab_size));
    }
    // This rank's share of the HellaSwag items (every ranks-th from its own), scored at each evaluation.
    std::vector<ChoiceItem> hellaswag;
    size_t hellaswag_total = 0;
    {
        std::vector<ChoiceItem> all = configured_hellaswag(cfg, text);
        hellaswag_total = all.size();
        for (size_t i = dist.rank; i < all.size(); i += ranks) hellaswag.push_back(std::move(all[i]));
    }

    // ---- model and optimizer on the chosen device (weights, moments and step from the checkpoint;
    // weights only from --init-from)
    std::unique_ptr<TrainBackend> model =
        make_backend(cfg, opt.device, opt.fusion,
                     GPUBackendOptions{recompute, opt.recompute_layers, opt.lm_head_chunks, !opt.nondeterministic_attention},
                     dp);
    if (opt.wrap_backend) model = opt.wrap_backend(std::move(model));
    if (opt.phase_times) model->time_phases();
    if (resume) {
        model->load_state(resume->state);
        resume->state = TrainState{};  // the host copy is no longer needed
    }
    if (init) {
        model->load_params(init->params);
        init->params = std::vector<float>{};
    }
    // Allocated now, so that a GPU without room for the KV cache fails at start-up, not mid-run.
    // Samples are rank 0's (the weights are the same on every rank).
    const std::unique_ptr<Decoder> sampler = cfg.sample_every > 0 && lead ? model->make_decoder() : nullptr;
    const std::string gpu = model->device_memory_mib() >= 0 ? cuda_device_name() : "";
    // The lead rank's GPU energy a step (null where NVML or its counter is missing).
    const std::unique_ptr<GpuEnergy> energy = lead && !gpu.empty() ? GpuEnergy::open() : nullptr;
    std::optional<StepEnergy> step_energy;
    if (energy)
        step_energy.emplace([&] { return energy->joules(); }, StepEnergy::Clock::now,
                            [&] { return energy->new_sm_clock_samples(); });
    // FLOPs per token of forward + backward: 6N for the weights, 6LCT for causal attention scores.
    const double flops_per_token = 6.0 * model->num_params() + 6.0 * mc.n_layer * mc.n_embd * T;
    const double peak = peak_bf16_flops(gpu) * ranks;  // MFU of the job: one GPU per rank

    // ---- run directory: the resolved config and the metrics log (rank 0's)
    std::optional<MetricsLog> metrics;
    if (lead) {
        create_folders(cfg.out_dir);
        // A run resumed from an earlier checkpoint than the folder's newest leaves the steps after it:
        // their checkpoints are moved aside (not deleted), so that --resume latest finds this run's.
        for (const CheckpointFile& c : later_checkpoints) {
            const std::string aside = set_aside(c.path);
            std::fprintf(stderr, "codagpt: note: resuming at step %d: %s, of the steps this run redoes, moved to %s\n",
                         first_step, c.path.c_str(), aside.c_str());
        }
        // The folders of the files written late in the run, made now (a failure costs no steps).
        if (!opt.trace_kernels.empty()) create_parent_folders(opt.trace_kernels);
        if (!opt.bench_json.empty()) create_parent_folders(opt.bench_json);
        write_file_atomic((fs::path(cfg.out_dir) / "config.json").string(), config_to_json(cfg).dump(2) + "\n");
        metrics.emplace(metrics_path, resume ? std::optional<int>(first_step) : std::nullopt);
    }
    auto record = [&](const nlohmann::json& j) {
        if (metrics) metrics->write(j);
    };

    if (!quiet) {
        std::printf("codagpt train: %s | %s | %.2fM parameters | L=%d C=%d H=%d T=%d\n", cfg.name.c_str(),
                    model->describe().c_str(), model->num_params() / 1e6, mc.n_layer, mc.n_embd, mc.n_head, T);
        std::printf("batch %d x %d x %d accum", B, T, cfg.grad_accum);
        if (dp) std::printf(" x %d ranks", ranks);
        std::printf(" = %ld tokens/step | %zu train batches/epoch%s | %d steps | out %s\n", tokens_per_step,
                    train_data.windows_per_rank(), dp ? " per rank" : "", cfg.steps, cfg.out_dir.c_str());
        if (resume) std::printf("resumed from %s at step %d\n", resume_path.c_str(), first_step);
        if (init) std::printf("initialized from %s (step 0, fresh optimizer)\n", opt.init_from.c_str());
    }

    // Output: a terminal gets one progress line rewritten in place (\r); logs get a line per
    // log_every steps. Any other line first clears the progress line, which the next step redraws.
    const bool live = !quiet && (opt.live || isatty(STDOUT_FILENO));
    bool live_shown = false;
    auto clear_live = [&] {
        if (live_shown) std::printf("\r\033[K");
        live_shown = false;
    };

    auto eval_and_log = [&](int step) {
        const double val_loss = evaluate(*model, val_data, cfg.eval_batches, inputs, targets, dp.get());
        nlohmann::json line = {{"step", step}, {"val_loss", val_loss}};
        char hellaswag_text[64] = "";
        if (hellaswag_total > 0) {
            const ChoiceScore s = score_choices(*model, B, T, mc.vocab_size, hellaswag);
            const std::vector<double> correct =
                sum_over_ranks(dp.get(), {double(s.correct_mean), double(s.correct_sum)});  // every rank's items
            ChoiceScore all;
            all.items = hellaswag_total;
            all.correct_mean = (size_t)correct[0];
            all.correct_sum = (size_t)correct[1];
            line["hellaswag_acc_norm"] = all.acc_norm();
            line["hellaswag_acc"] = all.acc();
            std::snprintf(hellaswag_text, sizeof hellaswag_text, " | hellaswag acc_norm %.4f", all.acc_norm());
        }
        clear_live();
        if (lead) std::printf("step %5d/%d | val loss %.4f%s\n", step, cfg.steps, val_loss, hellaswag_text);
        record(line);
        return val_loss;
    };
    // The same draws every time (Rng(seed), temperature 1, whole vocabulary): samples differ only
    // through the weights, and the training's own randomness is untouched.
    auto sample_and_log = [&](int step) {
        if (!sampler) return;
        const SampleOptions so{cfg.sample_tokens, /*temperature=*/1.0, /*top_k=*/0, cfg.seed};
        const std::vector<int> tokens = generate(*sampler, sample_prompt, so);
        const std::string sample = text.decode ? text.decode(tokens) : token_ids_text(tokens);
        clear_live();
        if (!quiet)
            std::printf("step %5d/%d | sample%s: %s%s\n", step, cfg.steps, text.decode ? "" : " (token ids)",
                        cfg.sample_prompt.c_str(), sample.c_str());
        record({{"step", step}, {"sample", sample}, {"sample_tokens", tokens}});
    };

    // The outlier guard's recent losses and gradient norms, as they stood at the checkpoint.
    OutlierWindow loss_window(cfg.outlier_window), norm_window(cfg.outlier_window);
    // max_bad_steps: the non-finite steps skipped in a row, counted on across a resume.
    int bad_in_a_row = resume ? resume->bad_steps_in_a_row : 0;
    if (resume) {
        loss_window.restore(resume->loss_window);
        norm_window.restore(resume->grad_norm_window);
    }

    using clock = std::chrono::steady_clock;
    // Everything the next step depends on: weights, AdamW state, data position. Not timed as training.
    // Every rank takes part (the ZeRO-1 shards are gathered to rank 0), rank 0 writes.
    auto save_checkpoint_at = [&](int steps_done) {
        const auto t0 = clock::now();
        const std::string path = checkpoint_path(cfg.out_dir, steps_done);
        Checkpoint ck{cfg, steps_done, train_data.state(), model->save_state(), ranks, loss_window.values(),
                      norm_window.values(), bad_in_a_row};
        if (!lead) return;
        save_checkpoint(path, ck);
        prune_checkpoints(cfg.out_dir, steps_done, cfg.ckpt_keep);
        clear_live();
        if (!quiet)
            std::printf("checkpoint %s (%.1f MiB, %.2f s)\n", path.c_str(), ck.state.params.size() * 12.0 / (1 << 20),
                        std::chrono::duration<double>(clock::now() - t0).count());
    };

    // ---- the step loop
    StopSignals signals;
    double train_seconds = 0, last_loss = 0, memory_mib = -1;
    std::vector<double> step_ms;
    // Work other than training steps: step_energy reads afresh before the next step.
    const auto not_a_step = [&] {
        if (step_energy) step_energy->interrupt();
    };
    std::vector<StepPhases> phases;  // --phase-times: each updated step's
    // --grad-norms: each tensor's gradient norm of the step just run, outside its clock.
    const std::vector<ParamInfo> layout = opt.grad_norms ? param_layout(cfg.model) : std::vector<ParamInfo>{};
    const auto add_grad_norms = [&](nlohmann::json& line) {
        if (opt.grad_norms) line["grad_norms"] = tensor_grad_norms(model->gradients(), layout);
    };
    double avg_seconds = 0;  // for the live line
    // --trace-kernels: the last step this run takes (of cfg.steps, or --stop-after's), a steady one
    // (the first sets up libraries and caches; the GPU's clocks settle under its power limit).
    const bool stops_early = opt.stop_after > first_step && opt.stop_after < cfg.steps;
    const int traced_step = (stops_early ? opt.stop_after : cfg.steps) - 1;
    for (int step = first_step; step < cfg.steps; step++) {
        if (cfg.eval_every > 0 && step % cfg.eval_every == 0) {
            eval_and_log(step);
            not_a_step();
        }
        if (cfg.sample_every > 0 && step % cfg.sample_every == 0) {
            sample_and_log(step);
            not_a_step();
        }

        const bool trace = !opt.trace_kernels.empty() && step == traced_step;
        std::vector<TracedKernel> traced;
        auto traced_run = [&](const std::function<void()>& f) {
            if (!trace) return f();
            for (TracedKernel& k : trace_kernels(f)) traced.push_back(std::move(k));
        };
        if (step_energy) step_energy->before_step();  // outside the clock; the GPU is idle: the last step synchronized
        const auto t0 = clock::now();
        double loss = 0;
        traced_run([&] {
            model->zero_grad();
            for (int micro = 0; micro < cfg.grad_accum; micro++) {
                train_data.next_batch(inputs.data(), targets.data());
                loss += model->forward_backward(inputs.data(), targets.data(), 1.0f / cfg.grad_accum);
            }
        });
        loss /= cfg.grad_accum;
        loss = sum_over_ranks(dp.get(), {loss})[0] / ranks;  // the global batch's mean
        const double lr = lr_at(cfg, step);
        double norm = 0;
        traced_run([&] { norm = model->grad_norm(); });  // synchronizes
        // Guards: a non-finite loss or norm would poison the weights and AdamW moments for good, so
        // the step is skipped (data and schedule move on); a run that keeps producing them stops.
        // An outlier (skip_loss_z, skip_grad_z: a spike above the recent steps) is skipped too.
        const char* bad = !std::isfinite(loss) ? "non-finite loss" : !std::isfinite(norm) ? "non-finite grad norm" : nullptr;
        struct Outlier {
            const char* what;
            double z, limit;
        };
        std::optional<Outlier> outlier;
        if (!bad) {
            const double z_loss = loss_window.z(loss), z_norm = norm_window.z(norm);
            loss_window.push(loss);
            norm_window.push(norm);
            if (cfg.skip_loss_z > 0 && z_loss > cfg.skip_loss_z)
                outlier = Outlier{"loss outlier", z_loss, cfg.skip_loss_z};
            else if (cfg.skip_grad_z > 0 && z_norm > cfg.skip_grad_z)
                outlier = Outlier{"grad norm outlier", z_norm, cfg.skip_grad_z};
        }
        if (bad || outlier) {
            nlohmann::json line = {{"step", step + 1}, {"skipped", bad ? bad : outlier->what}};
            if (outlier) line.update({{"loss", loss}, {"grad_norm", norm}, {"z", outlier->z}});
            add_grad_norms(line);  // before they are zeroed
            model->zero_grad();
            not_a_step();
            record(line);
            clear_live();
            if (outlier) {
                bad_in_a_row = 0;  // a finite step
                if (lead)
                    std::printf("step %5d/%d | skipped: %s (loss %.4f, norm %.3f: z %.1f over the last %d steps, above "
                                "%g), no update\n", step + 1, cfg.steps, outlier->what, loss, norm, outlier->z,
                                cfg.outlier_window, outlier->limit);
            } else {
                bad_in_a_row++;
                if (lead)
                    std::printf("step %5d/%d | skipped: %s (loss %g, norm %g), no update | %d of max_bad_steps %d in a "
                                "row\n", step + 1, cfg.steps, bad, loss, norm, bad_in_a_row, cfg.max_bad_steps);
            }
            std::fflush(stdout);
            if (bad_in_a_row >= cfg.max_bad_steps)
                throw Error("stopping at step " + std::to_string(step + 1) + ": " + std::to_string(bad_in_a_row) +
                            " steps in a row had a non-finite loss or gradient norm (max_bad_steps " +
                            std::to_string(cfg.max_bad_steps) + "); lower lr, check the data, or resume from an " +
                            "earlier checkpoint");
        } else {
            bad_in_a_row = 0;
            traced_run([&] { model->apply_update(lr, norm, cfg); });  // synchronizes: the step's time is complete
            const double seconds = std::chrono::duration<double>(clock::now() - t0).count();
            train_seconds += seconds;
            step_ms.push_back(seconds * 1e3);
            if (step_energy) step_energy->after_step();
            last_loss = loss;
            if (step == std::min(cfg.steps - 1, first_step + 2)) memory_mib = model->device_memory_mib();
            const double tok_s = tokens_per_step / seconds;
            const double mfu = peak > 0 ? tok_s * flops_per_token / peak : 0;
            nlohmann::json line = {{"step", step + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm},
                                   {"ms", seconds * 1e3}, {"tok_s", tok_s}};
            add_grad_norms(line);  // the update read the gradients and left them as they were
            if (opt.phase_times) {
                phases.push_back(model->phases());  // its events are complete: apply_update synchronized
                line["phase_ms"] = phases_json(phases.back(), dp != nullptr);
            }
            record(line);
            if (live) {
                // Throughput and ETA from a moving average of step times: steadier than one step's.
                avg_seconds = step_ms.size() == 1 ? seconds : 0.9 * avg_seconds + 0.1 * seconds;
                const double avg_tok_s = tokens_per_step / avg_seconds;
                std::printf("\rstep %d/%d | loss %.4f | lr %.2e | %.0f tok/s", step + 1, cfg.steps, loss, lr, avg_tok_s);
                if (peak > 0) std::printf(" | MFU %.1f%%", 100 * avg_tok_s * flops_per_token / peak);
                if (memory_mib >= 0) std::printf(" | mem %.0f MiB", memory_mib);
                std::printf(" | ETA %s\033[K", duration_text(avg_seconds * (cfg.steps - step - 1)).c_str());
                std::fflush(stdout);
                live_shown = true;
            } else if (!quiet && ((step + 1) % cfg.log_every == 0 || step + 1 == cfg.steps)) {
                std::printf("step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.1f ms | %.0f tok/s", step + 1, cfg.steps,
                            loss, lr, norm, seconds * 1e3, tok_s);
                if (peak > 0) std::printf(" | MFU %.1f%%", 100 * mfu);
                std::printf("\n");
            }
        }

        if (trace && lead) {
            // The launches in order with their times and the GPU's idle time before each, then
            // where the step's kernel time went.
            std::string lines;
            char ms[48];
            for (const TracedKernel& k : traced) {
                std::snprintf(ms, sizeof ms, "%9.3f ms %8.3f idle  ", k.ms, k.idle_ms);
                lines += ms + k.name + "\n";
            }
            const std::string table = kernel_time_table(traced);
            write_file_atomic(opt.trace_kernels, lines + "\n" + table);
            std::printf("kernels of step %d (%zu launches) written to %s; kernel time by kernel:\n%s", step + 1,
                        traced.size(), opt.trace_kernels.c_str(), table.c_str());
        }
        report_progress();  // to a launcher's watchdog (--hang-timeout)
        const int done = step + 1;
        // A signal reaches the ranks at different moments: the job stops after the step in which
        // any rank got one, all ranks together (the checkpoint is collective).
        int stop_signal = signals.received();
        if (dp)
            for (double sig : dp->all_gather({(double)stop_signal}))  // the first rank's that got one
                if (sig != 0) {
                    stop_signal = (int)sig;
                    break;
                }
        const bool stop = stop_signal != 0 || (done == opt.stop_after && done < cfg.steps);
        if (stop || (cfg.ckpt_every > 0 && (done % cfg.ckpt_every == 0 || done == cfg.steps))) {
            save_checkpoint_at(done);
            not_a_step();
        }
        if (stop) {
            clear_live();
            if (lead)
                std::printf("stopped after step %d/%d (%s): continue with --resume latest\n", done, cfg.steps,
                            stop_signal == SIGINT ? "SIGINT" : stop_signal == SIGTERM ? "SIGTERM" : "--stop-after");
            return 0;
        }
    }
    const int steps_run = (int)step_ms.size();
    const double val_loss = eval_and_log(cfg.steps);
    if (cfg.sample_every > 0) sample_and_log(cfg.steps);
    if (!lead) return 0;
    // Steady state: the steps after the first few (allocation, caches, autotuning).
    const size_t skip = std::min<size_t>(3, step_ms.size() / 2);
    // The GPU's energy a steady step and its mean power over those steps (NaN where unmeasured).
    const StepEnergy::Summary steady_energy = step_energy ? step_energy->summary(skip) : StepEnergy::Summary{};
    const double energy_j_step = steady_energy.joules_per_step, power_w = steady_energy.watts,
                 sm_clock_mhz = steady_energy.sm_clock_mhz;
    const double power_limit_w = energy ? energy->power_limit_w() : -1;
    if (steps_run > 0)
        std::printf("done: %d steps in %.1f s | final train loss %.4f | val loss %.4f | %.0f tok/s", steps_run,
                    train_seconds, last_loss, val_loss, tokens_per_step * steps_run / train_seconds);
    else  // resumed at its last step
        std::printf("done: no step left (resumed at step %d of %d) | val loss %.4f", first_step, cfg.steps, val_loss);
    if (memory_mib >= 0) std::printf(" | device memory %.0f MiB", memory_mib);
    if (std::isfinite(energy_j_step)) {
        std::printf(" | %.1f J/step at %.0f W", energy_j_step, power_w);
        if (power_limit_w > 0) std::printf(" (limit %.0f W)", power_limit_w);
        if (std::isfinite(sm_clock_mhz)) std::printf(", SM clock %.0f MHz", sm_clock_mhz);
    }
    std::printf("\n");
    nlohmann::json phase_json;  // --phase-times: steady-state medians, after the first two steps
    if (!phases.empty()) {
        const size_t skip = std::min<size_t>(2, phases.size() / 2);
        const StepPhases ms = median_phases(phases, skip);
        std::printf("phase medians over %zu steps (ms): %s\n", phases.size() - skip, phases_text(ms, dp != nullptr).c_str());
        phase_json = phases_json(ms, dp != nullptr);
    }

    if (!opt.bench_json.empty() && !step_ms.empty()) {
        const double ms = median(std::vector<double>(step_ms.begin() + skip, step_ms.end()));
        const double tok_s = tokens_per_step / (ms / 1e3);
        nlohmann::json rec = {{"kind", "train"},
                              {"system", "codagpt"},
                              {"gpu", gpu.empty() ? nlohmann::json(nullptr) : nlohmann::json(gpu)},
                              {"backend", gpu.empty() ? "cpu" : "cuda"},
                              {"fusion", gpu.empty() ? nlohmann::json(nullptr) : nlohmann::json(use_coda(opt.fusion) ? "coda" : "unfused")},
                              {"recompute", opt.recompute},
                              {"recompute_layers", recomputed_layers(recompute, opt.recompute_layers, mc.n_layer)},
                              {"deterministic_attention", !opt.nondeterministic_attention},
                              {"model", cfg.name},
                              {"batch", B},
                              {"seq", T},
                              {"grad_accum", cfg.grad_accum},
                              {"nproc", ranks},
                              {"tok_s", tok_s},
                              {"ms_step", ms},
                              {"mfu", peak > 0 ? nlohmann::json(tok_s * flops_per_token / peak) : nlohmann::json(nullptr)},
                              {"peak_mem_gib", memory_mib >= 0 ? nlohmann::json(memory_mib / 1024) : nlohmann::json(nullptr)},
                              {"train_loss", last_loss},
                              {"val_loss", val_loss},
                              {"steps", cfg.steps}};
        if (!phase_json.is_null()) rec["phase_ms"] = phase_json;
        if (std::isfinite(energy_j_step)) {
            rec["energy_j_step"] = energy_j_step;  // the lead rank's GPU
            rec["power_w"] = power_w;
            rec["power_limit_w"] = power_limit_w > 0 ? nlohmann::json(power_limit_w) : nlohmann::json(nullptr);
            // the median SM clock (sampled every 20 ms) over the same steps, and how many samples
            rec["sm_clock_mhz"] = std::isfinite(sm_clock_mhz) ? nlohmann::json(sm_clock_mhz) : nlohmann::json(nullptr);
            rec["sm_clock_samples"] = steady_energy.clock_samples;
        }
        stamp_record(rec, opt.command);
        append_record(opt.bench_json, rec);
        std::printf("benchmark record appended to %s\n", opt.bench_json.c_str());
    }
    return 0;
}

EvalResult run_eval(const EvalOptions& opt) {
    // The weights, and a checkpoint's run config with them (one read of the file)
    ModelWeights w;
    std::optional<TrainConfig> run_config;
    if (detect_weights_format(opt.weights) == WeightsFormat::checkpoint) {
        Checkpoint ck = load_checkpoint(opt.weights);
        run_config = ck.config;
        w = {ck.config.model, std::move(ck.state.params)};
    } else {
        w = load_weights(opt.weights);
    }
    EvalResult r;
    TrainConfig& cfg = r.config;
    cfg = !opt.config.empty() ? load_config(opt.config) : run_config ? *run_config : load_config("gpt2-tiny");
    cfg.model = w.config;  // before the overrides, which validate seq_len against it
    try {
        apply_overrides(cfg, opt.overrides);
        validate(cfg);
    } catch (const Error& e) {
        throw Error(std::string(e.what()) + " (evaluating " + opt.weights + ", whose weights set the model keys)");
    }
    const std::string diff = model_differences(w.config, cfg.model);
    if (!diff.empty())
        throw Error("eval: the options contradict the model of " + opt.weights + ": " + diff +
                    " (its shape comes from the weights: leave those keys out)");
    const std::vector<ChoiceItem> hellaswag =
        configured_hellaswag(cfg, !cfg.hellaswag_data.empty() && opt.sample_text ? opt.sample_text() : SampleText{});

    DataLoader val(cfg.val_data, cfg.batch_size, cfg.seq_len, 0, 1, /*shuffle=*/false, cfg.seed, cfg.model.vocab_size);
    r.batches = opt.all ? (int)val.windows_per_rank() : (int)std::min<size_t>(cfg.eval_batches, val.windows_per_rank());
    std::unique_ptr<TrainBackend> model = make_backend(cfg, opt.device, opt.fusion, GPUBackendOptions{}, nullptr);
    model->load_params(w.params);
    r.backend = model->describe();
    std::vector<int> inputs((size_t)cfg.batch_size * cfg.seq_len), targets(inputs.size());
    const auto t0 = std::chrono::steady_clock::now();
    r.val_loss = evaluate(*model, val, r.batches, inputs, targets, nullptr);
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!hellaswag.empty()) {
        const auto t1 = std::chrono::steady_clock::now();
        r.hellaswag = score_choices(*model, cfg.batch_size, cfg.seq_len, cfg.model.vocab_size, hellaswag);
        r.hellaswag_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    }
    return r;
}

}  // namespace codagpt
