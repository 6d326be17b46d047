// Benchmark records in the project's one format (bench/results/*.json, see README "Benchmarks"):
// a JSON array of records, appended by the tools that measured them.
#pragma once
#include <string>
#include <nlohmann/json.hpp>

namespace codagpt {

// Adds the keys every record carries (commit, date, command) to `record`.
void stamp_record(nlohmann::json& record, const std::string& command);
// The records in `path`: an empty array where the file does not exist; Error where it is not a JSON
// array (a run that appends at its end reads its file first, so such a file is refused up front).
nlohmann::json read_records(const std::string& path);
// Appends `record` to the JSON array in `path` (created if missing, with its folder), atomically.
// A file that is not a JSON array is refused, not overwritten.
void append_record(const std::string& path, const nlohmann::json& record);
// The command line as one string (for the record's `command`).
std::string join_command(int argc, char** argv);

}  // namespace codagpt
