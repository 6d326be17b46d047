#include "launcher.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common.hpp"
#include "posix_util.hpp"

namespace codagpt {

ParsedLaunchArgs parse_launch_flags(const std::vector<std::string>& args) {
    ParsedLaunchArgs out;
    LaunchFlags& f = out.flags;
    for (size_t i = 0; i < args.size(); i++) {
        const std::string& a = args[i];
        const size_t eq = a.find('=');
        const std::string name = a.substr(0, eq);
        static const char* const kFlags[] = {"--nproc-per-node", "--nnodes", "--node-rank",
                                             "--master-addr", "--master-port", "--start-timeout",
                                             "--hang-timeout"};
        if (std::find(std::begin(kFlags), std::end(kFlags), name) == std::end(kFlags)) {
            out.rest.push_back(a);
            continue;
        }
        std::string value;
        if (eq != std::string::npos) {
            value = a.substr(eq + 1);
        } else {
            if (i + 1 == args.size()) throw Error(name + " needs a value");
            value = args[++i];
        }
        auto number = [&](long lo, long hi) { return (int)parse_whole_number(name, value, lo, hi); };
        if (name == "--nproc-per-node") f.nproc_per_node = number(1, 1024);
        if (name == "--nnodes") f.nnodes = number(1, 1 << 20);
        if (name == "--node-rank") f.node_rank = number(0, 1 << 20);
        if (name == "--master-port") f.master_port = number(1, 65535);
        if (name == "--start-timeout") f.start_timeout_s = number(1, 7 * 24 * 3600);
        if (name == "--hang-timeout") f.hang_timeout_s = number(0, 7 * 24 * 3600);
        if (name == "--master-addr") {
            if (value.empty()) throw Error("--master-addr needs a host name or address");
            f.master_addr = value;
        }
    }
    if ((f.nnodes || f.node_rank || f.hang_timeout_s) && !f.nproc_per_node)
        throw Error("--nnodes, --node-rank and --hang-timeout go with --nproc-per-node (a task of srun or mpirun is one "
                    "rank already)");
    if (f.nnodes && f.node_rank && *f.node_rank >= *f.nnodes)
        throw Error("--node-rank " + std::to_string(*f.node_rank) + " must be below --nnodes " + std::to_string(*f.nnodes));
    return out;
}

void apply_launch_flags(const LaunchFlags& f, Env& env) {
    if (f.nnodes) env["CODAGPT_NNODES"] = std::to_string(*f.nnodes);
    if (f.node_rank) env["CODAGPT_NODE_RANK"] = std::to_string(*f.node_rank);
    if (f.master_addr) env["CODAGPT_MASTER_ADDR"] = *f.master_addr;
    if (f.master_port) env["CODAGPT_MASTER_PORT"] = std::to_string(*f.master_port);
    if (f.start_timeout_s) env["CODAGPT_START_TIMEOUT"] = std::to_string(*f.start_timeout_s);
}

namespace {

// ---------------------------------------------------------------- signals, through a self-pipe

// The handler can reach nothing but a global: the write end of the launcher's self-pipe.
volatile sig_atomic_t g_signal_pipe = -1;

extern "C" void on_launcher_signal(int sig) {
    const int saved = errno;
    const unsigned char byte = (unsigned char)sig;
    if (g_signal_pipe >= 0) (void)!::write(g_signal_pipe, &byte, 1);  // full pipe: a wake-up is already queued
    errno = saved;
}

void make_pipe(Fd& r, Fd& w) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) throw_errno("launcher: cannot create a pipe");
    r = Fd(p[0]);
    w = Fd(p[1]);
    if (::fcntl(p[0], F_SETFL, O_NONBLOCK) != 0) throw_errno("launcher: cannot make a pipe non-blocking");
}

