// The unfused GPU model against the CPU reference: logits, loss, every parameter gradient, a short
// training run, and determinism. bf16 activations and parameters against fp32: the tolerances
// below are a few bf16 roundings (2^-8 = 3.9e-3 relative each) compounded through the layers.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <utility>

#include "backend.hpp"
#include "device.hpp"
#include "gpu_test_util.hpp"
#include "model_cpu.hpp"
#include "model_gpu.hpp"
#include "model_test_util.hpp"
#include "optim_cpu.hpp"
#include "step_phases.hpp"  // median

using namespace codagpt;
using namespace codagpt::test;

namespace {

struct Case {
    const char* name;
    ModelConfig cfg;
    int B, T;
};

void check_against_cpu(const Case& c, bool prefer_cudnn) {
    GPT2CPU<float> cpu(c.cfg);
    cpu.init(42);
    // The GPU holds bf16 weights: give the CPU the same rounded weights so that only the
    // arithmetic differs.
    for (float& w : cpu.params) w = bf16_round(w);
    GPT2GPU gpu(c.cfg, c.B, c.T, GPUModelOptions{Recompute::none, prefer_cudnn});
    gpu.set_params(cpu.params);
    std::printf("%s: attention backend %s\n", c.name, gpu.attention_backend());

    const auto inputs = random_tokens((size_t)c.B * c.T, c.cfg.vocab_size, 7);
    const auto targets = random_tokens((size_t)c.B * c.T, c.cfg.vocab_size, 8);
    const double gpu_loss_eval = gpu.forward(inputs.data(), targets.data(), /*backward_next=*/false);
    const std::vector<float> gpu_logits = gpu.logits();
    const float cpu_loss = cpu.forward(inputs.data(), targets.data(), c.B, c.T);

    // logits of real vocabulary entries
    const int V = c.cfg.vocab_size, Vp = c.cfg.padded_vocab();
    std::vector<float> a, b;
    for (size_t i = 0; i < (size_t)c.B * c.T; i++)
        for (int j = 0; j < V; j++) {
            a.push_back(gpu_logits[i * Vp + j]);
            b.push_back(cpu.logits()[i * Vp + j]);
        }
    const double logit_err = rel_error(a, b);
    std::printf("  logits rel err %.2e, loss gpu %.6f cpu %.6f\n", logit_err, gpu_loss_eval, cpu_loss);
    EXPECT_LT(logit_err, 2e-2);
    EXPECT_NEAR(gpu_loss_eval, cpu_loss, 5e-3 * cpu_loss);

    cpu.zero_grad();
    cpu.backward();
    gpu.zero_grad();
    const double gpu_loss = gpu.forward(inputs.data(), targets.data(), /*backward_next=*/true);
    gpu.backward();
    EXPECT_EQ(gpu_loss, gpu_loss_eval);
    expect_grads_close(gpu.grads(), cpu.grads, cpu.layout(), 5e-2);
}

}  // namespace

TEST(GPUModel, TinyMatchesCPUReference) {
    REQUIRE_GPU();
    check_against_cpu({"gpt2-tiny", ModelConfig{2, 4, 64, 64, 50257}, 4, 64}, true);
}

TEST(GPUModel, TinyMatchesCPUReferenceWithOwnAttention) {
    REQUIRE_GPU();
    check_against_cpu({"gpt2-tiny (own attention)", ModelConfig{2, 4, 64, 64, 50257}, 4, 64}, false);
}

TEST(GPUModel, TwoLayers124MWidthsMatchCPUReference) {
    REQUIRE_GPU();
    check_against_cpu({"2 layers, C=768, 12 heads, T=1024", ModelConfig{2, 12, 768, 1024, 50257}, 1, 1024}, true);
}

