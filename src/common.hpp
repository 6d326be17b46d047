// Shared basics: the one error type every input-facing part throws, and small helpers.
#pragma once
#include <stdexcept>
#include <string>

namespace codagpt {

// Thrown for bad user input (config, data shard, checkpoint, flag, tokenizer files).
// main() prints "codagpt: error: <what>" on one line and exits non-zero, so the message
// must name the problem (file, key, offset) by itself.
struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// User or file text inside a one-line message: control characters escaped (\n, \u0001) and
// invalid UTF-8 replaced, as in a JSON string without its quotes.
std::string one_line(const std::string& s);

}  // namespace codagpt
