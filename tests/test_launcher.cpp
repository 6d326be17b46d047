// The multi-process launch path on the CPU: Slurm / Open MPI / CODAGPT_* environment parsing, the
// launch flags, the TCP rendezvous (threads as ranks, over loopback) and the launcher with stand-in
// worker processes (launcher_test_worker). Time bounds are generous on purpose: CI machines are
// small and loaded; each bound only has to separate "stopped" from "hung".
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <variant>

#include "launcher.hpp"
#include "rendezvous.hpp"
#include "test_util.hpp"

namespace codagpt {
namespace {

using test::error_of;
using test::mentions;
using test::read_bytes;
using test::TempDir;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---------------------------------------------------------------- environment parsing

TEST(LauncherEnv, ExpandsSlurmNodeLists) {
    const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
        {"gpu01", {"gpu01"}},
        {"a,b", {"a", "b"}},
        {"gpu[01-04,07]", {"gpu01", "gpu02", "gpu03", "gpu04", "gpu07"}},
        {"n[8-11]", {"n8", "n9", "n10", "n11"}},
        {"gpu[09-10]-ib,login1", {"gpu09-ib", "gpu10-ib", "login1"}},
        {"r[1-2]n[01-02]", {"r1n01", "r1n02", "r2n01", "r2n02"}},
        {"x[007]", {"x007"}},
    };
    for (const auto& [list, hosts] : cases) EXPECT_EQ(expand_slurm_nodelist(list), hosts) << list;
    const std::vector<std::pair<std::string, std::string>> bad = {
        {"gpu[01-", "unmatched '['"}, {"gpu01]", "unmatched ']'"}, {"gpu[3-1]", "bad range '3-1'"},
        {"gpu[a]", "bad range 'a'"},  {"", "empty host name"},      {"a,,b", "empty host name"},
        {"n[0-999999999]", "over a million hosts"},
    };
    for (const auto& [list, part] : bad) EXPECT_TRUE(mentions(error_of([&] { expand_slurm_nodelist(list); }), part)) << list;
}

TEST(LauncherEnv, ReadsSlurmTasksPerNode) {
    EXPECT_EQ(slurm_tasks_on_node("8", 0), 8);
    EXPECT_EQ(slurm_tasks_on_node("8(x2),4", 1), 8);
    EXPECT_EQ(slurm_tasks_on_node("8(x2),4", 2), 4);
    EXPECT_TRUE(mentions(error_of([] { slurm_tasks_on_node("8(x2),4", 3); }), "no entry for node 3"));
    EXPECT_TRUE(mentions(error_of([] { slurm_tasks_on_node("8(x2", 0); }), "closing ')'"));
    EXPECT_TRUE(mentions(error_of([] { slurm_tasks_on_node("eight", 0); }), "not a whole number"));
}

struct Want {
    int rank, world, local_rank, local_world, node_rank, nnodes;
    std::string addr;
    int port;
    std::string job_key, source;
};

void expect_context(const Env& env, const Want& w, const std::string& what) {
    SCOPED_TRACE(what);
    const DistContext c = dist_context_from(env);
    EXPECT_EQ(c.rank, w.rank);
    EXPECT_EQ(c.world_size, w.world);
    EXPECT_EQ(c.local_rank, w.local_rank);
    EXPECT_EQ(c.local_world_size, w.local_world);
    EXPECT_EQ(c.node_rank, w.node_rank);
    EXPECT_EQ(c.nnodes, w.nnodes);
    EXPECT_EQ(c.master_addr, w.addr);
    EXPECT_EQ(c.master_port, w.port);
    EXPECT_EQ(c.job_key, w.job_key);
    EXPECT_EQ(c.source, w.source);
}

const Env kSlurm = {{"SLURM_PROCID", "5"},        {"SLURM_NTASKS", "8"},      {"SLURM_LOCALID", "1"},
                    {"SLURM_NODEID", "1"},        {"SLURM_NNODES", "2"},      {"SLURM_JOB_NODELIST", "gpu[03-04]"},
                    {"SLURM_TASKS_PER_NODE", "4(x2)"}, {"SLURM_JOB_ID", "1234"}, {"SLURM_STEP_ID", "0"}};
const Env kOmpi = {{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                   {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                   {"OMPI_MCA_ess_base_jobid", "777"}};
const Env kOurs = {{"CODAGPT_RANK", "2"},       {"CODAGPT_WORLD_SIZE", "4"}, {"CODAGPT_LOCAL_RANK", "0"},
                   {"CODAGPT_LOCAL_WORLD_SIZE", "2"}, {"CODAGPT_NODE_RANK", "1"}, {"CODAGPT_NNODES", "2"},
                   {"CODAGPT_MASTER_ADDR", "head"}, {"CODAGPT_MASTER_PORT", "4000"}, {"CODAGPT_JOB_KEY", "k"}};

Env with(Env base, const Env& more) {
    for (const auto& [k, v] : more) base[k] = v;
    return base;
}

TEST(LauncherEnv, PrecedenceAndSources) {
    expect_context({}, {0, 1, 0, 1, 0, 1, "127.0.0.1", 29500, "", "single process"}, "nothing set");
    expect_context(kSlurm, {5, 8, 1, 4, 1, 2, "gpu03", 29734, "slurm:1234.0", "Slurm"}, "srun");
    expect_context(with(kSlurm, {{"SLURM_STEP_NUM_TASKS", "6"}, {"SLURM_STEP_NODELIST", "gpu04"},
                                 {"SLURM_STEP_TASKS_PER_NODE", "3(x2)"}}),
                   {5, 6, 1, 3, 1, 2, "gpu04", 29734, "slurm:1234.0", "Slurm"}, "srun step variables win");
    expect_context(kOmpi, {3, 4, 3, 4, 0, 1, "127.0.0.1", 29500, "ompi:777", "Open MPI"}, "mpirun, one node");
    expect_context(with(kOmpi, {{"CODAGPT_MASTER_ADDR", "h0"}, {"OMPI_COMM_WORLD_SIZE", "8"}}),
                   {3, 8, 3, 4, 0, 2, "h0", 29500, "ompi:777", "Open MPI"}, "mpirun, two nodes");
    expect_context(with(with(kSlurm, kOmpi), kOurs), {2, 4, 0, 2, 1, 2, "head", 4000, "k", "CODAGPT_* variables"},
                   "the launcher's variables win over Slurm and Open MPI");
    // mpirun inside a Slurm allocation: its processes inherit Slurm variables that do not describe
    // them (the steps that started mpirun's daemons); nothing is taken from those.
    expect_context(with(kSlurm, kOmpi), {3, 4, 3, 4, 0, 1, "127.0.0.1", 29500, "ompi:777", "Open MPI"},
                   "Open MPI wins over Slurm");
    expect_context(with(kSlurm, {{"CODAGPT_MASTER_ADDR", "10.0.0.1"}, {"CODAGPT_MASTER_PORT", "1234"}}),
                   {5, 8, 1, 4, 1, 2, "10.0.0.1", 1234, "slurm:1234.0", "Slurm"}, "flags win over the node list");
    // One process opens no socket, so a stray address variable does not fail it.
    expect_context({{"CODAGPT_MASTER_PORT", "0"}}, {0, 1, 0, 1, 0, 1, "127.0.0.1", 29500, "", "single process"},
                   "one process ignores the endpoint");
}

TEST(LauncherEnv, RefusesBadEnvironments) {
    const std::vector<std::pair<Env, std::string>> cases = {
        {with(kSlurm, {{"SLURM_PROCID", "abc"}}), "SLURM_PROCID=abc is not a whole number"},
        {with(kSlurm, {{"SLURM_PROCID", "\t1"}}), "is not a whole number"},
        {with(kSlurm, {{"SLURM_PROCID", "\n1"}}), "is not a whole number"},
        {with(with(kSlurm, kOmpi), {{"OMPI_COMM_WORLD_SIZE", "8"}}), "--master-addr"},  // not Slurm's node list
        {with(kSlurm, {{"SLURM_PROCID", "8"}}), "rank 8 is not below the world size 8 (from Slurm)"},
        {with(kSlurm, {{"SLURM_LOCALID", ""}}), "SLURM_LOCALID is not set"},
        {with(kSlurm, {{"SLURM_JOB_NODELIST", "gpu[03-"}}), "unmatched '['"},
        {{{"CODAGPT_RANK", "1"}}, "CODAGPT_WORLD_SIZE is not set"},
        {with(kOurs, {{"CODAGPT_MASTER_PORT", "70000"}}), "CODAGPT_MASTER_PORT=70000 is out of range (1 to 65535)"},
        {with(kOurs, {{"CODAGPT_LOCAL_RANK", "2"}}), "local rank 2 is not below the local world size 2"},
        {with(kOmpi, {{"OMPI_COMM_WORLD_SIZE", "8"}}), "--master-addr"},
        {with(kOmpi, {{"OMPI_COMM_WORLD_LOCAL_SIZE", "-1"}}), "OMPI_COMM_WORLD_LOCAL_SIZE=-1 is out of range"},
    };
    for (const auto& [env, part] : cases) EXPECT_TRUE(mentions(error_of([&] { dist_context_from(env); }), part));
}

TEST(LauncherEnv, NodePlanForTheLauncher) {
    const NodePlan single = node_plan_from({});
    EXPECT_EQ(single.nnodes, 1);
    EXPECT_EQ(single.master_addr, "127.0.0.1");
    const NodePlan slurm = node_plan_from(kSlurm);  // srun with one launcher per node
    EXPECT_EQ(slurm.nnodes, 2);
    EXPECT_EQ(slurm.node_rank, 1);
    EXPECT_EQ(slurm.master_addr, "gpu03");
    EXPECT_EQ(slurm.scheduler_job, "slurm:1234.0");
    const NodePlan flags = node_plan_from(with(kSlurm, {{"CODAGPT_NNODES", "3"}, {"CODAGPT_NODE_RANK", "2"}}));
    EXPECT_EQ(flags.nnodes, 3);
    EXPECT_EQ(flags.node_rank, 2);
    EXPECT_TRUE(mentions(error_of([] { node_plan_from({{"CODAGPT_NNODES", "2"}}); }), "--master-addr"));
    EXPECT_TRUE(mentions(error_of([] { node_plan_from({{"CODAGPT_NNODES", "2"}, {"CODAGPT_NODE_RANK", "2"}}); }),
                         "node rank 2 is not below the node count 2"));
}

// ---------------------------------------------------------------- flags

TEST(LauncherFlags, TakesOutTheLaunchFlags) {
    const ParsedLaunchArgs p = parse_launch_flags({"--steps", "5", "--nproc-per-node=4", "--master-addr", "h0",
                                                   "--master-port", "29501", "--nnodes", "2", "--node-rank=1", "-q"});
    EXPECT_EQ(p.flags.nproc_per_node, 4);
    EXPECT_EQ(p.flags.master_addr, "h0");
    EXPECT_EQ(p.flags.master_port, 29501);
    EXPECT_EQ(p.flags.nnodes, 2);
    EXPECT_EQ(p.flags.node_rank, 1);
    EXPECT_EQ(p.rest, (std::vector<std::string>{"--steps", "5", "-q"}));
    Env env;
    apply_launch_flags(p.flags, env);
    EXPECT_EQ(env, (Env{{"CODAGPT_MASTER_ADDR", "h0"}, {"CODAGPT_MASTER_PORT", "29501"},
                        {"CODAGPT_NNODES", "2"}, {"CODAGPT_NODE_RANK", "1"}}));
    EXPECT_FALSE(parse_launch_flags({"--steps", "5"}).flags.any());
}

TEST(LauncherFlags, RefusesBadFlags) {
    const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
        {{"--nproc-per-node", "0"}, "--nproc-per-node=0 is out of range (1 to 1024)"},
        {{"--nproc-per-node=-2"}, "--nproc-per-node=-2 is out of range"},
        {{"--nproc-per-node", "two"}, "--nproc-per-node=two is not a whole number"},
        {{"--nproc-per-node"}, "--nproc-per-node needs a value"},
        {{"--nproc-per-node", "2", "--master-port", "70000"}, "--master-port=70000 is out of range (1 to 65535)"},
        {{"--master-port=0"}, "--master-port=0 is out of range"},
        {{"--master-addr="}, "--master-addr needs a host"},
        {{"--nnodes", "2"}, "go with --nproc-per-node"},
        {{"--nproc-per-node", "2", "--nnodes", "2", "--node-rank", "2"}, "--node-rank 2 must be below --nnodes 2"},
        {{"--start-timeout", "0"}, "--start-timeout=0 is out of range"},
        {{"--nproc-per-node", "2", "--hang-timeout", "-1"}, "--hang-timeout=-1 is out of range"},
        {{"--hang-timeout", "60"}, "--hang-timeout go with --nproc-per-node"},
    };
    for (const auto& [args, part] : cases) EXPECT_TRUE(mentions(error_of([&] { parse_launch_flags(args); }), part));
}

TEST(LauncherFlags, MainSeesArgvWithoutThem) {
    // Without --nproc-per-node this process is a worker (as under srun): the flags leave argv and
    // become the variables dist_context_from_env reads.
    std::vector<std::string> args = {"codagpt", "train", "--master-port", "29999", "--steps", "3"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int argc = (int)args.size();
    unsetenv("CODAGPT_MASTER_PORT");
    EXPECT_FALSE(run_launcher_if_requested(argc, argv.data()).has_value());
    ASSERT_EQ(argc, 4);
    EXPECT_STREQ(argv[2], "--steps");
    EXPECT_STREQ(argv[3], "3");
    EXPECT_EQ(argv[4], nullptr);
    ASSERT_NE(std::getenv("CODAGPT_MASTER_PORT"), nullptr);
    EXPECT_STREQ(std::getenv("CODAGPT_MASTER_PORT"), "29999");
    unsetenv("CODAGPT_MASTER_PORT");
    // A bad flag: exit code 1 (the message goes to stderr), no launch.
    std::vector<std::string> bad = {"codagpt", "train", "--nproc-per-node", "0"};
    std::vector<char*> bad_argv;
    for (std::string& a : bad) bad_argv.push_back(a.data());
    bad_argv.push_back(nullptr);
    int bad_argc = (int)bad.size();
    EXPECT_EQ(run_launcher_if_requested(bad_argc, bad_argv.data()), 1);
}

// ---------------------------------------------------------------- rendezvous (threads as ranks)

// A port that was free a moment ago.
int free_port() {
    const int s = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (s < 0 || bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0)
        throw std::runtime_error("no free port");
    close(s);
    return ntohs(a.sin_port);
}

DistContext rank_context(int rank, int world, int port, double timeout_s = 10, std::string job = "job") {
    DistContext c;
    c.rank = c.local_rank = rank;
    c.world_size = c.local_world_size = world;
    c.master_port = port;
    c.start_timeout_s = timeout_s;
    c.job_key = std::move(job);
    return c;
}

using Outcome = std::variant<UniqueId, std::string>;  // the id, or the error message

// Runs every context's exchange on its own thread; rank 0 starts last, so the others first meet a
// refused connection and retry.
std::vector<Outcome> exchange_all(const std::vector<DistContext>& ctxs, const UniqueId& id, int* created = nullptr) {
    std::vector<Outcome> out(ctxs.size());
    std::vector<std::thread> threads;
    auto run = [&](size_t i) {
        try {
            out[i] = exchange_unique_id(ctxs[i], [&] {
                if (created) ++*created;
                return id;
            });
        } catch (const Error& e) {
            out[i] = std::string(e.what());
        }
    };
    for (size_t i = 0; i < ctxs.size(); i++)
        if (ctxs[i].rank != 0) threads.emplace_back(run, i);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (size_t i = 0; i < ctxs.size(); i++)
        if (ctxs[i].rank == 0) threads.emplace_back(run, i);
    for (std::thread& t : threads) t.join();
    return out;
}

std::string error_in(const Outcome& o) {
    if (const std::string* e = std::get_if<std::string>(&o)) return *e;
    ADD_FAILURE() << "no error";
    return "";
}

TEST(LauncherRendezvous, EveryRankGetsRankZerosId) {
    const int port = free_port(), world = 6;
    std::vector<DistContext> ctxs;
    for (int r = 0; r < world; r++) ctxs.push_back(rank_context(r, world, port));
    const UniqueId id = random_unique_id();
    int created = 0;
    const std::vector<Outcome> out = exchange_all(ctxs, id, &created);
    EXPECT_EQ(created, 1);  // only rank 0 creates
    for (int r = 0; r < world; r++) {
        ASSERT_TRUE(std::holds_alternative<UniqueId>(out[r])) << "rank " << r << ": " << std::get<std::string>(out[r]);
        EXPECT_EQ(std::get<UniqueId>(out[r]), id) << "rank " << r;
    }
    // One rank needs no rendezvous: no socket, create() once.
    created = 0;
    EXPECT_EQ(std::get<UniqueId>(exchange_all({rank_context(0, 1, port)}, id, &created)[0]), id);
    EXPECT_EQ(created, 1);
}

TEST(LauncherRendezvous, WrongWorldSizeFailsBothSides) {
    const int port = free_port();
    const std::vector<Outcome> out = exchange_all({rank_context(0, 2, port), rank_context(1, 3, port)}, random_unique_id());
    EXPECT_TRUE(mentions(error_in(out[0]), "rank 1 has world size 3, rank 0 has 2"));
    EXPECT_TRUE(mentions(error_in(out[1]), "answered rank 1 with an error: rank 1 has world size 3, rank 0 has 2"));
}

TEST(LauncherRendezvous, DuplicateRankFailsTheJob) {
    const int port = free_port();
    const std::vector<Outcome> out = exchange_all(
        {rank_context(0, 3, port), rank_context(1, 3, port), rank_context(1, 3, port)}, random_unique_id());
    for (const Outcome& o : out) EXPECT_TRUE(mentions(error_in(o), "rank 1 joined twice"));
}

TEST(LauncherRendezvous, PeerOfAnotherJobIsRefused) {
    const int port = free_port();
    const std::vector<Outcome> out = exchange_all(
        {rank_context(0, 2, port, /*timeout_s=*/1.5, "job A"), rank_context(1, 2, port, 10, "job B")}, random_unique_id());
    EXPECT_TRUE(mentions(error_in(out[1]), "belongs to another job"));
    // Rank 0 keeps waiting for its own rank 1, then says what it saw.
    EXPECT_TRUE(mentions(error_in(out[0]), "rendezvous timed out after 1.5 s"));
    EXPECT_TRUE(mentions(error_in(out[0]), "refused 1 connection(s) of another job"));
}

TEST(LauncherRendezvous, HungRendezvousTimesOutNamingTheMissingRanks) {
    const int port = free_port();
    const auto t0 = Clock::now();
    // Rank 2 never comes.
    const std::vector<Outcome> out = exchange_all({rank_context(0, 4, port, 1), rank_context(1, 4, port, 10),
                                                   rank_context(3, 4, port, 10)}, random_unique_id());
    EXPECT_TRUE(mentions(error_in(out[0]), "rendezvous timed out after 1 s: rank 0 (port " + std::to_string(port) +
                                               ") has 2 of 3 other ranks; missing rank(s) 2"));
    // The waiting ranks learn at once why rank 0 gave up, not at their own (10 s) timeout.
    for (int i : {1, 2}) {
        EXPECT_TRUE(mentions(error_in(out[i]), "with an error: rendezvous timed out after 1 s"));
        EXPECT_TRUE(mentions(error_in(out[i]), "missing rank(s) 2"));
    }
    EXPECT_LT(seconds_since(t0), 8.0);
}

TEST(LauncherRendezvous, NobodyListeningTimesOutWithTheLastError) {
    const int port = free_port();
    const std::vector<Outcome> out = exchange_all({rank_context(1, 2, port, 1)}, random_unique_id());
    EXPECT_TRUE(mentions(error_in(out[0]), "rendezvous timed out after 1 s: rank 1 could not connect to rank 0 at 127.0.0.1:" +
                                               std::to_string(port) + " (last error: Connection refused)"));
}

TEST(LauncherRendezvous, UnknownHostIsNamed) {
    DistContext c = rank_context(1, 2, free_port(), 1);
    c.master_addr = "no-such-host.invalid";
    EXPECT_TRUE(mentions(error_in(exchange_all({c}, random_unique_id())[0]), "cannot resolve 'no-such-host.invalid'"));
}

TEST(LauncherRendezvous, PortInUseIsNamed) {
    const int s = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    socklen_t len = sizeof a;
    ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(listen(s, 1), 0);
    ASSERT_EQ(getsockname(s, reinterpret_cast<sockaddr*>(&a), &len), 0);
    const int port = ntohs(a.sin_port);
    const std::string e = error_of([&] { exchange_unique_id(rank_context(0, 2, port), random_unique_id); });
    EXPECT_TRUE(mentions(e, "rank 0 cannot listen on port " + std::to_string(port) + ": Address already in use"));
    EXPECT_TRUE(mentions(e, "--master-port"));
    close(s);
}

// ---------------------------------------------------------------- the launcher, with worker processes

// Workers that run launcher_test_worker DIR MODE ARGS... in a clean environment (no Slurm or MPI
// variables leaking in from the machine that runs the tests).
LaunchOptions worker_options(int n, const TempDir& dir, std::vector<std::string> mode, double start_timeout_s = 10) {
    LaunchOptions opt;
    opt.nproc_per_node = n;
    opt.node.master_addr = "127.0.0.1";
    opt.node.master_port = free_port();
    opt.node.start_timeout_s = start_timeout_s;
    opt.worker_argv = {LAUNCHER_TEST_WORKER, dir.path.string()};
    opt.worker_argv.insert(opt.worker_argv.end(), mode.begin(), mode.end());
    for (const auto& [k, v] : current_env())
        if (k.rfind("CODAGPT_", 0) != 0 && k.rfind("SLURM_", 0) != 0 && k.rfind("OMPI_", 0) != 0 && k != "NCCL_NVLS_ENABLE")
            opt.env[k] = v;
    opt.job_key = "test";
    opt.kill_grace_s = 2;
    return opt;
}

bool wait_for_files(const TempDir& dir, int n, const char* suffix, double timeout_s) {
    const auto t0 = Clock::now();
    for (;;) {
        int found = 0;
        for (int r = 0; r < n; r++) found += std::filesystem::exists(dir / ("rank_" + std::to_string(r) + "." + suffix));
        if (found == n) return true;
        if (seconds_since(t0) > timeout_s) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
}

// Runs launch(opt) in a child process with its stdout and stderr in files, as `codagpt` would run;
// returns the child's pid.
pid_t launch_in_child(const LaunchOptions& opt, const std::string& out, const std::string& err) {
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid != 0) return pid;
    freopen(out.c_str(), "w", stdout);
    freopen(err.c_str(), "w", stderr);
    int rc;
    try {
        rc = launch(opt);
    } catch (const Error& e) {
        std::fprintf(stderr, "codagpt: error: %s\n", e.what());
        rc = 1;
    }
    std::fflush(nullptr);
    _exit(rc);
}

// The child's exit status, or -1 when it is still running after timeout_s (it is then killed).
int wait_child(pid_t pid, double timeout_s) {
    const auto t0 = Clock::now();
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (seconds_since(t0) > timeout_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return status;
}

// Runs a launch that must fail, in a child, with a bound: a launcher that hangs fails the test
// instead of hanging it. Returns the launcher's error line (the last line of its stderr).
std::string launch_error(const LaunchOptions& opt, const TempDir& dir, double bound_s = 20) {
    const pid_t pid = launch_in_child(opt, dir / "out.txt", dir / "err.txt");
    const int status = wait_child(pid, bound_s);
    const std::string err = read_bytes(dir / "err.txt");
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << "status " << status << ", stderr:\n" << err;
    const size_t start = err.rfind('\n', err.size() - 2);
    return err.substr(start == std::string::npos ? 0 : start + 1);
}

TEST(Launcher, WorkersShareOneIdAndGetTheirRanks) {
    TempDir dir;
    const int n = 4;
    const pid_t pid = launch_in_child(worker_options(n, dir, {"exchange"}), dir / "out.txt", dir / "err.txt");
    const int status = wait_child(pid, 30);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << ", stderr:\n" << read_bytes(dir / "err.txt");
    const std::string id0 = read_bytes(dir / "rank_0.id");
    EXPECT_EQ(id0.size(), 256u);
    for (int r = 0; r < n; r++) {
        EXPECT_EQ(read_bytes(dir / ("rank_" + std::to_string(r) + ".id")), id0) << "rank " << r;
        // rank, world size, local rank, local world size, NCCL_NVLS_ENABLE
        EXPECT_EQ(read_bytes(dir / ("rank_" + std::to_string(r) + ".env")),
                  std::to_string(r) + " 4 " + std::to_string(r) + " 4 0");
    }
    // Rank 0's stdout passes through, the others' is quiet; stderr: rank 0 as is, others prefixed.
    EXPECT_EQ(read_bytes(dir / "out.txt"), "stdout from rank 0\n");
    const std::string err = read_bytes(dir / "err.txt");
    EXPECT_TRUE(mentions(err, "stderr from rank 0\n"));
    EXPECT_TRUE(mentions(err, "[rank 3] stderr from rank 3\n"));
    EXPECT_EQ(err.find("[rank 0]"), std::string::npos);
}

TEST(Launcher, KeepsTheUsersNvlsSetting) {
    TempDir dir;
    LaunchOptions opt = worker_options(1, dir, {"exchange"});
    opt.env["NCCL_NVLS_ENABLE"] = "1";
    EXPECT_EQ(launch(opt), 0);
    EXPECT_EQ(read_bytes(dir / "rank_0.env"), "0 1 0 1 1");
}

TEST(Launcher, CrashTakesTheJobDownNamingTheRank) {
    TempDir dir;
    const std::string e = launch_error(worker_options(3, dir, {"crash", "1", "3"}), dir);
    EXPECT_TRUE(mentions(e, "codagpt: error: rank 1 ("));
    EXPECT_TRUE(mentions(e, "rank 1 (local rank 1 on node 0, pid "));
    EXPECT_TRUE(mentions(e, "exited with code 3 (last stderr line: boom on rank 1)"));
    // The others were asked to stop, and stopped cleanly (as the trainer does on SIGTERM).
    for (int r : {0, 2}) EXPECT_EQ(read_bytes(dir / ("rank_" + std::to_string(r) + ".term")), "SIGTERM") << "rank " << r;
}

TEST(Launcher, KilledWorkerIsNamedWithItsSignal) {
    TempDir dir;
    const std::string e = launch_error(worker_options(2, dir, {"crash", "0", "KILL"}), dir);
    EXPECT_TRUE(mentions(e, "rank 0 (local rank 0 on node 0, pid "));
    EXPECT_TRUE(mentions(e, "was killed by SIGKILL (last stderr line: boom on rank 0)"));
}

// A rank that stops reporting progress (a hang after start-up) stops the job within --hang-timeout,
// named; ranks that keep reporting are not (rank 0 comes first in the check: were its reports
// ignored, it would be the one named).
TEST(Launcher, HungWorkerTakesTheJobDownNamingTheRank) {
    TempDir dir;
    LaunchOptions opt = worker_options(3, dir, {"hang", "1"});
    opt.hang_timeout_s = 1.5;
    opt.kill_grace_s = 0.5;
    const Clock::time_point t0 = Clock::now();
    const std::string e = launch_error(opt, dir);
    EXPECT_TRUE(mentions(e, "rank 1 (local rank 1 on node 0, pid "));
    EXPECT_TRUE(mentions(e, "reported no progress for 1.5 s (--hang-timeout): hung"));
    EXPECT_LT(seconds_since(t0), 10.0);
}

TEST(Launcher, WorkersIgnoringSigtermAreKilledAfterTheGracePeriod) {
    TempDir dir;
    LaunchOptions opt = worker_options(3, dir, {"stubborn", "2"});
    opt.kill_grace_s = 0.5;
    const std::string e = launch_error(opt, dir);
    EXPECT_TRUE(mentions(e, "rank 2 (local rank 2 on node 0, pid "));
    EXPECT_TRUE(mentions(e, "exited with code 1 (last stderr line: boom on rank 2)"));
}

TEST(Launcher, ProgramThatCannotRunIsReported) {
    TempDir dir;
    LaunchOptions opt = worker_options(2, dir, {});
    opt.worker_argv = {dir / "no_such_program"};
    const std::string e = error_of([&] { launch(opt); });
    EXPECT_TRUE(mentions(e, "launcher: cannot execute " + dir / "no_such_program" + ": No such file or directory"));
}

TEST(Launcher, WorkerStuckBeforeItsRendezvousStopsTheJob) {
    TempDir dir;
    LaunchOptions opt = worker_options(2, dir, {"sleep"}, /*start_timeout_s=*/1);
    opt.startup_margin_s = 0.5;
    EXPECT_TRUE(mentions(launch_error(opt, dir), "did not finish start-up (the rendezvous) within 1.5 s"));
}

TEST(Launcher, HungRendezvousFailsWithRankZerosTimeout) {
    TempDir dir;
    // Rank 2 never joins: rank 0's rendezvous times out first (the launcher's own start-up limit is
    // later by the margin); rank 0 and rank 1, told by rank 0, fail naming the missing rank, and
    // the job's error is whichever of them the launcher reaps first.
    const std::string e = launch_error(worker_options(3, dir, {"no-join", "2"}, /*start_timeout_s=*/1), dir);
    EXPECT_TRUE(mentions(e, "exited with code 1: rendezvous"));
    EXPECT_TRUE(mentions(e, "timed out after 1 s: rank 0 (port "));
    EXPECT_TRUE(mentions(e, "missing rank(s) 2"));
}

TEST(Launcher, SigtermReachesEveryWorkerWhichExitCleanly) {
    for (int sig : {SIGTERM, SIGINT}) {
        TempDir dir;
        const int n = 3;
        const pid_t pid = launch_in_child(worker_options(n, dir, {"wait"}), dir / "out.txt", dir / "err.txt");
        if (!wait_for_files(dir, n, "ready", 20)) {
            wait_child(pid, 0);  // kills the launcher; its workers follow (PR_SET_PDEATHSIG)
            FAIL() << "workers not ready; stderr:\n" << read_bytes(dir / "err.txt");
        }
        ASSERT_EQ(kill(pid, sig), 0);
        const int status = wait_child(pid, 20);
        ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status << ", stderr:\n" << read_bytes(dir / "err.txt");
        for (int r = 0; r < n; r++)
            EXPECT_EQ(read_bytes(dir / ("rank_" + std::to_string(r) + ".term")), sig == SIGTERM ? "SIGTERM" : "SIGINT");
    }
}

}  // namespace
}  // namespace codagpt