// 20 AdamW steps on a fixed stream of batches, each GPU path through the training backend: the loss
// curve follows the CPU's within bf16 noise, two runs are bit-identical, and it trains.
TEST(GPUModel, TwentyStepsFollowCPUAndAreDeterministic) {
    REQUIRE_GPU();
    const ModelConfig mc{2, 4, 64, 64, 50257};
    const int B = 4, T = 64;
    TrainConfig tc;
    tc.model = mc;
    tc.batch_size = B;
    tc.seq_len = T;
    tc.steps = 20;
    tc.warmup_steps = 2;
    tc.lr = 1e-3;
    auto batch = [&](int s) { return std::pair{random_tokens(B * T, 512, 100 + s), random_tokens(B * T, 512, 200 + s)}; };

    GPT2CPU<float> cpu(mc);
    cpu.init(1);
    for (float& w : cpu.params) w = bf16_round(w);
    const std::vector<float> init = cpu.params;
    AdamWCPU opt(cpu.layout());
    std::vector<double> cpu_losses;
    for (int s = 0; s < tc.steps; s++) {
        const auto [in, tg] = batch(s);
        cpu.zero_grad();
        cpu_losses.push_back(cpu.forward(in.data(), tg.data(), B, T));
        cpu.backward();
        opt.step(cpu.params.data(), cpu.grads.data(), lr_at(tc, s),
                 global_grad_norm(cpu.grads.data(), cpu.grads.size()), tc);
    }

    for (const bool coda : {false, true}) {
        SCOPED_TRACE(coda ? "fused" : "unfused");
        auto run_gpu = [&]() {
            const std::unique_ptr<TrainBackend> gpu = coda ? make_coda_gpu_backend(tc) : make_gpu_backend(tc, {});
            gpu->load_params(init);
            std::vector<double> losses;
            for (int s = 0; s < tc.steps; s++) {
                const auto [in, tg] = batch(s);
                gpu->zero_grad();
                losses.push_back(gpu->forward_backward(in.data(), tg.data(), 1.0f));
                gpu->update(lr_at(tc, s), tc);
            }
            return losses;
        };
        const std::vector<double> g1 = run_gpu(), g2 = run_gpu();
        EXPECT_EQ(g1, g2);
        for (int s = 0; s < tc.steps; s++) {
            std::printf("  %s step %2d loss cpu %.5f gpu %.5f\n", coda ? "fused" : "unfused", s + 1, cpu_losses[s], g1[s]);
            EXPECT_NEAR(g1[s], cpu_losses[s], 1e-2 * cpu_losses[s]) << "step " << s + 1;
        }
        EXPECT_LT(g1.back(), g1.front() - 0.5);  // it trains
    }
}

// --recompute trades memory for time and nothing else: on each path, training with GELU outputs or
// all MLP activations recomputed in backward, in every layer or (--recompute-layers) in the first
// ones only, gives the bits of training with them kept (the same kernels recompute the same values
// from the same inputs), losses and final weights alike.
TEST(GPUModel, RecomputeChangesNoBits) {
    REQUIRE_GPU();
    TrainConfig tc;
    tc.model = ModelConfig{3, 4, 128, 64, 50257};
    tc.batch_size = 4;
    tc.seq_len = 64;
    tc.steps = 4;
    tc.lr = 1e-3;
    tc.warmup_steps = 1;
    const std::vector<float> init = gpt2_init_params(tc.model, 7);
    for (const bool coda : {false, true}) {
        auto run = [&](Recompute r, int layers) {
            SCOPED_TRACE(std::string(coda ? "fused" : "unfused") + ", --recompute " + recompute_name(r) +
                         " in " + std::to_string(layers) + " layers (0: all)");
            const GPUBackendOptions opt{r, layers};
            const std::unique_ptr<TrainBackend> gpu = coda ? make_coda_gpu_backend(tc, opt) : make_gpu_backend(tc, opt);
            gpu->load_params(init);
            std::vector<double> losses;
            for (int s = 0; s < tc.steps; s++) {
                const std::vector<int> in = random_tokens(tc.batch_size * tc.seq_len, 512, 300 + s),
                                       tg = random_tokens(tc.batch_size * tc.seq_len, 512, 400 + s);
                gpu->zero_grad();
                losses.push_back(gpu->forward_backward(in.data(), tg.data(), 1.0f));
                gpu->update(lr_at(tc, s), tc);
            }
            return std::pair{losses, gpu->save_state().params};
        };
        const auto kept = run(Recompute::none, 0);
        for (const Recompute r : {Recompute::gelu, Recompute::mlp})
            for (const int layers : {0, 1, 2}) {  // of 3: the first layer and the first two share a buffer
                const auto recomputed = run(r, layers);
                EXPECT_EQ(recomputed.first, kept.first);
                EXPECT_TRUE(recomputed.second == kept.second);
            }
    }
}