// Installs the launcher's handlers and the self-pipe; restores everything when it goes.
class SignalPipe {
public:
    SignalPipe() {
        make_pipe(read_, write_);
        if (::fcntl(write_.get(), F_SETFL, O_NONBLOCK) != 0) throw_errno("launcher: cannot make a pipe non-blocking");
        g_signal_pipe = write_.get();
        struct sigaction sa {};
        sa.sa_handler = on_launcher_signal;
        sigemptyset(&sa.sa_mask);
        sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
        for (int i = 0; i < 3; i++)
            if (::sigaction(kCaught[i], &sa, &old_[i]) != 0) throw_errno("launcher: sigaction");
        // A worker's stderr pipe or the terminal may go away: that is an error to report, not a death.
        struct sigaction ign {};
        ign.sa_handler = SIG_IGN;
        if (::sigaction(SIGPIPE, &ign, &old_pipe_) != 0) throw_errno("launcher: sigaction SIGPIPE");
    }
    ~SignalPipe() {
        for (int i = 0; i < 3; i++) ::sigaction(kCaught[i], &old_[i], nullptr);
        ::sigaction(SIGPIPE, &old_pipe_, nullptr);
        g_signal_pipe = -1;
    }
    SignalPipe(const SignalPipe&) = delete;
    SignalPipe& operator=(const SignalPipe&) = delete;
    int fd() const { return read_.get(); }
    static constexpr int kCaught[3] = {SIGINT, SIGTERM, SIGCHLD};

private:
    Fd read_, write_;
    struct sigaction old_[3] {}, old_pipe_ {};
};

std::string signal_name(int sig) {
    static const std::pair<int, const char*> names[] = {
        {SIGHUP, "SIGHUP"}, {SIGINT, "SIGINT"},   {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},   {SIGTRAP, "SIGTRAP"},
        {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"}, {SIGFPE, "SIGFPE"},   {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"},
        {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"}, {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"}, {SIGTERM, "SIGTERM"}};
    for (const auto& [n, name] : names)
        if (n == sig) return name;
    return "signal " + std::to_string(sig);
}

void write_all(int fd, const std::string& s) {
    for (size_t done = 0; done < s.size();) {
        const ssize_t k = ::write(fd, s.data() + done, s.size() - done);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return;  // our own stderr is gone: nobody is left to tell
        done += (size_t)k;
    }
}

// ---------------------------------------------------------------- workers

struct Worker {
    int rank = 0, local_rank = 0;
    pid_t pid = -1;
    Fd err, ready;  // read ends: its stderr, and its start-up pipe (then its progress reports)
    std::string partial;
    std::string last_line;  // the reason its failure is reported with: ": <error>" or " (last stderr line: ...)"
    bool is_ready = false, exited = false;
    Clock::time_point last_progress;  // of its last byte on `ready`
    int status = 0;
};

// Everything a child needs, prepared before fork: after it only async-signal-safe calls are allowed.
struct ChildPlan {
    std::vector<std::string> argv_s, env_s;
    std::vector<char*> argv, envp;
    int err_w = -1, ready_w = -1, devnull = -1;
    bool keep_stdout = false;
    pid_t parent = 0;
    std::string exec_error;  // written to the child's stderr when execve fails
};

[[noreturn]] void run_child(const ChildPlan& p) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != p.parent) ::_exit(1);  // the launcher died before the line above
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig : {SIGINT, SIGTERM, SIGCHLD, SIGPIPE}) ::sigaction(sig, &dfl, nullptr);
    // Its own process group is never the terminal's foreground one: under `stty tostop` rank 0's
    // writes to the launcher's terminal would stop it (SIGTTOU) and hang the job; ignored, they go
    // through. (Its stdin is /dev/null, so SIGTTIN cannot come.)
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    ::sigaction(SIGTTOU, &ign, nullptr);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    // dup2 clears close-on-exec on the copies; the start-up pipe keeps its number and is told by env.
    if (::dup2(p.devnull, 0) < 0 || (!p.keep_stdout && ::dup2(p.devnull, 1) < 0) || ::dup2(p.err_w, 2) < 0 ||
        ::fcntl(p.ready_w, F_SETFD, 0) != 0)
        ::_exit(126);
    ::execve(p.argv[0], p.argv.data(), p.envp.data());
    const int err = errno;
    (void)!::write(2, p.exec_error.data(), p.exec_error.size());
    // errno as digits: strerror is not async-signal-safe.
    char digits[16];
    int n = 0;
    for (int e = err; n == 0 || e > 0; e /= 10) digits[n++] = char('0' + e % 10);
    std::reverse(digits, digits + n);
    digits[n++] = '\n';
    (void)!::write(2, digits, n);
    ::_exit(127);
}

