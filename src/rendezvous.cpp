#include "rendezvous.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common.hpp"
#include "posix_util.hpp"

namespace codagpt {

namespace {

constexpr char kMagic[8] = {'C', 'G', 'P', 'T', 'R', 'D', 'Z', 'V'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHelloSize = 32, kAnswerHeader = 16, kMaxMessage = 4096;

// Milliseconds left until deadline, at least 0, at most cap (poll takes an int).
int ms_left(Clock::time_point deadline, int cap = 1000) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return (int)std::clamp<long long>(ms, 0, cap);
}

void put_u32(uint8_t* p, uint32_t v) {
    v = htonl(v);
    std::memcpy(p, &v, 4);
}
uint32_t get_u32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return ntohl(v);
}

uint64_t fnv1a(const std::string& s) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h;
}

// Writes all bytes to a non-blocking socket before the deadline; false when the peer is gone or
// the time is up (errno says which).
bool send_all(int fd, const void* data, size_t n, Clock::time_point deadline) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
        const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);  // a vanished peer is an error, not SIGPIPE
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
        pollfd pfd{fd, POLLOUT, 0};
        const int left = ms_left(deadline);
        if (left == 0) {
            errno = ETIMEDOUT;
            return false;
        }
        if (::poll(&pfd, 1, left) < 0 && errno != EINTR) return false;
    }
    return true;
}

enum class ReadResult { ok, eof, timeout };

// Reads exactly n bytes from a non-blocking socket before the deadline. Throws on socket errors.
ReadResult recv_all(int fd, void* data, size_t n, Clock::time_point deadline, const std::string& peer) {
    char* p = static_cast<char*>(data);
    while (n > 0) {
        const ssize_t k = ::recv(fd, p, n, 0);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k == 0) return ReadResult::eof;
        if (errno == EINTR) continue;
        if (errno == ECONNRESET) return ReadResult::eof;
        if (errno != EAGAIN && errno != EWOULDBLOCK) throw_errno("rendezvous: cannot read from " + peer);
        pollfd pfd{fd, POLLIN, 0};
        const int left = ms_left(deadline);
        if (left == 0) return ReadResult::timeout;
        if (::poll(&pfd, 1, left) < 0 && errno != EINTR) throw_errno("rendezvous: poll");
    }
    return ReadResult::ok;
}

std::vector<uint8_t> answer(uint32_t status, const void* body, size_t n) {
    std::vector<uint8_t> a(kAnswerHeader + n);
    std::memcpy(a.data(), kMagic, 8);
    put_u32(a.data() + 8, status);
    put_u32(a.data() + 12, (uint32_t)n);
    std::memcpy(a.data() + kAnswerHeader, body, n);
    return a;
}

// Tells a peer why it is refused; it may already be gone, which changes nothing here.
void refuse(int fd, const std::string& why) {
    const std::vector<uint8_t> a = answer(1, why.data(), std::min(why.size(), kMaxMessage));
    send_all(fd, a.data(), a.size(), Clock::now() + std::chrono::seconds(2));
}

std::string seconds_text(double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g s", s);
    return buf;
}