// zero_grad() clears only the gradients that kernels add into; a step's first backward writes the
// weight matrices' gradients with its dW GEMMs (written_by_weight_gemms), later ones add to them.
// So on each path (the fused one with its LM head in one chunk and in three, where only the first
// chunk's wte GEMM writes): a step's gradients are those of a fresh model on the same batch, bit for
// bit, whatever the step before left in the buffer; and two micro-batches give the sum of their own
// gradients (fp32 sums in another order: 1e-5).
TEST(GPUModel, EachStepsGradientsAreItsOwnAndMicroBatchesAdd) {
    REQUIRE_GPU();
    const TrainConfig tc = tiny_train_config();
    const std::vector<float> init = gpt2_init_params(tc.model, 5);
    const std::vector<ParamInfo> layout = param_layout(tc.model);
    const size_t n = (size_t)tc.batch_size * tc.seq_len;
    const std::vector<int> in1 = random_tokens(n, 512, 21), tg1 = random_tokens(n, 512, 22);
    const std::vector<int> in2 = random_tokens(n, 512, 23), tg2 = random_tokens(n, 512, 24);
    for (const int path : {0, 1, 3}) {  // unfused; fused, its LM head in 1 or 3 chunks
        SCOPED_TRACE(path == 0 ? "unfused" : "fused, LM head in " + std::to_string(path) + " chunks");
        auto fresh = [&] {
            GPUBackendOptions opt;
            opt.lm_head_chunks = path;
            std::unique_ptr<TrainBackend> m = path ? make_coda_gpu_backend(tc, opt) : make_gpu_backend(tc, opt);
            m->load_params(init);
            return m;
        };
        auto step_grads = [](TrainBackend& m, std::initializer_list<std::pair<const int*, const int*>> batches) {
            m.zero_grad();
            for (const auto& [in, tg] : batches) m.forward_backward(in, tg, 1.0f);
            return m.gradients();
        };
        const std::unique_ptr<TrainBackend> a = fresh(), b = fresh();
        const std::vector<float> g1 = step_grads(*a, {{in1.data(), tg1.data()}});
        const std::vector<float> g2_after_g1 = step_grads(*a, {{in2.data(), tg2.data()}});
        const std::vector<float> g2 = step_grads(*b, {{in2.data(), tg2.data()}});
        EXPECT_TRUE(g2_after_g1 == g2) << "the step before leaked into the gradients";

        const std::vector<float> both = step_grads(*a, {{in1.data(), tg1.data()}, {in2.data(), tg2.data()}});
        std::vector<float> sum(g1.size());
        for (size_t i = 0; i < sum.size(); i++) sum[i] = g1[i] + g2[i];
        expect_grads_close(both, sum, layout, 1e-5);
    }
}

// The energy meter behind the train records' energy_j_step: on a GPU its counter advances while
// the GPU trains, at a power between idle and the limit it reports.
TEST(GPUModel, EnergyCounterAdvancesWhileTraining) {
    REQUIRE_GPU();
    const std::unique_ptr<GpuEnergy> energy = GpuEnergy::open();
    ASSERT_TRUE(energy) << "no NVML energy counter for this GPU (libnvidia-ml.so.1 or the counter is missing)";
    const double limit = energy->power_limit_w();
    EXPECT_GT(limit, 0);
    const TrainConfig tc = tiny_train_config();
    const std::unique_ptr<TrainBackend> gpu = make_gpu_backend(tc, {});
    const auto in = random_tokens(4 * 64, 512, 1), tg = random_tokens(4 * 64, 512, 2);
    // Long enough for several updates of the driver's counter.
    const auto t0 = std::chrono::steady_clock::now();
    const double j0 = energy->joules();
    double seconds = 0;
    while (seconds < 1.0) {
        gpu->zero_grad();
        gpu->forward_backward(in.data(), tg.data(), 1.0f);
        gpu->update(1e-4, tc);  // synchronizes
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    const double j1 = energy->joules();
    ASSERT_GE(j0, 0);
    ASSERT_GE(j1, 0);
    const double watts = (j1 - j0) / seconds;
    std::printf("  %.1f J in %.2f s: %.0f W (limit %.0f W)\n", j1 - j0, seconds, watts, limit);
    EXPECT_GT(watts, 10);
    EXPECT_LT(watts, 1.2 * limit);
}

// The SM clock behind the train records' sm_clock_mhz: the sampler's readings, taken between
// steps, come in while the GPU trains, each a clock a GPU can run at, and a read takes only the
// samples since the last.
TEST(GPUModel, ClockSamplesComeInWhileTraining) {
    REQUIRE_GPU();
    const std::unique_ptr<GpuEnergy> energy = GpuEnergy::open();
    ASSERT_TRUE(energy) << "no NVML for this GPU (libnvidia-ml.so.1 is missing)";
    energy->new_sm_clock_samples();  // starts the sampler (nothing read yet)
    const TrainConfig tc = tiny_train_config();
    const std::unique_ptr<TrainBackend> gpu = make_gpu_backend(tc, {});
    const auto in = random_tokens(4 * 64, 512, 1), tg = random_tokens(4 * 64, 512, 2);
    std::vector<double> mhz;
    size_t reads = 0;
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 2.0) {
        gpu->zero_grad();
        gpu->forward_backward(in.data(), tg.data(), 1.0f);
        gpu->update(1e-4, tc);  // synchronizes
        const std::vector<double> got = energy->new_sm_clock_samples();
        mhz.insert(mhz.end(), got.begin(), got.end());
        reads++;
    }
    std::printf("  %zu clock samples in 2 s over %zu reads; median %.0f MHz\n", mhz.size(), reads,
                mhz.empty() ? 0.0 : median(mhz));
    ASSERT_GE(mhz.size(), 2u);
    // A read right after another finds at most the few samples taken in between, not the
    // driver's whole buffer again.
    const size_t again = energy->new_sm_clock_samples().size();
    std::printf("  a read right after: %zu samples\n", again);
    EXPECT_LT(again, std::max<size_t>(2, mhz.size() / 10));
    for (double f : mhz) {
        EXPECT_GT(f, 100);
        EXPECT_LT(f, 4000);
    }
}
