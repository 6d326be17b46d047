// The host side of data-parallel training that runs without a GPU: the data position of a
// checkpoint resumed on another rank count, the rank count in the checkpoint file, and the refusals
// of multi-process runs that cannot be data parallel (CPU device, a build without NCCL).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "checkpoint.hpp"
#include "common.hpp"
#include "data_parallel.hpp"
#include "dist_env.hpp"
#include "train.hpp"
#include "test_util.hpp"
#include "train_fixture.hpp"

using namespace codagpt;
using namespace codagpt::test;

TEST(DataParallelResume, LoaderPositionIsSharedOutAgain) {
    Checkpoint ck;
    ck.train_loader = {3, 10};
    ck.data_ranks = 4;  // 40 windows of epoch 3 taken
    EXPECT_EQ(loader_state_for(ck, 4, 1, 100).next, 10u);  // the same rank count keeps the position
    EXPECT_EQ(loader_state_for(ck, 4, 1, 100).epoch, 3u);
    EXPECT_EQ(loader_state_for(ck, 4, 2, 100).next, 10u);
    EXPECT_EQ(loader_state_for(ck, 8, 1, 100).next, 5u);
    EXPECT_EQ(loader_state_for(ck, 1, 1, 100).next, 40u);
    EXPECT_EQ(loader_state_for(ck, 3, 1, 100).next, 13u);  // 39 of the 40, rounded down
    EXPECT_EQ(loader_state_for(ck, 3, 2, 100).next, 12u);  // ... to a whole step of 2 micro-batches
    EXPECT_EQ(loader_state_for(ck, 4, 3, 100).next, 9u);   // grad_accum 3 on resume
    // Past the new split's share of the epoch (its tail, which that split leaves out): the epoch's end.
    EXPECT_EQ(loader_state_for(ck, 2, 1, 18).next, 18u);
    EXPECT_EQ(loader_state_for(ck, 2, 1, 18).epoch, 3u);
    EXPECT_NE(error_of([&] { loader_state_for(ck, 0, 1, 100); }).find("not positive"), std::string::npos);
    EXPECT_NE(error_of([&] { loader_state_for(ck, 4, 0, 100); }).find("not positive"), std::string::npos);
}

TEST(DataParallelResume, CheckpointKeepsTheRankCount) {
    TempDir dir;
    Checkpoint ck;
    ck.config.model = ModelConfig{1, 2, 16, 64, 32};
    const size_t n = ck.config.model.num_params();
    ck.state = {std::vector<float>(n, 0.5f), std::vector<float>(n), std::vector<float>(n), 7};
    ck.step = 7;
    ck.train_loader = {0, 7};
    ck.data_ranks = 8;
    const std::string path = dir / "ckpt.bin";
    save_checkpoint(path, ck);
    EXPECT_EQ(load_checkpoint(path).data_ranks, 8);
    ck.data_ranks = 1;
    save_checkpoint(path, ck);
    EXPECT_EQ(load_checkpoint(path).data_ranks, 1);
}

TEST(DataParallelRefusals, SeveralRanksOnTheCpuAreRefused) {
    SyntheticRun synth("test-dp-cpu", ModelConfig{1, 2, 16, 16, 64}, 2, 8, 4000, 1000);
    const ScopedEnv rank("CODAGPT_RANK", "1"), world("CODAGPT_WORLD_SIZE", "2");  // a rank of a launched job
    TrainOptions opt;
    opt.device = "cpu";
    opt.quiet = true;
    EXPECT_NE(error_of([&] { run_train(synth.cfg, opt); }).find("data-parallel training runs on GPUs"),
              std::string::npos);
}

TEST(DataParallelRefusals, BuildWithoutNcclSaysSo) {
#ifdef CODAGPT_HAVE_NCCL
    GTEST_SKIP() << "this build has NCCL";
#else
    DistContext dist;
    dist.rank = 1;
    dist.world_size = 2;
    EXPECT_NE(error_of([&] { make_data_parallel(dist, ModelConfig{}); }).find("needs NCCL, and this build has none"),
              std::string::npos);
#endif
}
