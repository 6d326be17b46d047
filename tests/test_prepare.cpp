#include <gtest/gtest.h>

#include <stdlib.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common.hpp"
#include "test_util.hpp"
#include "data.hpp"
#include "prepare.hpp"
#include "tokenizer.hpp"

namespace fs = std::filesystem;
using codagpt::test::error_of;
using codagpt::test::mentions;
using codagpt::test::read_bytes;
using codagpt::test::TempDir;
using namespace codagpt;

namespace {

constexpr int kVocab = 50257;

// First folder among $CODAGPT_DATA/<name>, <repo>/data/<name>, <repo>/../shared/data/<name> that
// holds `file`, or "" when none does.
std::string find_data(const std::string& name, const std::string& file) {
    std::vector<fs::path> roots;
    if (const char* env = std::getenv("CODAGPT_DATA")) roots.emplace_back(env);
    roots.emplace_back(fs::path(CODAGPT_SOURCE_DIR) / "data");
    roots.emplace_back(fs::path(CODAGPT_SOURCE_DIR) / ".." / "shared" / "data");
    for (const fs::path& root : roots)
        if (fs::exists(root / name / file)) return (root / name).string();
    return "";
}

std::vector<int> read_all(const std::vector<std::string>& shards) {
    std::vector<int> all;
    for (const std::string& path : shards) {
        const std::vector<uint16_t> t = read_shard(path, kVocab);
        all.insert(all.end(), t.begin(), t.end());
    }
    return all;
}

std::vector<std::string> matching(const std::vector<std::string>& shards, const std::string& split) {
    std::vector<std::string> out;
    for (const std::string& s : shards)
        if (fs::path(s).filename().string().rfind(split + "_", 0) == 0) out.push_back(s);
    return out;
}

// The token stream prepare must produce for these documents: EOT, then each document's tokens.
std::vector<int> expected_stream(const Tokenizer& tok, const std::vector<std::string>& docs) {
    std::vector<int> out;
    for (const std::string& d : docs) {
        out.push_back(Tokenizer::kEot);
        const std::vector<int> ids = tok.encode(d);
        out.insert(out.end(), ids.begin(), ids.end());
    }
    return out;
}

class Prepare : public testing::Test {
protected:
    static void SetUpTestSuite() {
        const std::string dir = find_data("gpt2", "encoder.json");
        if (!dir.empty()) tok_ = std::make_unique<Tokenizer>(Tokenizer::load(dir));
    }
    static void TearDownTestSuite() { tok_.reset(); }
    void SetUp() override {
        if (!tok_) GTEST_SKIP() << "no GPT-2 tokenizer files (encoder.json, vocab.bpe) found";
    }
    static std::unique_ptr<Tokenizer> tok_;
    TempDir dir_;
    const std::vector<std::string> docs_ = {
        "First Citizen:\nBefore we proceed any further, hear me speak.\n",
        "All:\nSpeak, speak.\n",
        "Naïve café — “quoted” 😀 text\twith tabs   and  spaces\n",
        "You are all resolved rather to die than to famish?\n",
        "",
        "Resolved. resolved.",
    };
    std::vector<std::string> write_docs() {
        std::vector<std::string> paths;
        for (size_t i = 0; i < docs_.size(); ++i) paths.push_back(dir_.write("doc" + std::to_string(i) + ".txt", docs_[i]));
        return paths;
    }
};
std::unique_ptr<Tokenizer> Prepare::tok_;

}  // namespace

TEST_F(Prepare, EotBeforeEveryDocumentAndTextRoundTrips) {
    PrepareOptions opt;
    opt.val_fraction = 0;
    const PrepareStats stats = prepare_shards(write_docs(), dir_ / "out", opt, *tok_);
    EXPECT_EQ(stats.documents, docs_.size());
    EXPECT_EQ(stats.val_tokens, 0u);
    ASSERT_EQ(stats.shards, std::vector<std::string>{dir_ / "out/train_000000.bin"});
    const std::vector<int> tokens = read_all(stats.shards);
    EXPECT_EQ(tokens.size(), stats.train_tokens);
    ASSERT_EQ(tokens, expected_stream(*tok_, docs_));

    // cut at the EOTs, each piece decodes to its file's text
    std::vector<std::vector<int>> pieces;
    for (int id : tokens) {
        if (id == Tokenizer::kEot) pieces.emplace_back();
        else pieces.back().push_back(id);
    }
    std::vector<std::string> decoded;
    for (const auto& piece : pieces) decoded.push_back(tok_->decode(piece));
    EXPECT_EQ(decoded, docs_);
}

TEST_F(Prepare, ValidationIsLeadingDocumentsNearestTheFraction) {
    const std::vector<int> all = expected_stream(*tok_, docs_);
    for (double fraction : {0.01, 0.3, 0.5, 0.9}) {
        PrepareOptions opt;
        opt.val_fraction = fraction;
        const PrepareStats stats = prepare_shards(write_docs(), dir_ / "out", opt, *tok_);
        const std::vector<int> val = read_all(matching(stats.shards, "val"));
        const std::vector<int> train = read_all(matching(stats.shards, "train"));
        EXPECT_EQ(val.size(), stats.val_tokens);
        EXPECT_EQ(train.size(), stats.train_tokens);
        ASSERT_FALSE(val.empty());
        ASSERT_FALSE(train.empty());
        EXPECT_EQ(val.front(), Tokenizer::kEot);
        EXPECT_EQ(train.front(), Tokenizer::kEot);  // the cut is at a document boundary
        std::vector<int> joined = val;
        joined.insert(joined.end(), train.begin(), train.end());
        EXPECT_EQ(joined, all);

        // no other boundary (with a document on each side) is nearer to the target
        const double target = fraction * double(all.size());
        for (size_t i = 1; i < all.size(); ++i) {
            if (all[i] == Tokenizer::kEot) {
                EXPECT_LE(std::fabs(double(val.size()) - target), std::fabs(double(i) - target));
            }
        }
    }
}

