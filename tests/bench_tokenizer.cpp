// Single-thread tokenizer throughput on English text (TinyShakespeare by default).
//   bench_tokenizer [TEXT_FILE] [--reps N] [--json-out FILE]
// The text file defaults to the first of $CODAGPT_DATA/tinyshakespeare.txt,
// data/tinyshakespeare.txt and ../shared/data/tinyshakespeare.txt (relative to the working folder);
// the tokenizer files come from find_tokenizer_dir().
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "common.hpp"
#include "results.hpp"
#include "tokenizer.hpp"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw codagpt::Error("cannot open " + path);
    std::ostringstream contents;
    contents << in.rdbuf();
    return contents.str();
}

std::string default_text_path() {
    std::vector<fs::path> candidates;
    if (const char* data = std::getenv("CODAGPT_DATA"))
        candidates.push_back(fs::path(data) / "tinyshakespeare.txt");
    candidates.push_back("data/tinyshakespeare.txt");
    candidates.push_back("../shared/data/tinyshakespeare.txt");
    for (const fs::path& p : candidates)
        if (fs::is_regular_file(p)) return p.string();
    throw codagpt::Error("tinyshakespeare.txt not found in $CODAGPT_DATA, data/ or ../shared/data/: "
                         "pass a text file as the first argument");
}

std::string cpu_name() {
    std::ifstream cpuinfo("/proc/cpuinfo");
    for (std::string line; std::getline(cpuinfo, line);)
        if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
    return "unknown";
}

double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

int run(int argc, char** argv) {
    std::string text_path, json_out;
    int reps = 5;
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg == "--reps" && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
        else if (arg == "--json-out" && i + 1 < argc) json_out = argv[++i];
        else if (arg.rfind("--", 0) != 0 && text_path.empty()) text_path = arg;
        else
            throw codagpt::Error("unknown argument " + arg +
                                 " (usage: bench_tokenizer [TEXT_FILE] [--reps N] [--json-out FILE])");
    }
    if (!json_out.empty()) codagpt::read_records(json_out);  // a file it cannot append to, refused before timing
    if (text_path.empty()) text_path = default_text_path();
    const std::string text = read_file(text_path);

    auto start = Clock::now();
    const codagpt::Tokenizer tok = codagpt::Tokenizer::load(codagpt::find_tokenizer_dir());
    const double load_s = seconds_since(start);

    // The first pass fills the word cache; later passes show the steady state of a long corpus.
    start = Clock::now();
    const size_t tokens = tok.encode(text).size();
    const double cold_mb_s = text.size() / 1e6 / seconds_since(start);
    std::vector<double> mb_s;
    for (int r = 0; r < reps; ++r) {
        start = Clock::now();
        const size_t n = tok.encode(text).size();
        mb_s.push_back(text.size() / 1e6 / seconds_since(start));
        if (n != tokens) throw codagpt::Error("encode gave a different token count on repetition");
    }
    std::sort(mb_s.begin(), mb_s.end());
    const double median = mb_s[mb_s.size() / 2];
    std::printf("bench_tokenizer: %s: %zu bytes -> %zu tokens; load %.0f ms; first pass %.1f MB/s; "
                "median of %d passes %.1f MB/s (1 thread)\n",
                text_path.c_str(), text.size(), tokens, load_s * 1e3, cold_mb_s, reps, median);

    if (!json_out.empty()) {
        nlohmann::json record = {{"kind", "tokenizer"}, {"cpu", cpu_name()}, {"mb_s", median},
                                 {"mb_s_first_pass", cold_mb_s}, {"bytes", text.size()},
                                 {"tokens", tokens}, {"threads", 1}, {"load_ms", load_s * 1e3}};
        codagpt::stamp_record(record, codagpt::join_command(argc, argv));
        codagpt::append_record(json_out, record);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(argc, argv);
    } catch (const codagpt::Error& e) {
        std::fprintf(stderr, "bench_tokenizer: error: %s\n", e.what());
        return 1;
    }
}
