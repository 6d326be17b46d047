#include <gtest/gtest.h>

#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "common.hpp"
#include "test_util.hpp"
#include "data.hpp"

namespace fs = std::filesystem;
using codagpt::test::error_of;
using codagpt::test::mentions;
using codagpt::test::TempDir;
using namespace codagpt;

namespace {

constexpr int kVocab = 50257;

void put_le32(std::string& out, int32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(char((uint32_t(v) >> (8 * i)) & 0xFF));
}
void put_le16(std::string& out, uint16_t v) {
    out.push_back(char(v & 0xFF));
    out.push_back(char(v >> 8));
}

// The bytes llm.c's Python writer produces: np.zeros(256, int32) header with magic, version and
// count, then the tokens as np.uint16, little-endian. Built by hand so that it does not share
// code with write_shard.
std::string llmc_bytes(int32_t magic, int32_t version, int32_t count, const std::vector<uint16_t>& tokens) {
    std::string out;
    put_le32(out, magic);
    put_le32(out, version);
    put_le32(out, count);
    for (int i = 3; i < 256; ++i) put_le32(out, 0);
    for (uint16_t t : tokens) put_le16(out, t);
    return out;
}

void write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

std::vector<uint16_t> iota_tokens(size_t n, uint16_t first) {
    std::vector<uint16_t> t(n);
    for (size_t i = 0; i < n; ++i) t[i] = uint16_t(first + i);
    return t;
}

}  // namespace

TEST(Shard, WriteReadRoundTrip) {
    TempDir dir;
    const std::string path = dir / "train_000000.bin";
    const std::vector<uint16_t> tokens = {50256, 0, 1, 42, 50255, 13, 198};
    write_shard(path, tokens);
    EXPECT_EQ(read_shard(path, kVocab), tokens);
    EXPECT_EQ(fs::file_size(path), 1024 + 2 * tokens.size());
    // the temporary file was renamed, not left behind
    EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()), 1);

    write_shard(path, {});  // replaces the old shard
    EXPECT_TRUE(read_shard(path, kVocab).empty());
}

TEST(Shard, WriteMatchesLlmcBytes) {
    TempDir dir;
    const std::vector<uint16_t> tokens = {50256, 5962, 22307, 25, 198};
    write_shard(dir / "a.bin", tokens);
    std::ifstream f(dir / "a.bin", std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    EXPECT_EQ(bytes, llmc_bytes(20240520, 1, int32_t(tokens.size()), tokens));
}

TEST(Shard, ReadsLlmcPythonWriterBytes) {
    TempDir dir;
    const std::string path = dir / "tiny_shakespeare_val.bin";
    const std::vector<uint16_t> tokens = {50256, 5962, 22307, 25, 198, 8421, 356, 50256};
    write_bytes(path, llmc_bytes(20240520, 1, int32_t(tokens.size()), tokens));
    EXPECT_EQ(read_shard(path, kVocab), tokens);
}

TEST(Shard, BadFilesNameFileAndProblem) {
    TempDir dir;
    const std::vector<uint16_t> ten = iota_tokens(10, 100);
    struct Case { std::string name, bytes, problem; };
    const std::vector<Case> cases = {
        {"short.bin", std::string(100, '\0'), "shorter than the 1024-byte header"},
        {"magic.bin", llmc_bytes(20240521, 1, 10, ten), "bad magic 20240521"},
        {"version.bin", llmc_bytes(20240520, 2, 10, ten), "unsupported version 2"},
        {"negative.bin", llmc_bytes(20240520, 1, -5, {}), "negative token count -5"},
        {"truncated.bin", llmc_bytes(20240520, 1, 11, ten), "truncated"},
        {"trailing.bin", llmc_bytes(20240520, 1, 9, ten), "trailing bytes"},
        {"odd.bin", llmc_bytes(20240520, 1, 10, ten) + "x", "trailing bytes"},
    };
    for (const Case& c : cases) {
        const std::string path = dir / c.name;
        write_bytes(path, c.bytes);
        const std::string msg = error_of([&] { read_shard(path, kVocab); });
        EXPECT_TRUE(mentions(msg, path));
        EXPECT_TRUE(mentions(msg, c.problem));
    }

    const std::string missing = dir / "missing.bin";
    const std::string msg = error_of([&] { read_shard(missing, kVocab); });
    EXPECT_TRUE(mentions(msg, missing));
    EXPECT_TRUE(mentions(msg, "No such file"));
}

TEST(Shard, TokenIdOutOfVocabNamesOffsetAndId) {
    TempDir dir;
    const std::string path = dir / "ids.bin";
    write_bytes(path, llmc_bytes(20240520, 1, 5, {1, 2, 3, 50257, 4}));
    const std::string msg = error_of([&] { read_shard(path, kVocab); });
    EXPECT_TRUE(mentions(msg, path));
    EXPECT_TRUE(mentions(msg, "token id 50257 at token offset 3"));
    EXPECT_EQ(read_shard(path, 50258).size(), 5u);  // fine for a larger vocabulary
}

TEST(Shard, FailedWriteLeavesNothing) {
    TempDir dir;
    const std::string missing_dir = dir / "no/such/dir/x.bin";
    EXPECT_TRUE(mentions(error_of([&] { write_shard(missing_dir, {1, 2}); }), missing_dir));

    // renaming onto a non-empty folder fails after the data was written: the temporary goes away
    const std::string target = dir / "occupied";
    fs::create_directories(fs::path(target) / "inside");
    EXPECT_TRUE(mentions(error_of([&] { write_shard(target, {1, 2}); }), target));
    EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()), 1);
}

