// The NCCL data-parallel trainer on one GPU (issue 6): a one-rank communicator trains exactly as a
// single process (both fusion paths, at the backend level and through `codagpt train
// --nproc-per-node 1`), and the ZeRO-1 shard step of R simulated ranks, run one after another on
// the same device with the same global norm, equals the unsharded step bit for bit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "adamw.cuh"
#include "backend.hpp"
#include "checkpoint.hpp"
#include "data.hpp"
#include "data_parallel.hpp"
#include "dist_env.hpp"
#include "gpu_test_util.hpp"
#include "gpu_training.hpp"
#include "optim_cpu.hpp"
#include "train_fixture.hpp"
#include "zero_shard.hpp"

namespace fs = std::filesystem;
using namespace codagpt;
using namespace codagpt::test;
using nlohmann::json;

namespace {


// The codagpt binary beside this test (a device pack: scripts/device_pack.sh), else the build's.
std::string codagpt_binary() {
    const fs::path beside = fs::read_symlink("/proc/self/exe").parent_path() / "codagpt";
    return fs::exists(beside) ? beside.string() : CODAGPT_BINARY;
}

#ifdef CODAGPT_HAVE_NCCL
#define REQUIRE_NCCL() (void)0
#else
#define REQUIRE_NCCL() GTEST_SKIP() << "this build has no NCCL"
#endif

struct OneRank : ::testing::TestWithParam<bool> {  // the parameter: the fused (CODA) path
    SyntheticRun synth{"test-gpu-dist", ModelConfig{}, 4, 64, 40000, 8000};  // gpt2-tiny
    TrainConfig& cfg = synth.cfg;
    void SetUp() override {
        cfg.steps = 6;
        cfg.warmup_steps = 2;
        cfg.grad_accum = 2;  // the reductions run in the second micro-step's backward only
        cfg.eval_every = 3;
        cfg.eval_batches = 2;
    }
    std::unique_ptr<TrainBackend> backend(std::shared_ptr<DataParallel> dp) const {
        return GetParam() ? make_coda_gpu_backend(cfg, {}, std::move(dp)) : make_gpu_backend(cfg, {}, std::move(dp));
    }
    // Steps of the training loop (accumulation, norm, update); returns the losses and norms.
    std::vector<double> train(TrainBackend& model) const {
        DataLoader data(cfg.train_data, cfg.batch_size, cfg.seq_len, 0, 1, cfg.shuffle, cfg.seed, cfg.model.vocab_size);
        std::vector<int> in((size_t)cfg.batch_size * cfg.seq_len), tgt(in.size());
        std::vector<double> out;
        for (int step = 0; step < cfg.steps; step++) {
            model.zero_grad();
            double loss = 0;
            for (int micro = 0; micro < cfg.grad_accum; micro++) {
                data.next_batch(in.data(), tgt.data());
                loss += model.forward_backward(in.data(), tgt.data(), 1.0f / cfg.grad_accum);
            }
            out.push_back(loss);
            out.push_back(model.update(lr_at(cfg, step), cfg));
        }
        return out;
    }
};

}  // namespace

// A real one-rank NCCL communicator (rank 0 of 1: no rendezvous socket) against the plain backend.
TEST_P(OneRank, NcclBackendEqualsSingleProcess) {
    REQUIRE_GPU();
    REQUIRE_NCCL();
    auto plain = backend(nullptr);
    auto dist = backend(make_data_parallel(DistContext{}, cfg.model));
    EXPECT_NE(dist->describe().find("rank 0 of 1"), std::string::npos) << dist->describe();
    const std::vector<double> a = train(*plain), b = train(*dist);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); i++) EXPECT_EQ(a[i], b[i]) << (i % 2 ? "norm" : "loss") << " of step " << i / 2;
    const TrainState sa = plain->save_state(), sb = dist->save_state();
    EXPECT_TRUE(same_bits(sa.params, sb.params));
    EXPECT_TRUE(same_bits(sa.m, sb.m));
    EXPECT_TRUE(same_bits(sa.v, sb.v));
    EXPECT_EQ(sa.t, sb.t);
}

