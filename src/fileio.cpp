#include "fileio.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <signal.h>
#include <unistd.h>

#include "common.hpp"

namespace codagpt {
namespace {
constexpr const char* kTempInfix = ".tmp.";  // <path>.tmp.<pid>
}

AtomicFileWriter::AtomicFileWriter(std::string path)
    : path_(std::move(path)), tmp_(path_ + kTempInfix + std::to_string(getpid())) {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd_ < 0) throw Error("cannot create " + path_ + ": " + std::strerror(errno));
}

AtomicFileWriter::~AtomicFileWriter() { abandon(); }

void AtomicFileWriter::abandon() {
    if (fd_ < 0) return;
    ::close(fd_);
    ::unlink(tmp_.c_str());
    fd_ = -1;
}

void AtomicFileWriter::fail(const std::string& what) {
    const std::string reason = std::strerror(errno);
    abandon();
    throw Error(what + " " + path_ + ": " + reason);
}

void AtomicFileWriter::write(const void* data, size_t n) {
    if (fd_ < 0) throw Error("write to " + path_ + " after it was committed or abandoned");
    const char* p = static_cast<const char*>(data);
    for (size_t done = 0; done < n;) {
        // Linux writes at most ~2 GiB per call; larger requests simply come back short.
        const ssize_t k = ::write(fd_, p + done, n - done);
        if (k < 0) {
            if (errno == EINTR) continue;
            fail("cannot write");
        }
        done += (size_t)k;
    }
    written_ += n;
}

void AtomicFileWriter::commit() {
    if (fd_ < 0) throw Error("commit of " + path_ + " after it was committed or abandoned");
    if (::fsync(fd_) != 0) fail("cannot sync");
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) {
        const std::string reason = std::strerror(errno);
        ::unlink(tmp_.c_str());
        throw Error("cannot close " + tmp_ + ": " + reason);
    }
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
        const std::string reason = std::strerror(errno);
        ::unlink(tmp_.c_str());
        throw Error("cannot rename " + tmp_ + " to " + path_ + ": " + reason);
    }
    // The rename lives in the folder: sync it too, so that the new name survives a power loss.
    // Best effort: the file itself is complete either way.
    std::string dir = std::filesystem::path(path_).parent_path().string();
    if (dir.empty()) dir = ".";
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        ::fsync(dfd);
        ::close(dfd);
    }
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
    AtomicFileWriter out(path);
    out.write(bytes.data(), bytes.size());
    out.commit();
}

void create_folders(const std::string& dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw Error("cannot create folder " + one_line(dir) + ": " + ec.message());
}

void create_parent_folders(const std::string& path) {
    const std::filesystem::path parent = std::filesystem::path(path).parent_path();
    if (!parent.empty()) create_folders(parent.string());
}

void check_not_overwriting(const std::string& out, const std::string& input, const std::string& what) {
    namespace fs = std::filesystem;
    std::error_code ec, ec_out, ec_in;  // equivalent: false where either file does not exist yet
    const bool same_name = fs::weakly_canonical(out, ec_out) == fs::weakly_canonical(input, ec_in) && !ec_out && !ec_in;
    if (same_name || fs::equivalent(out, input, ec))
        throw Error("refusing to write " + one_line(out) + ": the same file as " + what + " " + one_line(input));
}

std::vector<OrphanedTemporary> orphaned_temporaries(const std::string& dir) {
    std::vector<OrphanedTemporary> found;
    std::error_code ec;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        const size_t at = name.rfind(kTempInfix);
        if (at == std::string::npos || at == 0) continue;
        const std::string pid = name.substr(at + std::strlen(kTempInfix));
        if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) continue;
        const long writer = std::stol(pid);
        if (writer <= 0 || writer == (long)::getpid() || ::kill((pid_t)writer, 0) == 0 || errno != ESRCH) continue;
        found.push_back({it->path().string(), (it->path().parent_path() / name.substr(0, at)).string()});
    }
    return found;
}

}  // namespace codagpt
