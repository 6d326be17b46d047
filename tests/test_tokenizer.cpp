// The tokenizer against reference GPT-2 encodings: tests/data/tokenizer_cases.json and
// tokenizer_classes.json are written by tests/tools/gen_tokenizer_cases.py from OpenAI's encoder.py
// run with Python's `regex` module (cross-checked with the npm package gpt-3-encoder).
#include <gtest/gtest.h>
#include <unicode/uchar.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"
#include "test_util.hpp"
#include "tokenizer.hpp"

using codagpt::Tokenizer;
using codagpt::test::read_bytes;
using codagpt::test::ScopedEnv;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

bool has_tokenizer_files(const fs::path& dir) {
    return fs::is_regular_file(dir / "encoder.json") && fs::is_regular_file(dir / "vocab.bpe");
}

// Where find_tokenizer_dir() looks ($CODAGPT_DATA/gpt2, data/gpt2), then the shared data folder
// next to the checkout. Empty when none has the files.
std::string locate_tokenizer_dir() {
    try {
        return codagpt::find_tokenizer_dir();
    } catch (const codagpt::Error&) {
    }
    for (const fs::path& dir : {fs::path(CODAGPT_SOURCE_DIR) / "data" / "gpt2",
                               fs::path(CODAGPT_SOURCE_DIR) / ".." / "shared" / "data" / "gpt2"})
        if (has_tokenizer_files(dir)) return dir.string();
    return "";
}


void write_file(const fs::path& path, const std::string& contents) {
    std::ofstream(path, std::ios::binary) << contents;
}

json read_fixture(const char* name) {
    const std::string text = read_bytes(fs::path(CODAGPT_TEST_DATA) / name);
    if (text.empty()) throw std::runtime_error(std::string("missing fixture tests/data/") + name);
    return json::parse(text);
}

std::string from_hex(const std::string& hex) {
    std::string bytes;
    for (size_t i = 0; i + 1 < hex.size(); i += 2)
        bytes.push_back(char(std::stoi(hex.substr(i, 2), nullptr, 16)));
    return bytes;
}

std::string utf8(char32_t c) {
    std::string s;
    if (c < 0x80) {
        s += char(c);
    } else if (c < 0x800) {
        s += char(0xC0 | c >> 6);
        s += char(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
        s += char(0xE0 | c >> 12);
        s += char(0x80 | (c >> 6 & 0x3F));
        s += char(0x80 | (c & 0x3F));
    } else {
        s += char(0xF0 | c >> 18);
        s += char(0x80 | (c >> 12 & 0x3F));
        s += char(0x80 | (c >> 6 & 0x3F));
        s += char(0x80 | (c & 0x3F));
    }
    return s;
}

// The reference's text of a case: the string itself, or the bytes after U+FFFD replacement.
std::string case_text(const json& c) {
    return c.contains("text") ? c["text"].get<std::string>() : c["replaced"].get<std::string>();
}

// An environment variable set for one scope.
fs::path make_temp_dir() {
    std::string pattern = (fs::temp_directory_path() / "codagpt_tok_XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    return pattern;
}

class TokenizerTest : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        dir_ = locate_tokenizer_dir();
        if (!dir_.empty()) tok_.emplace(Tokenizer::load(dir_));
        cases_ = read_fixture("tokenizer_cases.json");
    }
    static void TearDownTestSuite() { tok_.reset(); }
    void SetUp() override {
        if (!tok_)
            GTEST_SKIP() << "GPT-2 tokenizer files not found in $CODAGPT_DATA/gpt2, data/gpt2 or "
                            "../shared/data/gpt2: run scripts/get_tokenizer.sh";
    }
    static const Tokenizer& tok() { return *tok_; }

    static inline std::string dir_;
    static inline std::optional<Tokenizer> tok_;
    static inline json cases_;
};

TEST_F(TokenizerTest, MatchesReferenceOnHardStrings) {
    int checked = 0;
    for (const json& c : cases_["cases"]) {
        if (!c.contains("text")) continue;
        EXPECT_EQ(tok().encode(c["text"].get<std::string>()), c["ids"].get<std::vector<int>>())
            << "case " << c["name"];
        ++checked;
    }
    EXPECT_GE(checked, 60);
}