// Rank 0: waits for every other rank's hello, then sends each the id.
UniqueId serve(const DistContext& ctx, uint64_t job, const std::function<UniqueId()>& create) {
    const std::string port = std::to_string(ctx.master_port);
    Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (listener.get() < 0) throw_errno("rendezvous: cannot create a socket");
    // A restarted job must be able to listen while the last one's connections sit in TIME_WAIT.
    const int one = 1;
    if (::setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0)
        throw_errno("rendezvous: setsockopt SO_REUSEADDR");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons((uint16_t)ctx.master_port);
    if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        const std::string hint = errno == EADDRINUSE ? " (another job on this port? choose one with --master-port)" : "";
        throw Error("rendezvous: rank 0 cannot listen on port " + port + ": " + std::strerror(errno) + hint);
    }
    if (::listen(listener.get(), std::min(ctx.world_size, 4096)) != 0) throw_errno("rendezvous: listen on port " + port);

    struct Pending {
        Fd fd;
        uint8_t hello[kHelloSize];
        size_t got = 0;
    };
    std::vector<Pending> pending;
    std::vector<Fd> joined(ctx.world_size);
    int n_joined = 0, foreign = 0;
    const auto deadline = deadline_after(ctx.start_timeout_s);

    // A hello is complete: keep the connection, refuse it, or fail the job.
    auto admit = [&](Pending& p) {
        const uint32_t version = get_u32(p.hello + 8), rank = get_u32(p.hello + 12), world = get_u32(p.hello + 16);
        const uint64_t peer_job = (uint64_t)get_u32(p.hello + 24) << 32 | get_u32(p.hello + 28);
        if (std::memcmp(p.hello, kMagic, 8) != 0) return;  // not a rendezvous peer (a port scan): drop it
        if (version != kVersion) {
            refuse(p.fd.get(), "rank 0 speaks rendezvous version " + std::to_string(kVersion) + ", this rank " +
                                   std::to_string(version) + " (different codagpt builds)");
            return;
        }
        if (peer_job != job) {  // someone else's job: theirs to fail, ours to keep waiting
            refuse(p.fd.get(), "port " + port + " belongs to another job (different command line or job id); "
                               "choose another with --master-port");
            foreign++;
            return;
        }
        std::string bad;
        if (world != (uint32_t)ctx.world_size)
            bad = "rank " + std::to_string(rank) + " has world size " + std::to_string(world) + ", rank 0 has " +
                  std::to_string(ctx.world_size);
        else if (rank == 0 || rank >= world)
            bad = "a rank joined as rank " + std::to_string(rank) + ", outside 1.." + std::to_string(world - 1);
        else if (joined[rank].get() >= 0)
            bad = "rank " + std::to_string(rank) + " joined twice (two processes with the same rank)";
        if (!bad.empty()) {
            refuse(p.fd.get(), bad);
            throw Error("rendezvous: " + bad);
        }
        joined[rank] = std::move(p.fd);
        n_joined++;
    };

    // Whatever stops rank 0 is told to every rank waiting on it, so that the job's error, from
    // whichever rank the launcher hears first, names the cause (the missing ranks, say).
    try {
        while (n_joined < ctx.world_size - 1) {
            if (Clock::now() >= deadline) {
                std::string missing;
                int listed = 0;
                for (int r = 1; r < ctx.world_size; r++) {
                    if (joined[r].get() >= 0) continue;
                    if (listed++ == 8) {
                        missing += ", ...";
                        break;
                    }
                    missing += (missing.empty() ? "" : ", ") + std::to_string(r);
                }
                throw Error("rendezvous timed out after " + seconds_text(ctx.start_timeout_s) + ": rank 0 (port " + port +
                            ") has " + std::to_string(n_joined) + " of " + std::to_string(ctx.world_size - 1) +
                            " other ranks; missing rank(s) " + missing +
                            (foreign ? "; refused " + std::to_string(foreign) + " connection(s) of another job" : ""));
            }
            std::vector<pollfd> fds{{listener.get(), POLLIN, 0}};
            for (const Pending& p : pending) fds.push_back({p.fd.get(), POLLIN, 0});
            if (::poll(fds.data(), fds.size(), ms_left(deadline)) < 0) {
                if (errno == EINTR) continue;
                throw_errno("rendezvous: poll");
            }
            for (size_t i = 1; i < fds.size(); i++) {
                if (!fds[i].revents) continue;
                Pending& p = pending[i - 1];
                const ssize_t k = ::recv(p.fd.get(), p.hello + p.got, kHelloSize - p.got, 0);
                if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
                if (k <= 0) {
                    p.fd.reset();  // the peer went away before its hello: it will retry or fail itself
                    continue;
                }
                p.got += (size_t)k;
                if (p.got == kHelloSize) {
                    admit(p);
                    p.fd.reset();  // admitted (moved out), refused or dropped: no longer pending
                }
            }
            pending.erase(std::remove_if(pending.begin(), pending.end(), [](const Pending& p) { return p.fd.get() < 0; }),
                          pending.end());
            if (fds[0].revents) {
                for (;;) {
                    const int c = ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
                    if (c >= 0) {
                        pending.push_back(Pending{Fd(c), {}, 0});
                        continue;
                    }
                    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
                    if (errno == EINTR || errno == ECONNABORTED) continue;
                    throw_errno("rendezvous: accept on port " + port);
                }
            }
        }
    } catch (const Error& e) {
        for (const Fd& fd : joined)
            if (fd.get() >= 0) refuse(fd.get(), e.what());
        throw;
    }

    const UniqueId id = create();
    const std::vector<uint8_t> a = answer(0, id.data(), id.size());
    for (int r = 1; r < ctx.world_size; r++)
        if (!send_all(joined[r].get(), a.data(), a.size(), deadline + std::chrono::seconds(10)))
            throw_errno("rendezvous: cannot send the id to rank " + std::to_string(r) + " (it left)");
    return id;
}

