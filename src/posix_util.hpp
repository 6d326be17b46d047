// What the launcher and the rendezvous share: a file descriptor that closes itself, the one-line
// error for a failed system call, deadlines in fractional seconds.
#pragma once
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "common.hpp"

namespace codagpt {

// Error("<what>: <strerror(errno)>").
[[noreturn]] inline void throw_errno(const std::string& what) { throw Error(what + ": " + std::strerror(errno)); }

using Clock = std::chrono::steady_clock;

inline Clock::time_point deadline_after(double seconds) {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

class Fd {
public:
    explicit Fd(int fd = -1) : fd_(fd) {}
    Fd(Fd&& o) noexcept : fd_(o.release()) {}
    Fd& operator=(Fd&& o) noexcept {
        if (this != &o) reset(o.release());
        return *this;
    }
    ~Fd() { reset(); }
    // Closes the descriptor held. A failed close loses nothing here: these are sockets, pipes and
    // /dev/null, never files with data to flush.
    void reset(int fd = -1) {
        if (fd_ >= 0) ::close(fd_);
        fd_ = fd;
    }
    int release() { return std::exchange(fd_, -1); }
    int get() const { return fd_; }

private:
    int fd_;
};

}  // namespace codagpt
