// Benchmark records in the project's one format (bench/results/*.json, see README "Benchmarks"):
// a JSON array of records, appended by the tools that measured them.
#pragma once
#include <string>
#include <nlohmann/json.hpp>

namespace codagpt {

// Adds the keys every record carries (commit, date, command) to `record`.
void stamp_record(nlohmann::json& record, const std::string& command);
// Appends `record` to the JSON array in `path` (created if missing), atomically.
// A file that is not a JSON array is refused, not overwritten.
void append_record(const std::string& path, const nlohmann::json& record);
// The command line as one string (for the record's `command`).
std::string join_command(int argc, char** argv);

}  // namespace codagpt