class Supervisor {
public:
    explicit Supervisor(const LaunchOptions& opt) : opt_(opt) {}
    ~Supervisor() {
        // Reached with live workers only when the launcher itself failed: leave none behind.
        for (Worker& w : workers_)
            if (w.pid > 0 && !w.exited) {
                ::kill(-w.pid, SIGKILL);
                ::waitpid(w.pid, nullptr, 0);
            }
    }

    int run() {
        const int world = opt_.nproc_per_node * opt_.node.nnodes;
        Fd devnull(::open("/dev/null", O_RDWR | O_CLOEXEC));
        if (devnull.get() < 0) throw_errno("launcher: cannot open /dev/null");
        for (int local = 0; local < opt_.nproc_per_node; local++) start_worker(local, world, devnull.get());
        const auto startup_deadline =
            deadline_after(opt_.node.start_timeout_s + opt_.startup_margin_s);
        std::optional<Clock::time_point> kill_at;

        while (std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return !w.exited; })) {
            const auto now = Clock::now();
            if (!failure_ && now >= startup_deadline)
                for (Worker& w : workers_)
                    if (!w.exited && !w.is_ready) {
                        char secs[32];
                        std::snprintf(secs, sizeof secs, "%g", opt_.node.start_timeout_s + opt_.startup_margin_s);
                        fail(describe(w) + " did not finish start-up (the rendezvous) within " + secs + " s", kill_at);
                        break;
                    }
            if (!failure_ && opt_.hang_timeout_s > 0) {
                // Named: the first silent rank; listed: the others (one hung rank soon leaves the
                // rest waiting for it in a collective, so progress alone cannot tell which one).
                Worker* hung = nullptr;
                std::string also;
                for (Worker& w : workers_)
                    if (!w.exited && w.is_ready && w.ready.get() >= 0 &&
                        std::chrono::duration<double>(now - w.last_progress).count() > opt_.hang_timeout_s) {
                        if (hung) also += (also.empty() ? "; silent too: rank " : ", rank ") + std::to_string(w.rank);
                        else hung = &w;
                    }
                if (hung) {
                    char secs[32];
                    std::snprintf(secs, sizeof secs, "%g", opt_.hang_timeout_s);
                    fail(describe(*hung) + " reported no progress for " + secs + " s (--hang-timeout): hung" + also,
                         kill_at);
                }
            }
            if (kill_at && now >= *kill_at) {
                signal_all(SIGKILL);
                kill_at.reset();
            }
            std::vector<pollfd> fds{{sig_.fd(), POLLIN, 0}};
            for (const Worker& w : workers_) {
                if (w.err.get() >= 0) fds.push_back({w.err.get(), POLLIN, 0});
                if (w.ready.get() >= 0) fds.push_back({w.ready.get(), POLLIN, 0});
            }
            // Wake for the next deadline, and at least every second so that a lost SIGCHLD costs
            // no more than that.
            auto next = now + std::chrono::seconds(1);
            const bool starting = std::any_of(workers_.begin(), workers_.end(),
                                              [](const Worker& w) { return !w.exited && !w.is_ready; });
            if (!failure_ && starting) next = std::min(next, startup_deadline);
            if (kill_at) next = std::min(next, *kill_at);
            const auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count();
            if (::poll(fds.data(), fds.size(), (int)std::max<long long>(wait_ms + 1, 0)) < 0 && errno != EINTR)
                throw_errno("launcher: poll");
            if (fds[0].revents) handle_signals(kill_at);
            for (Worker& w : workers_) {
                if (w.err.get() >= 0) drain(w);
                if (w.ready.get() >= 0) check_ready(w);
            }
            reap(kill_at);  // also here: a SIGCHLD may land between the reap and the poll above
        }
        for (Worker& w : workers_) flush_partial(w);
        if (failure_) throw Error(*failure_);
        return 0;
    }

