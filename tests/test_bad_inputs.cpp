// Every file of the kept fuzz corpus (tests/fuzz/corpus/<target>/) through its parser: accepted,
// or refused with a codagpt::Error whose message is one line. Any other exception fails the test;
// a crash fails the test binary. New crashes found by scripts/fuzz.sh land in these folders.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "fuzz_targets.hpp"

namespace fs = std::filesystem;
using namespace codagpt;

namespace {

const fs::path kCorpus = fs::path(CODAGPT_SOURCE_DIR) / "tests" / "fuzz" / "corpus";

std::vector<fs::path> files_of(const std::string& target) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(kCorpus / target))
        if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    return files;
}

class BadInputs : public ::testing::TestWithParam<fuzz::Target> {};

}  // namespace

TEST_P(BadInputs, AcceptedOrOneLineError) {
    const fuzz::Target t = GetParam();
#ifdef CODAGPT_HAVE_TOKENIZER
    if (std::string(t.name) == "tokenizer_encode") {
        try {
            find_tokenizer_dir();
        } catch (const Error& e) {
            GTEST_SKIP() << e.what();
        }
    }
#endif
    const auto files = files_of(t.name);
    ASSERT_GE(files.size(), 5u) << "corpus of " << t.name << " is missing";
    int refused = 0;
    for (const fs::path& f : files) {
        std::ifstream in(f, std::ios::binary);
        const std::string bytes((std::istreambuf_iterator<char>(in)), {});
        try {
            t.run(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
        } catch (const Error& e) {
            refused++;
            const std::string msg = e.what();
            EXPECT_FALSE(msg.empty()) << f;
            EXPECT_EQ(msg.find('\n'), std::string::npos) << f << ": " << msg;
        } catch (const std::exception& e) {
            ADD_FAILURE() << f << ": not a codagpt::Error: " << e.what();
        }
    }
    if (std::string(t.name) != "tokenizer_encode") {  // encode takes any bytes: nothing to refuse
        EXPECT_GT(refused, 0) << "a corpus of bad inputs that are all accepted";
    }
}

INSTANTIATE_TEST_SUITE_P(Corpus, BadInputs, ::testing::ValuesIn(fuzz::targets()),
                         [](const auto& info) { return std::string(info.param.name); });
