// Writing files so that a crash or an error never leaves half a file behind.
#pragma once
#include <string>
#include <string_view>

namespace codagpt {

// Writes bytes to a temporary file beside `path`, fsyncs it, then renames it over `path`.
// On any failure the temporary file is removed, `path` is untouched, and Error names the file.
void write_file_atomic(const std::string& path, std::string_view bytes);

}  // namespace codagpt
