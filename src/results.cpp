#include "results.hpp"

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "common.hpp"
#include "fileio.hpp"

namespace codagpt {
namespace fs = std::filesystem;

namespace {
// The commit measured: $CODAGPT_COMMIT when set (a copy of the tree without .git, as on a
// lent GPU machine), else the checkout's HEAD; "unknown" otherwise.
std::string current_commit() {
    if (const char* env = std::getenv("CODAGPT_COMMIT"); env && *env) return env;
    std::string out;
    if (FILE* p = popen("git rev-parse --short=12 HEAD 2>/dev/null", "r")) {
        char buf[64];
        while (fgets(buf, sizeof buf, p)) out += buf;
        pclose(p);
    }
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    return out.empty() ? "unknown" : out;
}

std::string iso8601_now() {
    const std::time_t t = std::time(nullptr);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
    return buf;
}
}  // namespace

void stamp_record(nlohmann::json& record, const std::string& command) {
    record["commit"] = current_commit();
    record["date"] = iso8601_now();
    record["command"] = command;
}

nlohmann::json read_records(const std::string& path) {
    if (!fs::exists(path)) return nlohmann::json::array();
    std::ifstream f(path);
    nlohmann::json records = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
    if (!records.is_array()) throw Error(one_line(path) + ": not a JSON array of benchmark records; not touching it");
    return records;
}

void append_record(const std::string& path, const nlohmann::json& record) {
    nlohmann::json records = read_records(path);
    records.push_back(record);
    create_parent_folders(path);
    write_file_atomic(path, records.dump(2) + "\n");
}

std::string join_command(int argc, char** argv) {
    std::string s;
    for (int i = 0; i < argc; i++) {
        if (i) s += ' ';
        s += argv[i];
    }
    return s;
}

}  // namespace codagpt