private:
    void start_worker(int local, int world, int devnull) {
        Worker w;
        w.local_rank = local;
        w.rank = opt_.node.node_rank * opt_.nproc_per_node + local;
        Fd err_w, ready_w;
        make_pipe(w.err, err_w);
        make_pipe(w.ready, ready_w);

        ChildPlan p;
        p.argv_s = opt_.worker_argv;
        Env env = opt_.env;
        env["CODAGPT_RANK"] = std::to_string(w.rank);
        env["CODAGPT_WORLD_SIZE"] = std::to_string(world);
        env["CODAGPT_LOCAL_RANK"] = std::to_string(local);
        env["CODAGPT_LOCAL_WORLD_SIZE"] = std::to_string(opt_.nproc_per_node);
        env["CODAGPT_NODE_RANK"] = std::to_string(opt_.node.node_rank);
        env["CODAGPT_NNODES"] = std::to_string(opt_.node.nnodes);
        env["CODAGPT_MASTER_ADDR"] = opt_.node.master_addr;
        env["CODAGPT_MASTER_PORT"] = std::to_string(opt_.node.master_port);
        env["CODAGPT_START_TIMEOUT"] = std::to_string((long)std::ceil(opt_.node.start_timeout_s));
        env["CODAGPT_JOB_KEY"] = opt_.job_key;
        env["CODAGPT_READY_FD"] = std::to_string(ready_w.get());
        env.emplace("NCCL_NVLS_ENABLE", "0");  // emplace: a value the user set stays
        for (const auto& [k, v] : env) p.env_s.push_back(k + "=" + v);
        for (std::string& s : p.argv_s) p.argv.push_back(s.data());
        for (std::string& s : p.env_s) p.envp.push_back(s.data());
        p.argv.push_back(nullptr);
        p.envp.push_back(nullptr);
        p.err_w = err_w.get();
        p.ready_w = ready_w.get();
        p.devnull = devnull;
        p.keep_stdout = w.rank == 0;
        p.parent = ::getpid();
        p.exec_error = "codagpt: error: cannot execute " + opt_.worker_argv.at(0) + ": errno ";

        // Signals stay blocked across fork: a child must not run the launcher's handler, which
        // would write into the launcher's self-pipe. The child unblocks after resetting them.
        sigset_t all, old;
        sigfillset(&all);
        if (::sigprocmask(SIG_BLOCK, &all, &old) != 0) throw_errno("launcher: sigprocmask");
        w.pid = ::fork();
        if (w.pid == 0) run_child(p);
        const int fork_errno = errno;
        if (::sigprocmask(SIG_SETMASK, &old, nullptr) != 0) throw_errno("launcher: sigprocmask");
        errno = fork_errno;
        if (w.pid < 0) throw_errno("launcher: cannot start rank " + std::to_string(w.rank));
        // Also here, so that the group exists before any signal is sent to it; EACCES: the child
        // has already exec'd, after making the group itself.
        if (::setpgid(w.pid, w.pid) != 0 && errno != EACCES && errno != ESRCH)
            throw_errno("launcher: setpgid for rank " + std::to_string(w.rank));
        workers_.push_back(std::move(w));
    }

    std::string describe(const Worker& w) const {
        return "rank " + std::to_string(w.rank) + " (local rank " + std::to_string(w.local_rank) + " on node " +
               std::to_string(opt_.node.node_rank) + ", pid " + std::to_string(w.pid) + ")";
    }

    // The first failure stops the job: SIGTERM now, SIGKILL after the grace period.
    void fail(const std::string& why, std::optional<Clock::time_point>& kill_at) {
        if (failure_) return;
        failure_ = why;
        signal_all(SIGTERM);
        kill_at = deadline_after(opt_.kill_grace_s);
    }

    void signal_all(int sig) {
        for (const Worker& w : workers_)
            if (!w.exited && ::kill(-w.pid, sig) != 0 && errno != ESRCH)
                throw_errno("launcher: cannot send " + signal_name(sig) + " to rank " + std::to_string(w.rank));
    }

    void handle_signals(std::optional<Clock::time_point>& kill_at) {
        unsigned char buf[64];
        for (;;) {
            const ssize_t k = ::read(sig_.fd(), buf, sizeof buf);
            if (k < 0 && errno == EINTR) continue;
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
            if (k <= 0) throw_errno("launcher: cannot read its signal pipe");
            for (ssize_t i = 0; i < k; i++)
                if (buf[i] == SIGINT || buf[i] == SIGTERM) signal_all(buf[i]);  // each signal passed on once
        }
        reap(kill_at);
    }

    void reap(std::optional<Clock::time_point>& kill_at) {
        for (Worker& w : workers_) {
            if (w.exited) continue;
            int status = 0;
            const pid_t r = ::waitpid(w.pid, &status, WNOHANG);
            if (r == 0) continue;
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) throw_errno("launcher: waitpid for rank " + std::to_string(w.rank));
            w.exited = true;
            w.status = status;
            drain(w);  // everything it wrote before exiting is in the pipe now
            if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
            std::string why = describe(w) + (WIFSIGNALED(status) ? " was killed by " + signal_name(WTERMSIG(status))
                                                                 : " exited with code " + std::to_string(WEXITSTATUS(status)));
            flush_partial(w);
            why += w.last_line;
            fail(why, kill_at);
        }
    }

    // The first byte on a worker's pipe says start-up is done, every later one that it made progress.
    void check_ready(Worker& w) {
        char bytes[256];
        const ssize_t k = ::read(w.ready.get(), bytes, sizeof bytes);
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
        if (k > 0) {
            w.is_ready = true;
            w.last_progress = Clock::now();
            return;
        }
        w.ready.reset();  // end of file (it exited or closed the pipe) or an error: nothing more will come
    }

    // Passes on what a worker wrote to stderr, a line at a time.
    void drain(Worker& w) {
        char buf[4096];
        while (w.err.get() >= 0) {
            const ssize_t k = ::read(w.err.get(), buf, sizeof buf);
            if (k < 0 && errno == EINTR) continue;
            if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
            if (k <= 0) {  // end of file, or an error on our own pipe: nothing more will come
                w.err.reset();
                return;
            }
            w.partial.append(buf, (size_t)k);
            size_t nl;
            while ((nl = w.partial.find('\n')) != std::string::npos) {
                emit(w, w.partial.substr(0, nl));
                w.partial.erase(0, nl + 1);
            }
            if (w.partial.size() > 65536) flush_partial(w);  // a very long line: no unbounded buffer
        }
    }

    void flush_partial(Worker& w) {
        if (w.partial.empty()) return;
        emit(w, w.partial);
        w.partial.clear();
    }

    void emit(Worker& w, std::string line) {
        write_all(STDERR_FILENO, (w.rank == 0 ? "" : "[rank " + std::to_string(w.rank) + "] ") + line + "\n");
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty()) return;
        // An error line becomes the failure's reason (its "codagpt: error:" said once, by the
        // launcher); any other line is quoted as context only.
        static const std::string prefix = "codagpt: error: ";
        if (line.compare(0, prefix.size(), prefix) == 0)
            w.last_line = ": " + one_line(line.substr(prefix.size()));
        else
            w.last_line = " (last stderr line: " + one_line(line) + ")";
    }

    const LaunchOptions& opt_;
    SignalPipe sig_;
    std::vector<Worker> workers_;
    std::optional<std::string> failure_;
};

}  // namespace