// `codagpt train --nproc-per-node 1`: the launcher, the rendezvous, the NCCL path in run_train
// (rank-sharded loaders, losses averaged over ranks, checkpoint gathered to rank 0) against the
// same run in one process: the same metrics and the same final checkpoint.
TEST_P(OneRank, NprocPerNodeOneEqualsPlainRun) {
    REQUIRE_GPU();
    REQUIRE_NCCL();
    cfg.ckpt_every = cfg.steps;
    const fs::path config = synth.dir / "config.json";
    std::ofstream(config) << config_to_json(cfg).dump(2);
    auto run = [&](const std::string& name, const std::string& launch) {
        const fs::path out = synth.dir / name;
        const std::string cmd = codagpt_binary() + " train " + launch + " --config " + config.string() +
                                " --device cuda --fusion " + (GetParam() ? "coda" : "unfused") + " -q --out_dir " +
                                out.string() + " > " + synth.dir / (name + ".log") + " 2>&1";
        EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
        std::vector<json> lines;
        std::ifstream f(out / "metrics.jsonl");
        for (std::string line; std::getline(f, line);) {
            json j = json::parse(line);
            j.erase("ms");
            j.erase("tok_s");
            lines.push_back(j);
        }
        return std::make_pair(lines, load_checkpoint(checkpoint_path(out.string(), cfg.steps)));
    };
    const auto [plain_lines, plain_ck] = run("plain", "");
    const auto [one_lines, one_ck] = run("nproc1", "--nproc-per-node 1");
    ASSERT_FALSE(plain_lines.empty());
    EXPECT_EQ(plain_lines, one_lines);
    EXPECT_TRUE(same_bits(plain_ck.state.params, one_ck.state.params));
    EXPECT_TRUE(same_bits(plain_ck.state.m, one_ck.state.m));
    EXPECT_TRUE(same_bits(plain_ck.state.v, one_ck.state.v));
    EXPECT_EQ(one_ck.data_ranks, 1);
}

INSTANTIATE_TEST_SUITE_P(BothPaths, OneRank, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "coda" : "unfused"; });

