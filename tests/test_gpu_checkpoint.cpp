// Checkpoint and resume on the GPU trainer: the same bit-for-bit checks as test_checkpoint.cpp
// (fp32 master weights, AdamW moments and step count restored; bf16 weights re-rounded from the
// masters exactly as AdamW rounds them), at the backend level and for whole runs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "backend.hpp"
#include "checkpoint.hpp"
#include "data.hpp"
#include "gpu_test_util.hpp"
#include "optim_cpu.hpp"
#include "train.hpp"
#include "train_fixture.hpp"

namespace fs = std::filesystem;
using namespace codagpt;
using namespace codagpt::test;
using nlohmann::json;

namespace {

struct GPUCheckpoint : ::testing::Test {
    SyntheticRun synth{"test-gpu-ckpt", ModelConfig{/*n_layer=*/2, /*n_head=*/4, /*n_embd=*/64, /*max_seq_len=*/64, /*vocab_size=*/512}, 4, 64, 20000, 4000};
    fs::path dir = synth.dir.path;
    TrainConfig& cfg = synth.cfg;
    void SetUp() override {
        cfg.steps = 20;
        cfg.warmup_steps = 3;
        cfg.eval_every = 5;
        cfg.eval_batches = 2;
    }

    // Steps [from, to), each of cfg.grad_accum micro-batches.
    void train_steps(TrainBackend& model, DataLoader& data, int from, int to, std::vector<double>& losses) {
        std::vector<int> in((size_t)cfg.batch_size * cfg.seq_len), tgt(in.size());
        for (int step = from; step < to; step++) {
            model.zero_grad();
            for (int micro = 0; micro < cfg.grad_accum; micro++) {
                data.next_batch(in.data(), tgt.data());
                losses.push_back(model.forward_backward(in.data(), tgt.data(), 1.0f / cfg.grad_accum));
            }
            model.update(lr_at(cfg, step), cfg);
        }
    }
    DataLoader loader() const {
        return DataLoader(cfg.train_data, cfg.batch_size, cfg.seq_len, 0, 1, cfg.shuffle, cfg.seed, cfg.model.vocab_size);
    }
};

}  // namespace

// Each GPU path, with gradient accumulation: train N steps straight; train K, checkpoint, restore
// into a backend of another seed and train to N: the same losses, weights, moments and step count,
// bit for bit. (The fused path recomputes its folds from the restored master weights as after an
// update, so they match too.)
TEST_F(GPUCheckpoint, BackendResumeIsBitExact) {
    REQUIRE_GPU();
    const int N = 20, K = 13;
    cfg.grad_accum = 2;
    for (const bool coda : {false, true}) {
        SCOPED_TRACE(coda ? "fused" : "unfused");
        auto backend = [&](const TrainConfig& c) { return coda ? make_coda_gpu_backend(c) : make_gpu_backend(c, {}); };
        std::vector<double> straight, split;
        TrainState end;
        {
            auto model = backend(cfg);
            DataLoader data = loader();
            train_steps(*model, data, 0, N, straight);
            end = model->save_state();
        }
        const std::string path = (dir / "ckpt.bin").string();
        {
            auto model = backend(cfg);
            DataLoader data = loader();
            train_steps(*model, data, 0, K, split);
            save_checkpoint(path, Checkpoint{cfg, K, data.state(), model->save_state()});
        }
        {
            TrainConfig other = cfg;
            other.seed = 4242;  // every weight must come from the file
            auto model = backend(other);
            DataLoader data = loader();
            const Checkpoint ck = load_checkpoint(path);
            model->load_state(ck.state);
            data.set_state(ck.train_loader);
            train_steps(*model, data, ck.step, N, split);
            const TrainState s = model->save_state();
            EXPECT_TRUE(same_bits(s.params, end.params));
            EXPECT_TRUE(same_bits(s.m, end.m));
            EXPECT_TRUE(same_bits(s.v, end.v));
            EXPECT_EQ(s.t, end.t);
        }
        EXPECT_EQ(split, straight);
    }
}

TEST_F(GPUCheckpoint, ResumedRunMatchesTheUninterruptedRun) {
    REQUIRE_GPU();
    cfg.ckpt_every = 20;
    auto run = [&](const std::string& out, const std::string& resume, int stop_after) {
        cfg.out_dir = (dir / out).string();
        TrainOptions opt;
        opt.device = "cuda";
        opt.quiet = true;
        opt.resume = resume;
        opt.stop_after = stop_after;
        EXPECT_EQ(run_train(cfg, opt), 0);
        std::vector<json> lines;
        std::ifstream f(fs::path(cfg.out_dir) / "metrics.jsonl");
        for (std::string line; std::getline(f, line);) {
            json j = json::parse(line);
            j.erase("ms");
            j.erase("tok_s");
            lines.push_back(j);
        }
        return lines;
    };
    const auto a = run("straight", "", 0);
    run("split", "", 7);
    const auto b = run("split", "latest", 0);
    ASSERT_EQ(a.size(), 20u + 5u);
    EXPECT_EQ(a, b);
    const Checkpoint fa = load_checkpoint(checkpoint_path((dir / "straight").string(), 20));
    const Checkpoint fb = load_checkpoint(checkpoint_path((dir / "split").string(), 20));
    EXPECT_TRUE(same_bits(fa.state.params, fb.state.params));
    EXPECT_TRUE(same_bits(fa.state.m, fb.state.m));
    EXPECT_TRUE(same_bits(fa.state.v, fb.state.v));
}

// `codagpt eval` on a GPU run's checkpoint: the validation loss the run logged after its last step,
// bit for bit, on each GPU path (a fresh backend rounds the loaded masters as the run's last update
// did; the fused path folds them as after that update).
TEST_F(GPUCheckpoint, EvalOfACheckpointIsTheRunsLastValidationLoss) {
    REQUIRE_GPU();
    cfg.steps = 10;
    cfg.ckpt_every = 10;
    for (const std::string fusion : {"unfused", "coda"}) {
        SCOPED_TRACE(fusion);
        cfg.out_dir = (dir / fusion).string();
        TrainOptions opt;
        opt.device = "cuda";
        opt.fusion = fusion;
        opt.quiet = true;
        ASSERT_EQ(run_train(cfg, opt), 0);
        double logged = 0;
        std::ifstream f(fs::path(cfg.out_dir) / "metrics.jsonl");
        for (std::string line; std::getline(f, line);)
            if (const json j = json::parse(line); j.contains("val_loss")) logged = j["val_loss"].get<double>();
        EvalOptions e;
        e.weights = checkpoint_path(cfg.out_dir, 10);
        e.device = "cuda";
        e.fusion = fusion;
        const EvalResult r = run_eval(e);
        EXPECT_EQ(r.val_loss, logged);
        EXPECT_EQ(r.batches, cfg.eval_batches);
    }
}