// One connection attempt to rank 0; an invalid Fd with the reason in `error` when it fails.
Fd try_connect(const DistContext& ctx, Clock::time_point deadline, std::string& error) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(ctx.master_addr.c_str(), std::to_string(ctx.master_port).c_str(), &hints, &found);
    if (rc != 0) {
        error = "cannot resolve '" + one_line(ctx.master_addr) + "': " + (rc == EAI_SYSTEM ? std::strerror(errno) : gai_strerror(rc));
        return Fd();
    }
    std::unique_ptr<addrinfo, void (*)(addrinfo*)> guard(found, ::freeaddrinfo);
    for (addrinfo* ai = found; ai; ai = ai->ai_next) {
        Fd s(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
        if (s.get() < 0) throw_errno("rendezvous: cannot create a socket");
        if (::connect(s.get(), ai->ai_addr, ai->ai_addrlen) == 0) return s;
        if (errno != EINPROGRESS) {
            error = std::strerror(errno);
            continue;
        }
        pollfd pfd{s.get(), POLLOUT, 0};
        const int n = ::poll(&pfd, 1, ms_left(deadline, 5000));
        if (n < 0) throw_errno("rendezvous: poll");
        if (n == 0) {
            error = "connection attempt timed out";
            continue;
        }
        int err = 0;
        socklen_t len = sizeof err;
        if (::getsockopt(s.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) throw_errno("rendezvous: getsockopt SO_ERROR");
        if (err == 0) return s;
        error = std::strerror(err);
    }
    return Fd();
}

// Ranks 1..N-1: connect to rank 0 (retrying until it listens), say hello, read the id.
UniqueId join(const DistContext& ctx, uint64_t job) {
    const std::string where = ctx.master_addr + ":" + std::to_string(ctx.master_port);
    const std::string me = "rank " + std::to_string(ctx.rank);
    const auto deadline = deadline_after(ctx.start_timeout_s);
    // Once connected, rank 0 is alive and answers by its own deadline, with the id or by closing
    // after its timeout error (which names the missing ranks, so it should be the error the job
    // reports). Its clock started when it did, perhaps later than ours: wait up to twice as long.
    const auto answer_deadline = deadline_after(2 * ctx.start_timeout_s);
    const std::string timed_out = "rendezvous timed out after " + seconds_text(ctx.start_timeout_s) + ": " + me;
    Fd s;
    std::string error = "no attempt finished";
    for (auto backoff = std::chrono::milliseconds(50);; backoff = std::min(backoff * 2, std::chrono::milliseconds(1000))) {
        s = try_connect(ctx, deadline, error);
        if (s.get() >= 0) break;
        if (Clock::now() + backoff >= deadline)
            throw Error(timed_out + " could not connect to rank 0 at " + where + " (last error: " + error + ")");
        std::this_thread::sleep_for(backoff);
    }

    uint8_t hello[kHelloSize] = {};
    std::memcpy(hello, kMagic, 8);
    put_u32(hello + 8, kVersion);
    put_u32(hello + 12, (uint32_t)ctx.rank);
    put_u32(hello + 16, (uint32_t)ctx.world_size);
    put_u32(hello + 24, (uint32_t)(job >> 32));
    put_u32(hello + 28, (uint32_t)job);
    const std::string closed = "rendezvous: rank 0 at " + where + " closed the connection before sending the id (it failed; see its error)";
    if (!send_all(s.get(), hello, sizeof hello, deadline)) {
        if (errno == ETIMEDOUT) throw Error(timed_out + " could not send its hello to rank 0 at " + where);
        throw Error(closed);
    }
    uint8_t head[kAnswerHeader];
    auto read_or_throw = [&](void* p, size_t n) {
        const ReadResult r = recv_all(s.get(), p, n, answer_deadline, "rank 0 at " + where);
        if (r == ReadResult::eof) throw Error(closed);
        if (r == ReadResult::timeout)
            throw Error("rendezvous timed out after " + seconds_text(2 * ctx.start_timeout_s) + ": " + me +
                        " reached rank 0 at " + where + ", which neither sent the id nor gave up");
    };
    read_or_throw(head, sizeof head);
    const uint32_t status = get_u32(head + 8), length = get_u32(head + 12);
    if (std::memcmp(head, kMagic, 8) != 0 || status > 1 || length > kMaxMessage || (status == 0 && length != 128))
        throw Error("rendezvous: " + where + " is not a codagpt rendezvous (unexpected answer)");
    std::string body(length, '\0');
    read_or_throw(body.data(), length);
    if (status == 1) throw Error("rendezvous: rank 0 at " + where + " answered " + me + " with an error: " + one_line(body));
    UniqueId id;
    std::memcpy(id.data(), body.data(), id.size());
    return id;
}

// The launcher's pipe takes one byte per process: a second exchange (a second communicator) must
// not write to a descriptor number that was closed and may have been reused.
std::atomic<bool> g_ready_reported{false};

// The launcher's pipe, kept open after start-up for report_progress(); -1 without a launcher.
std::atomic<int> g_progress_fd{-1};

void report_ready(int fd) {
    if (fd < 0 || g_ready_reported.exchange(true)) return;
    const char byte = 1;
    ssize_t k;
    do k = ::write(fd, &byte, 1);
    while (k < 0 && errno == EINTR);
    if (k != 1) throw_errno("cannot tell the launcher that start-up is done (CODAGPT_READY_FD=" + std::to_string(fd) + ")");
    // Progress reports must never block or kill the rank: a full pipe is skipped, and a launcher
    // that is gone (write to a closed pipe) is not a reason to die here (it signals its workers).
    const int flags = ::fcntl(fd, F_GETFL);
    if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0)
        throw_errno("cannot make CODAGPT_READY_FD=" + std::to_string(fd) + " non-blocking");
    ::signal(SIGPIPE, SIG_IGN);
    g_progress_fd = fd;
}

}  // namespace

UniqueId exchange_unique_id(const DistContext& ctx, const std::function<UniqueId()>& create) {
    const uint64_t job = fnv1a(ctx.job_key);
    const UniqueId id = ctx.world_size == 1 ? create() : ctx.rank == 0 ? serve(ctx, job, create) : join(ctx, job);
    report_ready(ctx.ready_fd);
    return id;
}

void report_progress() {
    const int fd = g_progress_fd;
    if (fd < 0) return;
    const char byte = 2;
    ssize_t k;
    do k = ::write(fd, &byte, 1);
    while (k < 0 && errno == EINTR);  // EAGAIN (full: progress already queued) and EPIPE are fine
}

UniqueId random_unique_id() {
    UniqueId id;
    Fd f(::open("/dev/urandom", O_RDONLY | O_CLOEXEC));
    if (f.get() < 0) throw_errno("cannot open /dev/urandom");
    for (size_t got = 0; got < id.size();) {
        const ssize_t k = ::read(f.get(), id.data() + got, id.size() - got);
        if (k < 0 && errno == EINTR) continue;
        if (k == 0) errno = EIO;
        if (k <= 0) throw_errno("cannot read /dev/urandom");
        got += (size_t)k;
    }
    return id;
}

}  // namespace codagpt