// ZeRO-1 on one GPU: rank r's step (gpu_training's device_adamw_step over plan.shards[r], its own
// chunks of master weights and moments, the full gradient and bf16 buffers) for each of R simulated
// ranks, against the one-shard step: the same weights, moments and bf16 copies, bit for bit, and
// the padding untouched. The global norm is the unsharded one (as every rank gets it from the
// reduction); the rank-order sum of the shards' partials is checked to be that norm up to rounding.
TEST(ZeroOnOneGPU, ShardedStepEqualsUnshardedForSeveralRankCounts) {
    REQUIRE_GPU();
    const ModelConfig mc{};  // gpt2-tiny: tensors of many sizes, n not a multiple of 8 R
    const std::vector<ParamInfo> layout = param_layout(mc);
    TrainConfig c;
    c.grad_clip = 1.0;  // the clip is active: the norm below is far above it
    c.weight_decay = 0.1;
    const int t = 3;
    const double lr = 1e-3;
    const ZeroPlan one = make_zero_plan(layout, 1);
    const size_t n = one.n;
    std::vector<float> master = random_bf16_values(n, 11, 0.05f);
    for (size_t i = 0; i < n; i++) master[i] *= 1.0f + 1e-3f * float(i % 97);  // fp32 masters: low halves not 0
    const std::vector<float> grads = random_bf16_values(n, 12, 0.5f), m = random_bf16_values(n, 13, 0.01f);
    std::vector<float> v = random_bf16_values(n, 14, 1e-3f);
    for (float& x : v) x = x * x;

    // The unsharded step.
    DeviceBuffer<float> g(one.padded_total), scalars(4), scratch(global_norm_scratch_floats()), partials(8);
    std::vector<float> g_padded(grads);
    g_padded.resize(one.padded_total, 0.0f);
    g.upload(g_padded);
    DeviceBuffer<float> ref_m(n), ref_v(n);
    DeviceBuffer<bf16> ref_params(n);
    DeviceBuffer<uint16_t> ref_lo(n);
    ref_params.upload(master_his(master));
    ref_lo.upload(master_los(master));
    ref_m.upload(m);
    ref_v.upload(v);
    const OptimizerBuffers ref{&one.shards[0], ref_params, ref_lo, g, ref_m, ref_v, scalars, scratch};
    device_shard_norm_squared(ref, scalars, 0);
    float norm_sq = 0;
    CUDA_CHECK(cudaMemcpy(&norm_sq, scalars, sizeof(float), cudaMemcpyDeviceToHost));
    device_adamw_step(ref, t, lr, c, 0);
    const std::vector<bf16> want_hi = ref_params.download();
    const std::vector<float> want_master = master_joined(want_hi, ref_lo.download()), want_m = ref_m.download(),
                             want_v = ref_v.download(), want_params = to_float(want_hi);

    bool padded = false;  // some rank count below pads (checked at the end): the padding check can fail
    for (int R : {2, 3, 5}) {
        SCOPED_TRACE("R = " + std::to_string(R));
        const ZeroPlan plan = make_zero_plan(layout, R);
        const size_t S = plan.shard_size, P = plan.padded_total;
        padded = padded || P > n;
        std::vector<float> gp(grads);
        gp.resize(P, 0.0f);
        DeviceBuffer<float> grad(P);
        grad.upload(gp);
        DeviceBuffer<bf16> params(P);  // every rank's full copy of the bf16 halves, zero past n
        CUDA_CHECK(cudaMemset(params, 0, P * sizeof(bf16)));
        params.upload(master_his(master));
        const std::vector<ZeroShardState> shards = shard_zero_state(plan, master, m, v, t - 1);
        std::vector<uint16_t> got_lo(n);
        std::vector<float> got_m(n), got_v(n);
        for (int r = 0; r < R; r++) {
            DeviceBuffer<float> m1(S), v1(S);
            DeviceBuffer<uint16_t> lo(S);
            lo.upload(master_los(shards[r].master));
            m1.upload(shards[r].m);
            v1.upload(shards[r].v);
            const OptimizerBuffers b{&plan.shards[r], params, lo, grad, m1, v1, scalars, scratch};
            device_shard_norm_squared(b, partials + r, 0);
            CUDA_CHECK(cudaMemcpy(scalars, &norm_sq, sizeof(float), cudaMemcpyHostToDevice));
            device_adamw_step(b, t, lr, c, 0);
            const RankShard& s = plan.shards[r];
            const std::vector<uint16_t> hl = lo.download();
            const std::vector<float> h1 = m1.download(), h2 = v1.download();
            for (size_t i = s.end - s.begin; i < S; i++) ASSERT_TRUE(hl[i] == 0 && h1[i] == 0 && h2[i] == 0) << i;
            std::copy_n(hl.begin(), s.end - s.begin, got_lo.begin() + s.begin);
            std::copy_n(h1.begin(), s.end - s.begin, got_m.begin() + s.begin);
            std::copy_n(h2.begin(), s.end - s.begin, got_v.begin() + s.begin);
        }
        const std::vector<bf16> got_hi = params.download();
        std::vector<bf16> got_hi_n(got_hi.begin(), got_hi.begin() + n);
        EXPECT_TRUE(same_bits(master_joined(got_hi_n, got_lo), want_master));
        EXPECT_TRUE(same_bits(got_m, want_m));
        EXPECT_TRUE(same_bits(got_v, want_v));
        const std::vector<float> got_params = to_float(got_hi);
        EXPECT_TRUE(same_bits(std::vector<float>(got_params.begin(), got_params.begin() + n), want_params));
        for (size_t i = n; i < P; i++) ASSERT_EQ(got_params[i], 0.0f) << "padding " << i;

        sum_in_order(scalars, partials, R, 0);
        float combined = 0;
        CUDA_CHECK(cudaMemcpy(&combined, scalars, sizeof(float), cudaMemcpyDeviceToHost));
        EXPECT_NEAR(combined, norm_sq, 1e-5 * norm_sq);
    }
    EXPECT_TRUE(padded) << "no rank count padded the flat buffers: pick another model or rank counts";
}