TEST_F(TokenizerTest, PretokenizeMatchesReferenceRegex) {
    for (const json& c : cases_["cases"]) {
        const std::string input = c.contains("hex") ? from_hex(c["hex"]) : c["text"].get<std::string>();
        EXPECT_EQ(codagpt::pretokenize(input), c["pretokens"].get<std::vector<std::string>>())
            << "case " << c["name"];
    }
}

TEST_F(TokenizerTest, InvalidUtf8IsReplacedLikeTheReference) {
    int checked = 0;
    for (const json& c : cases_["cases"]) {
        if (!c.contains("hex")) continue;
        const auto expected = c["ids"].get<std::vector<int>>();
        EXPECT_EQ(tok().encode(from_hex(c["hex"])), expected) << "case " << c["name"];
        EXPECT_EQ(tok().encode(c["replaced"].get<std::string>()), expected) << "case " << c["name"];
        ++checked;
    }
    EXPECT_GE(checked, 15);
}

TEST_F(TokenizerTest, RoundTripsFixtureStrings) {
    for (const json& c : cases_["cases"]) {
        const std::string text = case_text(c);
        EXPECT_EQ(tok().decode(tok().encode(text)), text) << "case " << c["name"];
    }
}

// FNV-1a over the ids as little-endian 32-bit words, as the fixture generator computes it.
uint64_t fnv1a64(const std::vector<int>& ids) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int id : ids)
        for (int k = 0; k < 4; ++k) h = (h ^ (uint32_t(id) >> (8 * k) & 0xFF)) * 0x100000001b3ull;
    return h;
}

std::string find_tinyshakespeare() {
    std::vector<fs::path> candidates;
    if (const char* data = std::getenv("CODAGPT_DATA"))
        candidates.push_back(fs::path(data) / "tinyshakespeare.txt");
    candidates.push_back(fs::path(CODAGPT_SOURCE_DIR) / "data" / "tinyshakespeare.txt");
    candidates.push_back(fs::path(CODAGPT_SOURCE_DIR) / ".." / "shared" / "data" / "tinyshakespeare.txt");
    for (const fs::path& p : candidates)
        if (fs::is_regular_file(p)) return read_bytes(p);
    return "";
}

TEST_F(TokenizerTest, TinyShakespeareMatchesReferenceAndRoundTrips) {
    const std::string text = find_tinyshakespeare();
    if (text.empty())
        GTEST_SKIP() << "tinyshakespeare.txt not found in $CODAGPT_DATA, data/ or ../shared/data/";
    const std::vector<int> ids = tok().encode(text);
    EXPECT_EQ(tok().decode(ids), text);
    const json& ref = cases_["tinyshakespeare"];
    if (text.size() != ref["bytes"].get<size_t>())
        GTEST_SKIP() << "this tinyshakespeare.txt (" << text.size()
                     << " bytes) is not the fixture's: round trip checked only";
    EXPECT_EQ(ids.size(), ref["num_tokens"].get<size_t>());
    char hash[17];
    snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(fnv1a64(ids)));
    EXPECT_EQ(hash, ref["ids_fnv1a64"].get<std::string>());
}

TEST_F(TokenizerTest, DecodeRejectsIdsOutsideTheVocabulary) {
    EXPECT_EQ(tok().vocab_size(), 50257);
    EXPECT_EQ(tok().decode({Tokenizer::kEot}), "<|endoftext|>");
    EXPECT_THROW(tok().decode({15496, -1}), codagpt::Error);
    EXPECT_THROW(tok().decode({50257}), codagpt::Error);
    try {
        tok().decode({1, 2, 1 << 30});
        ADD_FAILURE() << "no error";
    } catch (const codagpt::Error& e) {
        EXPECT_NE(std::string(e.what()).find("1073741824"), std::string::npos) << e.what();
    }
}

TEST_F(TokenizerTest, LongWordsAndManyThreadsGiveTheSameIds) {
    // A long run of one class is one BPE word: this must stay fast (the heap, not O(n^2)).
    std::string word;
    for (int i = 0; i < 200000; ++i) word += char('a' + (i * 7 + i / 13) % 26);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(tok().decode(tok().encode(word)), word);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));

    std::string text;
    for (const json& c : cases_["cases"]) text += case_text(c);
    const std::vector<int> expected = tok().encode(text);
    std::vector<std::vector<int>> got(4);
    std::vector<std::thread> threads;
    for (auto& ids : got)
        threads.emplace_back([&] { for (int r = 0; r < 3; ++r) ids = tok().encode(text); });
    for (auto& t : threads) t.join();
    for (const auto& ids : got) EXPECT_EQ(ids, expected);
}

