// The training program, top to bottom: pick the backend, build the model, the data loaders and
// the optimizer, then the step loop with logging and periodic evaluation.
#include "train.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "backend.hpp"
#include "common.hpp"
#include "data.hpp"
#include "device.hpp"
#include "fileio.hpp"
#include "optim_cpu.hpp"
#include "results.hpp"

namespace codagpt {
namespace fs = std::filesystem;

namespace {

// One JSON object per line; flushed per line so a killed run keeps every finished step.
class MetricsLog {
public:
    explicit MetricsLog(const fs::path& path) : f_(path, std::ios::trunc) {
        if (!f_) throw Error("cannot open metrics file " + path.string());
    }
    void write(const nlohmann::json& j) { f_ << j.dump() << '\n' << std::flush; }

private:
    std::ofstream f_;
};

std::unique_ptr<TrainBackend> make_backend(const TrainConfig& cfg, const TrainOptions& opt) {
    if (opt.device == "cpu" || (opt.device == "auto" && cuda_device_count() == 0)) return make_cpu_backend(cfg);
    if (opt.device == "auto" || opt.device == "cuda") return make_gpu_backend(cfg, GPUBackendOptions{opt.recompute == "gelu"});
    throw Error("--device must be auto, cpu or cuda, got '" + opt.device + "'");
}

// Mean loss over up to eval_batches batches of the validation data, from its beginning.
double evaluate(TrainBackend& model, DataLoader& val, int eval_batches, std::vector<int>& inputs,
                std::vector<int>& targets) {
    val.reset();
    const int n = (int)std::min<size_t>(eval_batches, val.windows_per_rank());
    double sum = 0;
    for (int i = 0; i < n; i++) {
        val.next_batch(inputs.data(), targets.data());
        sum += model.evaluate(inputs.data(), targets.data());
    }
    return sum / n;
}

double median(std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
}

}  // namespace

int run_train(const TrainConfig& cfg, const TrainOptions& opt) {
    validate(cfg);
    if (opt.recompute != "none" && opt.recompute != "gelu")
        throw Error("--recompute must be none or gelu, got '" + opt.recompute + "'");
    const ModelConfig& mc = cfg.model;
    const int B = cfg.batch_size, T = cfg.seq_len;
    const long tokens_per_step = (long)B * T * cfg.grad_accum;

    // ---- data first: bad shards fail before any memory is taken
    DataLoader train_data(cfg.train_data, B, T, /*rank=*/0, /*world=*/1, cfg.shuffle, cfg.seed, mc.vocab_size);
    DataLoader val_data(cfg.val_data, B, T, 0, 1, /*shuffle=*/false, cfg.seed, mc.vocab_size);

    // ---- model and optimizer on the chosen device
    std::unique_ptr<TrainBackend> model = make_backend(cfg, opt);
    const std::string gpu = model->device_memory_mib() >= 0 ? cuda_device_name() : "";
    // FLOPs per token of forward + backward: 6N for the weights, 6LCT for causal attention scores.
    const double flops_per_token = 6.0 * model->num_params() + 6.0 * mc.n_layer * mc.n_embd * T;
    const double peak = peak_bf16_flops(gpu);

    // ---- run directory: the resolved config and the metrics log
    fs::create_directories(cfg.out_dir);
    write_file_atomic((fs::path(cfg.out_dir) / "config.json").string(), config_to_json(cfg).dump(2) + "\n");
    MetricsLog metrics(fs::path(cfg.out_dir) / "metrics.jsonl");

    std::printf("codagpt train: %s | %s | %.2fM parameters | L=%d C=%d H=%d T=%d\n", cfg.name.c_str(),
                model->describe().c_str(), model->num_params() / 1e6, mc.n_layer, mc.n_embd, mc.n_head, T);
    std::printf("batch %d x %d x %d accum = %ld tokens/step | %zu train batches/epoch | %d steps | out %s\n", B, T,
                cfg.grad_accum, tokens_per_step, train_data.windows_per_rank(), cfg.steps, cfg.out_dir.c_str());

    std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
    auto eval_and_log = [&](int step) {
        const double val_loss = evaluate(*model, val_data, cfg.eval_batches, inputs, targets);
        std::printf("step %5d/%d | val loss %.4f\n", step, cfg.steps, val_loss);
        metrics.write({{"step", step}, {"val_loss", val_loss}});
        return val_loss;
    };

    // ---- the step loop
    using clock = std::chrono::steady_clock;
    double train_seconds = 0, last_loss = 0, memory_mib = -1;
    std::vector<double> step_ms;
    for (int step = 0; step < cfg.steps; step++) {
        if (cfg.eval_every > 0 && step % cfg.eval_every == 0) eval_and_log(step);

        const auto t0 = clock::now();
        model->zero_grad();
        double loss = 0;
        for (int micro = 0; micro < cfg.grad_accum; micro++) {
            train_data.next_batch(inputs.data(), targets.data());
            loss += model->forward_backward(inputs.data(), targets.data(), 1.0f / cfg.grad_accum);
        }
        loss /= cfg.grad_accum;
        const double lr = lr_at(cfg, step);
        const double norm = model->update(lr, cfg);  // synchronizes: the step's time is complete
        const double seconds = std::chrono::duration<double>(clock::now() - t0).count();

        if (!std::isfinite(loss)) throw Error("loss is not finite at step " + std::to_string(step + 1));
        train_seconds += seconds;
        step_ms.push_back(seconds * 1e3);
        last_loss = loss;
        if (step == std::min(cfg.steps - 1, 2)) memory_mib = model->device_memory_mib();
        const double tok_s = tokens_per_step / seconds;
        const double mfu = peak > 0 ? tok_s * flops_per_token / peak : 0;
        metrics.write({{"step", step + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm},
                       {"ms", seconds * 1e3}, {"tok_s", tok_s}});
        if (!opt.quiet && ((step + 1) % cfg.log_every == 0 || step + 1 == cfg.steps)) {
            std::printf("step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.1f ms | %.0f tok/s", step + 1, cfg.steps,
                        loss, lr, norm, seconds * 1e3, tok_s);
            if (peak > 0) std::printf(" | MFU %.1f%%", 100 * mfu);
            std::printf("\n");
        }
    }
    const double val_loss = eval_and_log(cfg.steps);
    std::printf("done: %d steps in %.1f s | final train loss %.4f | val loss %.4f | %.0f tok/s", cfg.steps,
                train_seconds, last_loss, val_loss, tokens_per_step * cfg.steps / train_seconds);
    if (memory_mib >= 0) std::printf(" | device memory %.0f MiB", memory_mib);
    std::printf("\n");

    if (!opt.bench_json.empty()) {
        // Steady state: the median step after the first few (allocation, caches, autotuning).
        const size_t skip = std::min<size_t>(3, step_ms.size() / 2);
        const double ms = median(std::vector<double>(step_ms.begin() + skip, step_ms.end()));
        const double tok_s = tokens_per_step / (ms / 1e3);
        nlohmann::json rec = {{"kind", "train"},
                              {"system", "codagpt"},
                              {"gpu", gpu.empty() ? nlohmann::json(nullptr) : nlohmann::json(gpu)},
                              {"backend", gpu.empty() ? "cpu" : "cuda"},
                              {"fusion", gpu.empty() ? nlohmann::json(nullptr) : nlohmann::json("unfused")},
                              {"recompute", opt.recompute},
                              {"model", cfg.name},
                              {"batch", B},
                              {"seq", T},
                              {"grad_accum", cfg.grad_accum},
                              {"nproc", 1},
                              {"tok_s", tok_s},
                              {"ms_step", ms},
                              {"mfu", peak > 0 ? nlohmann::json(tok_s * flops_per_token / peak) : nlohmann::json(nullptr)},
                              {"peak_mem_gib", memory_mib >= 0 ? nlohmann::json(memory_mib / 1024) : nlohmann::json(nullptr)},
                              {"train_loss", last_loss},
                              {"val_loss", val_loss},
                              {"steps", cfg.steps}};
        stamp_record(rec, opt.command);
        append_record(opt.bench_json, rec);
        std::printf("benchmark record appended to %s\n", opt.bench_json.c_str());
    }
    return 0;
}

}  // namespace codagpt
