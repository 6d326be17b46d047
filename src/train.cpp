// The training program, top to bottom: pick the backend, build the model, the data loaders and
// the optimizer, then the step loop with logging and periodic evaluation.
#include "train.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <omp.h>

#include "common.hpp"
#include "data.hpp"
#include "device.hpp"
#include "fileio.hpp"
#include "model_cpu.hpp"
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

std::string choose_backend(const std::string& device) {
    if (device != "auto" && device != "cpu" && device != "cuda")
        throw Error("--device must be auto, cpu or cuda, got '" + device + "'");
    const int gpus = cuda_device_count();
    if (device == "cuda")
        throw Error(gpus == 0 ? "--device cuda: no CUDA GPU is visible"
                              : "--device cuda: this build has no GPU trainer yet; use --device cpu");
    if (device == "auto" && gpus > 0)
        std::printf("GPU %s found, but this build has no GPU trainer yet: running the CPU reference\n",
                    cuda_device_name().c_str());
    return "cpu";
}

// Mean loss over up to eval_batches batches of the validation data, from its beginning.
double evaluate(GPT2CPU<float>& model, DataLoader& val, int eval_batches, std::vector<int>& inputs,
                std::vector<int>& targets) {
    val.reset();
    const int n = (int)std::min<size_t>(eval_batches, val.windows_per_rank());
    double sum = 0;
    for (int i = 0; i < n; i++) {
        val.next_batch(inputs.data(), targets.data());
        sum += model.forward(inputs.data(), targets.data(), val.B(), val.T());
    }
    return sum / n;
}

}  // namespace

int run_train(const TrainConfig& cfg, const TrainOptions& opt) {
    validate(cfg);
    const std::string backend = choose_backend(opt.device);
    const ModelConfig& mc = cfg.model;
    const int B = cfg.batch_size, T = cfg.seq_len;
    const long tokens_per_step = (long)B * T * cfg.grad_accum;

    // ---- run directory: the resolved config and the metrics log
    fs::create_directories(cfg.out_dir);
    write_file_atomic((fs::path(cfg.out_dir) / "config.json").string(), config_to_json(cfg).dump(2) + "\n");
    MetricsLog metrics(fs::path(cfg.out_dir) / "metrics.jsonl");

    // ---- model, data, optimizer
    GPT2CPU<float> model(mc);
    model.init(cfg.seed);
    DataLoader train_data(cfg.train_data, B, T, /*rank=*/0, /*world=*/1, cfg.shuffle, cfg.seed, mc.vocab_size);
    DataLoader val_data(cfg.val_data, B, T, 0, 1, /*shuffle=*/false, cfg.seed, mc.vocab_size);
    AdamWCPU optimizer(model.layout());

    std::printf("codagpt train: %s | %s backend, %d threads | %.2fM parameters | L=%d C=%d H=%d T=%d\n",
                cfg.name.c_str(), backend.c_str(), omp_get_max_threads(), model.params.size() / 1e6,
                mc.n_layer, mc.n_embd, mc.n_head, T);
    std::printf("batch %d x %d x %d accum = %ld tokens/step | %zu train batches/epoch | %d steps | out %s\n",
                B, T, cfg.grad_accum, tokens_per_step, train_data.windows_per_rank(), cfg.steps,
                cfg.out_dir.c_str());

    std::vector<int> inputs((size_t)B * T), targets((size_t)B * T);
    auto eval_and_log = [&](int step) {
        const double val_loss = evaluate(model, val_data, cfg.eval_batches, inputs, targets);
        std::printf("step %5d/%d | val loss %.4f\n", step, cfg.steps, val_loss);
        metrics.write({{"step", step}, {"val_loss", val_loss}});
        return val_loss;
    };

    // ---- the step loop
    using clock = std::chrono::steady_clock;
    double train_seconds = 0, last_loss = 0;
    std::vector<double> step_ms;
    for (int step = 0; step < cfg.steps; step++) {
        if (cfg.eval_every > 0 && step % cfg.eval_every == 0) eval_and_log(step);

        const auto t0 = clock::now();
        model.zero_grad();
        double loss = 0;
        for (int micro = 0; micro < cfg.grad_accum; micro++) {
            train_data.next_batch(inputs.data(), targets.data());
            loss += model.forward(inputs.data(), targets.data(), B, T);
            model.backward(1.0f / cfg.grad_accum);
        }
        loss /= cfg.grad_accum;
        const double norm = global_grad_norm(model.grads.data(), model.grads.size());
        const double lr = lr_at(cfg, step);
        optimizer.step(model.params.data(), model.grads.data(), lr, norm, cfg);
        const double seconds = std::chrono::duration<double>(clock::now() - t0).count();

        train_seconds += seconds;
        step_ms.push_back(seconds * 1e3);
        last_loss = loss;
        const double tok_s = tokens_per_step / seconds;
        if (!std::isfinite(loss)) throw Error("loss is not finite at step " + std::to_string(step + 1));
        metrics.write({{"step", step + 1}, {"loss", loss}, {"lr", lr}, {"grad_norm", norm},
                       {"ms", seconds * 1e3}, {"tok_s", tok_s}});
        if (!opt.quiet && ((step + 1) % cfg.log_every == 0 || step + 1 == cfg.steps))
            std::printf("step %5d/%d | loss %.4f | lr %.2e | norm %.3f | %.1f ms | %.0f tok/s\n", step + 1,
                        cfg.steps, loss, lr, norm, seconds * 1e3, tok_s);
    }
    const double val_loss = eval_and_log(cfg.steps);
    std::printf("done: %d steps in %.1f s | final train loss %.4f | val loss %.4f | %.0f tok/s\n", cfg.steps,
                train_seconds, last_loss, val_loss, tokens_per_step * cfg.steps / train_seconds);

    if (!opt.bench_json.empty()) {
        // Steady state: the median step after the first few (allocation, caches, page faults).
        const size_t skip = std::min<size_t>(3, step_ms.size() / 2);
        std::vector<double> steady(step_ms.begin() + skip, step_ms.end());
        std::nth_element(steady.begin(), steady.begin() + steady.size() / 2, steady.end());
        const double ms = steady[steady.size() / 2];
        nlohmann::json rec = {{"kind", "train"}, {"system", "codagpt"}, {"backend", backend},
                              {"gpu", nullptr}, {"cpu_threads", omp_get_max_threads()},
                              {"fusion", nullptr}, {"model", cfg.name}, {"batch", B}, {"seq", T},
                              {"grad_accum", cfg.grad_accum}, {"nproc", 1}, {"tok_s", tokens_per_step / (ms / 1e3)},
                              {"ms_step", ms}, {"mfu", nullptr}, {"peak_mem_gib", nullptr},
                              {"train_loss", last_loss}, {"val_loss", val_loss}, {"steps", cfg.steps},
                              {"wall_s", train_seconds}};
        stamp_record(rec, opt.command);
        append_record(opt.bench_json, rec);
        std::printf("benchmark record appended to %s\n", opt.bench_json.c_str());
    }
    return 0;
}

}  // namespace codagpt
