#include "fileio.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <unistd.h>

#include "common.hpp"

namespace codagpt {

void write_file_atomic(const std::string& path, std::string_view bytes) {
    const std::string tmp = path + ".tmp." + std::to_string(getpid());
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) throw Error("cannot create " + tmp + ": " + std::strerror(errno));
    auto fail = [&](const char* what) {
        const std::string reason = std::strerror(errno);
        ::close(fd);
        ::unlink(tmp.c_str());
        throw Error(std::string(what) + " " + path + ": " + reason);
    };
    for (size_t done = 0; done < bytes.size();) {
        const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0) {
            if (errno == EINTR) continue;
            fail("cannot write");
        }
        done += (size_t)n;
    }
    if (::fsync(fd) != 0) fail("cannot sync");
    if (::close(fd) != 0) {
        ::unlink(tmp.c_str());
        throw Error("cannot close " + tmp + ": " + std::strerror(errno));
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        const std::string reason = std::strerror(errno);
        ::unlink(tmp.c_str());
        throw Error("cannot rename " + tmp + " to " + path + ": " + reason);
    }
}

}  // namespace codagpt
