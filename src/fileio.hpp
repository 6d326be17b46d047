// Writing files so that a crash or an error never leaves half a file behind.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace codagpt {

// Writes bytes to a temporary file beside `path`, fsyncs it, then renames it over `path`.
// On any failure the temporary file is removed, `path` is untouched, and Error names the file.
void write_file_atomic(const std::string& path, std::string_view bytes);

// The same, streamed, for files too large to build in memory (checkpoints): bytes go to
// `<path>.tmp.<pid>` as they are written; commit() fsyncs, renames over `path` and fsyncs the
// folder. Destroyed without commit() (an error, an exception while producing the bytes), it removes
// the temporary file and leaves `path` as it was. A crash before the rename can leave the
// temporary file behind, never a damaged `path` (orphaned_temporaries finds those).
class AtomicFileWriter {
public:
    explicit AtomicFileWriter(std::string path);  // throws Error when the temporary file cannot be made
    ~AtomicFileWriter();
    AtomicFileWriter(const AtomicFileWriter&) = delete;
    AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

    void write(const void* data, size_t n);  // throws Error (and abandons the file) on failure
    void commit();
    size_t bytes_written() const { return written_; }
    const std::string& temp_path() const { return tmp_; }

private:
    [[noreturn]] void fail(const std::string& what);
    void abandon();
    std::string path_, tmp_;
    int fd_ = -1;
    size_t written_ = 0;
};

// Creates folder `dir` and its missing parents (nothing where it exists). Error naming the folder
// where that fails (a file in the way, no permission).
void create_folders(const std::string& dir);
// The same for the folder that will hold file `path` (nothing for a bare file name).
void create_parent_folders(const std::string& path);

// Error where `out` is the same file as `input` (the same path, or the same file under another name
// or through a link), which writing `out` would replace: an output over the file it is made from,
// or over another output of the same command. `what` names `input` in the message ("--checkpoint").
void check_not_overwriting(const std::string& out, const std::string& input, const std::string& what);

// The temporary files in `dir` that AtomicFileWriters left behind in a crash (killed before
// commit() or the destructor ran): those whose writing process no longer runs on this host. Each
// with the path it was for, so that a caller deletes only the kinds of files it owns.
struct OrphanedTemporary {
    std::string path, target;
};
std::vector<OrphanedTemporary> orphaned_temporaries(const std::string& dir);

}  // namespace codagpt