TEST(Shard, GlobSortsAndRejectsNoMatch) {
    TempDir dir;
    for (const char* name : {"train_000002.bin", "train_000000.bin", "val_000000.bin", "train_000001.bin"})
        write_shard(dir / name, {1});
    EXPECT_EQ(glob_shards(dir / "train_*.bin"),
              (std::vector<std::string>{dir / "train_000000.bin", dir / "train_000001.bin", dir / "train_000002.bin"}));
    const std::string pattern = dir / "test_*.bin";
    EXPECT_EQ(error_of([&] { glob_shards(pattern); }), "no files match " + pattern);
}

namespace {

// Three shards of token ids shard*1000 + i. With B=2, T=4 (stride 8) they hold 5, 4 and 6 windows;
// a window is known by its first token.
struct LoaderData {
    TempDir dir;
    static constexpr int B = 2, T = 4;
    std::vector<int> window_starts;  // global window order
    LoaderData() {
        const size_t lengths[] = {41, 37, 56};  // in the last, a 7th window would need 57 tokens
        for (int s = 0; s < 3; ++s) {
            write_shard(dir / ("train_00000" + std::to_string(s) + ".bin"), iota_tokens(lengths[s], uint16_t(s * 1000)));
            for (size_t off = 0; off + B * T + 1 <= lengths[s]; off += B * T) window_starts.push_back(int(s * 1000 + off));
        }
    }
    std::string pattern() const { return dir / "train_*.bin"; }
};

// First tokens of the next n batches; checks each batch is one window and targets are shifted inputs.
std::vector<int> next_starts(DataLoader& loader, size_t n) {
    const int BT = loader.B() * loader.T();
    std::vector<int> inputs(BT), targets(BT), starts;
    for (size_t k = 0; k < n; ++k) {
        loader.next_batch(inputs.data(), targets.data());
        for (int i = 0; i < BT; ++i) {
            EXPECT_EQ(inputs[i], inputs[0] + i);
            EXPECT_EQ(targets[i], inputs[0] + i + 1);
        }
        starts.push_back(inputs[0]);
    }
    return starts;
}

}  // namespace

TEST(DataLoader, WindowsAndShiftedTargets) {
    LoaderData data;
    ASSERT_EQ(data.window_starts.size(), 15u);
    DataLoader loader(data.pattern(), data.B, data.T, 0, 1, false, 0, kVocab);
    EXPECT_EQ(loader.num_windows(), 15u);
    EXPECT_EQ(loader.windows_per_rank(), 15u);
    EXPECT_EQ(next_starts(loader, 15), data.window_starts);  // in shard order, never crossing a shard
}