TEST_F(TokenizerTest, LoadErrorsNameTheFile) {
    const fs::path dir = make_temp_dir();
    auto expect_error = [&](const std::string& needle) {
        try {
            Tokenizer::load(dir.string());
            ADD_FAILURE() << "no error, expected one naming " << needle;
        } catch (const codagpt::Error& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        }
    };
    expect_error((dir / "encoder.json").string());  // missing
    write_file(dir / "encoder.json", "{\"a\": 0,");
    expect_error((dir / "encoder.json").string() + ": not valid JSON");
    write_file(dir / "encoder.json", read_bytes(fs::path(dir_) / "encoder.json"));
    expect_error((dir / "vocab.bpe").string());  // missing
    write_file(dir / "vocab.bpe", "#version: 0.2\n\xC4\xA0 t\nt h e\n");
    expect_error((dir / "vocab.bpe").string() + ":3: expected two tokens");
    write_file(dir / "vocab.bpe", "#version: 0.2\n\xC4\xA0 t\nt \xE2\x82\xAC\n");
    expect_error((dir / "vocab.bpe").string() + ":3:");
    fs::remove_all(dir);
}

// Every code point's class as the pre-tokenizer sees it, against Python's regex module. Needs no
// tokenizer files. Code points unassigned in either Unicode version (ICU's or the fixture's) are
// skipped unless both agree that they are unassigned, which makes them "other".
std::string class_seen(char32_t c) {
    const std::string ch = utf8(c);
    if (codagpt::pretokenize("a" + ch).size() == 1) return "letter";  // a letter run took it
    if (codagpt::pretokenize("1" + ch).size() == 1) return "number";
    if (codagpt::pretokenize("!" + ch).size() == 1) return "other";
    if (codagpt::pretokenize("\t" + ch).size() == 1) return "space";  // a trailing whitespace run
    return "none";
}

TEST(TokenizerClasses, EveryCodePointMatchesPythonRegex) {
    const json fixture = read_fixture("tokenizer_classes.json");
    const json& ranges = fixture["ranges"];
    int mismatches = 0, compared = 0;
    for (size_t r = 0; r < ranges.size(); ++r) {
        const char32_t first = ranges[r][0].get<char32_t>();
        const char32_t end = r + 1 < ranges.size() ? ranges[r + 1][0].get<char32_t>() : 0x110000;
        const std::string expected = ranges[r][1];
        for (char32_t c = first; c < end; ++c) {
            if (c >= 0xD800 && c <= 0xDFFF) continue;
            const bool icu_unassigned = u_charType(c) == U_UNASSIGNED;
            if (icu_unassigned != (expected == "unassigned")) continue;
            const std::string want = expected == "unassigned" ? "other" : expected;
            const std::string got = class_seen(c);
            ++compared;
            if (got != want && ++mismatches <= 10)
                ADD_FAILURE() << "U+" << std::hex << uint32_t(c) << ": pre-tokenizer sees " << got
                              << ", Python regex " << want;
        }
    }
    EXPECT_EQ(mismatches, 0);
    EXPECT_GT(compared, 1000000);
}

TEST(TokenizerFiles, FindTokenizerDirPrefersCodagptData) {
    const fs::path data = make_temp_dir();
    fs::create_directory(data / "gpt2");
    write_file(data / "gpt2" / "encoder.json", "{}");
    write_file(data / "gpt2" / "vocab.bpe", "#version: 0.2\n");
    {
        ScopedEnv env("CODAGPT_DATA", data.string());
        EXPECT_EQ(codagpt::find_tokenizer_dir(), (data / "gpt2").string());
    }
    fs::remove_all(data);
}

TEST(TokenizerFiles, FindTokenizerDirSaysHowToGetTheFiles) {
    const fs::path empty = make_temp_dir();
    const fs::path cwd = fs::current_path();
    ScopedEnv env("CODAGPT_DATA", empty.string());
    fs::current_path(empty);  // no data/gpt2 here
    try {
        codagpt::find_tokenizer_dir();
        ADD_FAILURE() << "no error";
    } catch (const codagpt::Error& e) {
        EXPECT_NE(std::string(e.what()).find("scripts/get_tokenizer.sh"), std::string::npos) << e.what();
    }
    fs::current_path(cwd);
    fs::remove_all(empty);
}

}  // namespace