TEST_F(Prepare, SplitsOnBlankLinesLikeLlmc) {
    // llm.c: "<|endoftext|>" + text.replace("\n\n", "\n\n<|endoftext|>")
    const std::string text = "First Citizen:\nSpeak.\n\nAll:\nSpeak, speak.\n\n\nSecond:\nWe know't.\n\n";
    const std::vector<std::string> sections = {"First Citizen:\nSpeak.\n\n", "All:\nSpeak, speak.\n\n",
                                               "\nSecond:\nWe know't.\n\n", ""};
    PrepareOptions opt;
    opt.val_fraction = 0.2;
    opt.split_on_blank_lines = true;
    const PrepareStats stats = prepare_shards({dir_.write("a.txt", text), dir_.write("b.txt", "One more.")},
                                              dir_ / "out", opt, *tok_);
    EXPECT_EQ(stats.documents, 5u);
    std::vector<std::string> docs = sections;
    docs.push_back("One more.");
    EXPECT_EQ(read_all(stats.shards), expected_stream(*tok_, docs));
}

TEST_F(Prepare, ManyTrainShardsAndStaleOnesRemoved) {
    PrepareOptions opt;
    opt.val_fraction = 0;
    opt.shard_tokens = 7;
    const PrepareStats small = prepare_shards(write_docs(), dir_ / "out", opt, *tok_);
    const size_t n = (small.train_tokens + 6) / 7;
    ASSERT_GE(n, 3u);
    ASSERT_EQ(small.shards.size(), n);
    for (size_t i = 0; i < n; ++i) {
        const std::string number = std::to_string(i);
        EXPECT_EQ(small.shards[i], dir_ / ("out/train_" + std::string(6 - number.size(), '0') + number + ".bin"));
        EXPECT_EQ(read_shard(small.shards[i], kVocab).size(), i + 1 < n ? 7u : small.train_tokens - 7 * (n - 1));
    }
    EXPECT_EQ(read_all(small.shards), expected_stream(*tok_, docs_));

    // a second run with larger shards leaves only its own shards (and other files) in the folder
    dir_.write("out/notes.txt", "keep me");
    opt.shard_tokens = 1000;
    const PrepareStats large = prepare_shards(write_docs(), dir_ / "out", opt, *tok_);
    EXPECT_EQ(glob_shards(dir_ / "out/*.bin"), large.shards);
    EXPECT_TRUE(fs::exists(dir_ / "out/notes.txt"));
}

TEST_F(Prepare, Errors) {
    const std::vector<std::string> paths = write_docs();
    const std::string missing = dir_ / "missing.txt";
    std::vector<std::string> with_missing = paths;
    with_missing.push_back(missing);
    const std::string msg = error_of([&] { prepare_shards(with_missing, dir_ / "out", {}, *tok_); });
    EXPECT_TRUE(mentions(msg, missing));
    EXPECT_TRUE(mentions(msg, "No such file"));
    EXPECT_TRUE(mentions(error_of([&] { prepare_shards({dir_.path.string()}, dir_ / "out", {}, *tok_); }),
                         "cannot read input file " + dir_.path.string()));

    for (double bad : {-0.1, 1.0, 1.5, double(NAN)}) {
        PrepareOptions opt;
        opt.val_fraction = bad;
        EXPECT_TRUE(mentions(error_of([&] { prepare_shards(paths, dir_ / "out", opt, *tok_); }), "outside [0, 1)"));
    }
    EXPECT_TRUE(mentions(error_of([&] { prepare_shards({paths[0]}, dir_ / "out", {}, *tok_); }), "at least 2 documents"));
    PrepareOptions no_val;
    no_val.val_fraction = 0;
    EXPECT_EQ(prepare_shards({paths[0]}, dir_ / "out", no_val, *tok_).documents, 1u);
    EXPECT_FALSE(fs::exists(dir_ / "out/val_000000.bin"));

    // An input named like a shard in the output folder would be overwritten or removed: refused,
    // under another spelling of the folder too, and the input left as it was.
    const std::string shard_named = dir_.write("out/train_000000.bin", docs_[0] + "\n\n" + docs_[1]);
    PrepareOptions split;
    split.split_on_blank_lines = true;
    for (const std::string& out : {dir_ / "out", dir_ / "out/../out"})
        EXPECT_TRUE(mentions(error_of([&] { prepare_shards({shard_named}, out, split, *tok_); }),
                             "is named like a shard in the output folder"));
    EXPECT_EQ(read_bytes(shard_named), docs_[0] + "\n\n" + docs_[1]);
    EXPECT_EQ(prepare_shards({shard_named}, dir_ / "elsewhere", split, *tok_).documents, 2u);
}

// llm.c's tinyshakespeare.py writes 32,768 val + 305,260 train tokens for this text: the same
// sections and tokens make the same total here.
TEST_F(Prepare, TinyShakespeareMatchesLlmcTokenCount) {
    const std::string dir = find_data("", "tinyshakespeare.txt");
    if (dir.empty()) GTEST_SKIP() << "tinyshakespeare.txt not found (scripts/get_data.sh)";
    PrepareOptions opt;
    opt.split_on_blank_lines = true;
    const PrepareStats stats = prepare_shards({(fs::path(dir) / "tinyshakespeare.txt").string()}, dir_ / "out", opt, *tok_);
    EXPECT_EQ(stats.val_tokens + stats.train_tokens, 32768u + 305260u);
    EXPECT_NEAR(double(stats.val_tokens), 0.1 * 338028, 1000);
}