TEST(DataLoader, RanksAreDisjointCompleteAndEqual) {
    LoaderData data;
    const size_t n = data.window_starts.size();
    for (bool shuffle : {false, true}) {
        for (int R = 1; R <= 4; ++R) {
            std::vector<std::vector<int>> shares;
            for (int r = 0; r < R; ++r) {
                DataLoader loader(data.pattern(), data.B, data.T, r, R, shuffle, 7, kVocab);
                EXPECT_EQ(loader.windows_per_rank(), n / R);
                shares.push_back(next_starts(loader, loader.windows_per_rank()));
            }
            std::vector<int> all;
            for (const auto& share : shares) all.insert(all.end(), share.begin(), share.end());
            const std::set<int> distinct(all.begin(), all.end());
            EXPECT_EQ(distinct.size(), all.size()) << "ranks overlap, R=" << R << " shuffle=" << shuffle;
            EXPECT_EQ(all.size(), (n / R) * R);
            for (int start : all)
                EXPECT_NE(std::find(data.window_starts.begin(), data.window_starts.end(), start), data.window_starts.end());
            if (!shuffle) {  // rank r takes windows r, r+R, ...
                for (int r = 0; r < R; ++r)
                    for (size_t k = 0; k < shares[r].size(); ++k) EXPECT_EQ(shares[r][k], data.window_starts[r + k * R]);
            }
        }
    }
}

TEST(DataLoader, ShuffleDependsOnlyOnSeedAndEpoch) {
    LoaderData data;
    auto epochs = [&](uint64_t seed) {
        DataLoader loader(data.pattern(), data.B, data.T, 0, 1, true, seed, kVocab);
        return next_starts(loader, 30);
    };
    const std::vector<int> a = epochs(1);
    EXPECT_EQ(a, epochs(1));
    EXPECT_NE(a, epochs(2));
    const std::vector<int> epoch0(a.begin(), a.begin() + 15), epoch1(a.begin() + 15, a.end());
    EXPECT_NE(epoch0, data.window_starts);
    EXPECT_NE(epoch0, epoch1);
    for (const auto& epoch : {epoch0, epoch1})  // every window once per epoch
        EXPECT_EQ(std::set<int>(epoch.begin(), epoch.end()), std::set<int>(data.window_starts.begin(), data.window_starts.end()));
}

TEST(DataLoader, EpochRolloverAndReset) {
    LoaderData data;
    DataLoader loader(data.pattern(), data.B, data.T, 1, 2, false, 0, kVocab);
    ASSERT_EQ(loader.windows_per_rank(), 7u);
    const std::vector<int> epoch0 = next_starts(loader, 7);
    EXPECT_EQ(loader.state().epoch, 0u);
    EXPECT_EQ(loader.state().next, 7u);
    EXPECT_EQ(next_starts(loader, 7), epoch0);
    EXPECT_EQ(loader.state().epoch, 1u);
    loader.reset();
    EXPECT_EQ(loader.state().epoch, 0u);
    EXPECT_EQ(loader.state().next, 0u);
    EXPECT_EQ(next_starts(loader, 3), std::vector<int>(epoch0.begin(), epoch0.begin() + 3));
}

TEST(DataLoader, StateResumesExactSequence) {
    LoaderData data;
    for (bool shuffle : {false, true}) {
        DataLoader a(data.pattern(), data.B, data.T, 1, 3, shuffle, 11, kVocab);
        next_starts(a, 4);  // 5 per rank: the next epoch begins within the sequence below
        const DataLoader::State saved = a.state();
        const std::vector<int> expected = next_starts(a, 12);

        DataLoader b(data.pattern(), data.B, data.T, 1, 3, shuffle, 11, kVocab);
        b.set_state(saved);
        EXPECT_EQ(next_starts(b, 12), expected);
        EXPECT_EQ(b.state().epoch, a.state().epoch);
        EXPECT_EQ(b.state().next, a.state().next);
    }
    DataLoader c(data.pattern(), data.B, data.T, 0, 3, false, 0, kVocab);
    EXPECT_TRUE(mentions(error_of([&] { c.set_state({0, 6}); }), "next window 6 is beyond this rank's 5"));
}