int launch(const LaunchOptions& opt) {
    if (opt.nproc_per_node < 1) throw Error("--nproc-per-node must be at least 1, got " + std::to_string(opt.nproc_per_node));
    if (opt.worker_argv.empty()) throw Error("launcher: no worker command");
    // Checked here for a clear message; a child whose exec fails still says so on its stderr.
    if (::access(opt.worker_argv[0].c_str(), X_OK) != 0) throw_errno("launcher: cannot execute " + opt.worker_argv[0]);
    Supervisor s(opt);
    return s.run();
}

std::optional<int> run_launcher_if_requested(int& argc, char** argv) {
    if (argc < 2 || std::strcmp(argv[1], "train") != 0) return std::nullopt;
    try {
        const ParsedLaunchArgs parsed = parse_launch_flags(std::vector<std::string>(argv + 2, argv + argc));
        const LaunchFlags& f = parsed.flags;
        if (!f.any()) return std::nullopt;
        // Take the flags out of argv: CLI11 in main then sees only the trainer's own options. rest
        // is a subsequence of argv, so matching it greedily keeps exactly its strings, in order,
        // with argv's own pointers.
        int n = 2;
        for (int i = 2; i < argc; i++)
            if (n - 2 < (int)parsed.rest.size() && parsed.rest[n - 2] == argv[i]) argv[n++] = argv[i];
        argc = n;
        argv[argc] = nullptr;
        const bool help = std::any_of(parsed.rest.begin(), parsed.rest.end(),
                                      [](const std::string& a) { return a == "--help" || a == "-h"; });
        if (help) return std::nullopt;

        if (!f.nproc_per_node) {
            Env mine;
            apply_launch_flags(f, mine);
            for (const auto& [k, v] : mine)
                if (::setenv(k.c_str(), v.c_str(), 1) != 0) throw_errno("cannot set " + k);
            return std::nullopt;
        }

        LaunchOptions opt;
        opt.nproc_per_node = *f.nproc_per_node;
        opt.env = current_env();
        apply_launch_flags(f, opt.env);
        opt.node = node_plan_from(opt.env);
        if (f.hang_timeout_s) opt.hang_timeout_s = *f.hang_timeout_s;
        char exe[4096];
        const ssize_t len = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
        if (len < 0) throw_errno("launcher: cannot find its own executable (/proc/self/exe)");
        opt.worker_argv = {std::string(exe, (size_t)len)};
        opt.worker_argv.insert(opt.worker_argv.end(), argv + 1, argv + argc);
        // Every node's launcher derives the same key from the same command line and scheduler job;
        // the unit separator cannot occur inside an argument list that came through exec.
        opt.job_key = opt.node.scheduler_job;
        for (size_t i = 1; i < opt.worker_argv.size(); i++) opt.job_key += "\x1f" + opt.worker_argv[i];
        const int world = opt.nproc_per_node * opt.node.nnodes;
        std::fprintf(stderr, "codagpt launch: ranks %d-%d of %d on node %d of %d, rendezvous %s:%d\n",
                     opt.node.node_rank * opt.nproc_per_node, (opt.node.node_rank + 1) * opt.nproc_per_node - 1, world,
                     opt.node.node_rank, opt.node.nnodes, opt.node.master_addr.c_str(), opt.node.master_port);
        return launch(opt);
    } catch (const Error& e) {
        std::fprintf(stderr, "codagpt: error: %s\n", e.what());
        return 1;
    }
}

const char* launch_help() {
    return "Multi-GPU launch (read before the options above; see README \"Multi-GPU launch\"):\n"
           "  --nproc-per-node N   start N worker processes on this node, one per GPU, and supervise them\n"
           "  --nnodes M           nodes in the job (default 1; Slurm: SLURM_NNODES)\n"
           "  --node-rank K        this node's index, 0..M-1 (default 0; Slurm: SLURM_NODEID)\n"
           "  --master-addr HOST   host of rank 0, where the rendezvous listens (default: first Slurm node, or 127.0.0.1)\n"
           "  --master-port P      its TCP port (default 29500; under Slurm 29500 + job id % 1000)\n"
           "  --start-timeout S    seconds every rank may take to join the rendezvous (default 300)\n"
           "  --hang-timeout S     stop the job when a rank reports no progress (a training step) for S seconds\n"
           "                       (default 1800; 0: never)\n";
}

}  // namespace codagpt