// A step's 4 sequences read as one batch of 4, as 2 accumulated micro-batches of 2, as 2 ranks of
// 2, or as 2 ranks x 2 micro-batches of 1: the same tokens every step, across epoch boundaries
// (57 tokens: 3 windows of 4 x 4 + 1; 7 windows of 2 x 4 + 1 and 14 of 1 x 4 + 1, whose last ones
// no split may read, or it would wrap to the next epoch at another step).
TEST(DataLoader, EverySplitOfAStepReadsTheSameTokens) {
    TempDir dir;
    write_shard(dir / "train_000000.bin", iota_tokens(57, 0));
    const std::string pattern = dir / "train_*.bin";
    const int T = 4;
    DataLoader whole(pattern, 4, T, 0, 1, false, 0, kVocab);
    ASSERT_EQ(whole.windows_per_rank(), 3u);
    struct Split {
        int ranks, micro_steps, B;
    };
    for (const Split split : {Split{1, 2, 2}, Split{2, 1, 2}, Split{2, 2, 1}}) {
        whole.reset();
        std::vector<DataLoader> ranks;
        for (int r = 0; r < split.ranks; r++)
            ranks.emplace_back(pattern, split.B, T, r, split.ranks, false, 0, kVocab, split.micro_steps);
        EXPECT_EQ(ranks[0].windows_per_rank() / split.micro_steps, 3u) << "optimizer steps an epoch";
        std::vector<int> in(4 * T), tg(4 * T), part_in(split.B * T), part_tg(split.B * T);
        for (int step = 0; step < 8; step++) {  // 2 epochs and a bit
            whole.next_batch(in.data(), tg.data());
            std::vector<int> got_in, got_tg;
            for (int m = 0; m < split.micro_steps; m++)  // window position (step A + m) R + r
                for (DataLoader& rank : ranks) {
                    rank.next_batch(part_in.data(), part_tg.data());
                    got_in.insert(got_in.end(), part_in.begin(), part_in.end());
                    got_tg.insert(got_tg.end(), part_tg.begin(), part_tg.end());
                }
            EXPECT_EQ(got_in, in) << split.ranks << " ranks x " << split.micro_steps << " micro-batches, step " << step;
            EXPECT_EQ(got_tg, tg) << split.ranks << " ranks x " << split.micro_steps << " micro-batches, step " << step;
        }
    }
}

TEST(DataLoader, FewerWindowsThanRanks) {
    TempDir dir;
    write_shard(dir / "train_000000.bin", iota_tokens(30, 0));  // 3 windows of 2*4+1 tokens
    const std::string msg = error_of([&] { DataLoader(dir / "train_*.bin", 2, 4, 0, 4, false, 0, kVocab); });
    for (const char* part : {"30 tokens", "3 windows", "B=2", "T=4", "4 rank"}) EXPECT_TRUE(mentions(msg, part));
    EXPECT_NO_THROW(DataLoader(dir / "train_*.bin", 2, 4, 2, 3, false, 0, kVocab));
    const std::string accumulated = error_of([&] { DataLoader(dir / "train_*.bin", 2, 4, 0, 2, false, 0, kVocab, 2); });
    for (const char* part : {"3 windows", "2 rank(s) x 2 micro-batches"}) EXPECT_TRUE(mentions(accumulated, part));
    EXPECT_TRUE(mentions(error_of([&] { DataLoader(dir / "val_*.bin", 2, 4, 0, 1, false, 0, kVocab); }), "no files match"));
}

TEST(DataLoader, ReadsLlmcFilesAndChecksThem) {
    TempDir dir;
    std::vector<uint16_t> tokens = iota_tokens(17, 50240);  // ids 50240..50256
    write_bytes(dir / "tiny_shakespeare_train.bin", llmc_bytes(20240520, 1, 17, tokens));
    DataLoader loader(dir / "tiny_shakespeare_train.bin", 2, 4, 0, 1, false, 0, kVocab);
    EXPECT_EQ(next_starts(loader, 2), (std::vector<int>{50240, 50248}));

    // a bad header is found when the loader opens the shard, a bad id when the window is read
    const std::string bad_header = dir / "bad_header.bin";
    write_bytes(bad_header, llmc_bytes(20240520, 1, 18, tokens));
    EXPECT_TRUE(mentions(error_of([&] { DataLoader(bad_header, 2, 4, 0, 1, false, 0, kVocab); }), "truncated"));
    tokens[12] = 60000;
    const std::string bad_id = dir / "bad_id.bin";
    write_bytes(bad_id, llmc_bytes(20240520, 1, 17, tokens));
    DataLoader bad(bad_id, 2, 4, 0, 1, false, 0, kVocab);
    next_starts(bad, 1);
    std::vector<int> inputs(8), targets(8);
    const std::string msg = error_of([&] { bad.next_batch(inputs.data(), targets.data()); });
    EXPECT_TRUE(mentions(msg, bad_id));
    EXPECT_TRUE(mentions(msg, "token id 60000 at token offset 12"));
}
