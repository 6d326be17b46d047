// `codagpt train --nproc-per-node N ...`: starts N worker processes (this binary again, with the
// same arguments minus the launch flags) and supervises them, so that no torchrun is needed.
//
// Each worker gets CODAGPT_RANK, _WORLD_SIZE, _LOCAL_RANK, _LOCAL_WORLD_SIZE, _NODE_RANK, _NNODES,
// _MASTER_ADDR, _MASTER_PORT, _START_TIMEOUT, _JOB_KEY and _READY_FD (dist_env.hpp reads them), and
// NCCL_NVLS_ENABLE=0 unless the user set it. Workers run in their own process groups, so a Ctrl-C
// at the terminal reaches them once, through the launcher, and not twice (which would make the
// trainer stop at once instead of checkpointing).
//
// Output: global rank 0's stdout is the launcher's (a terminal stays a terminal: the live progress
// line works) and its stderr passes through unchanged; the other ranks' stdout is discarded (rank 0
// logs for the job) and their stderr lines are prefixed "[rank K] ".
//
// Supervision: a worker that exits non-zero or is killed by a signal, or that has not finished
// start-up (exchange_unique_id) within the start timeout plus a margin, stops the job: the others
// get SIGTERM (they checkpoint and exit), then SIGKILL after a grace period, and the launcher fails
// with one line naming the rank, its exit code or signal, and the last line it wrote to stderr
// (as the reason when it was a "codagpt: error:" line, else quoted as context).
// SIGINT and SIGTERM sent to the launcher are passed to every worker; when they all exit 0, so
// does the launcher. Workers get SIGTERM if the launcher itself dies (PR_SET_PDEATHSIG).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "dist_env.hpp"

namespace codagpt {

// The launch flags of `codagpt train`; each overrides the matching CODAGPT_* variable.
struct LaunchFlags {
    std::optional<int> nproc_per_node;   // --nproc-per-node: makes this process the launcher
    std::optional<int> nnodes;           // --nnodes
    std::optional<int> node_rank;        // --node-rank
    std::optional<std::string> master_addr;  // --master-addr
    std::optional<int> master_port;      // --master-port
    std::optional<int> start_timeout_s;  // --start-timeout
    std::optional<int> hang_timeout_s;   // --hang-timeout (the launcher's own: not exported)
    bool any() const {
        return nproc_per_node || nnodes || node_rank || master_addr || master_port || start_timeout_s ||
               hang_timeout_s;
    }
};

struct ParsedLaunchArgs {
    LaunchFlags flags;
    std::vector<std::string> rest;  // the arguments without the launch flags, in order
};

// Takes the launch flags ("--flag VALUE" or "--flag=VALUE") out of args. Throws Error for missing
// or malformed values, N < 1, ports outside 1..65535, and --nnodes / --node-rank without
// --nproc-per-node (a task of srun or mpirun is one rank already).
ParsedLaunchArgs parse_launch_flags(const std::vector<std::string>& args);

// The flags as the CODAGPT_* variables they override, written into env.
void apply_launch_flags(const LaunchFlags& flags, Env& env);

struct LaunchOptions {
    int nproc_per_node = 1;
    NodePlan node;                         // node count, this node's rank, rendezvous address, start timeout
    std::vector<std::string> worker_argv;  // each worker runs this: a program path, then its arguments
    Env env;                               // the workers' environment, before the variables above
    std::string job_key;                   // the same on every node of the job (the rendezvous checks it)
    double kill_grace_s = 10;              // SIGTERM to SIGKILL, when the job is stopped after a failure
    double startup_margin_s = 30;          // on top of node.start_timeout_s, so the workers' own
                                           // rendezvous errors (more precise) come first
    double hang_timeout_s = 1800;          // a started worker that reports no progress
                                           // (report_progress) for this long stops the job; 0: never
};

// Runs the workers of this node until all have exited. Returns 0 when every worker exited 0;
// throws Error naming the first rank that failed, after every worker has exited.
// Installs handlers for SIGINT, SIGTERM, SIGCHLD and ignores SIGPIPE while it runs (restored after).
int launch(const LaunchOptions& opt);

// For the top of main(): with `train` and --nproc-per-node, runs the launcher and returns its exit
// code (errors printed as "codagpt: error: ..."). Otherwise takes any launch flags out of argv
// (argc updated), exports --master-addr / --master-port / --start-timeout for dist_context_from_env
// (srun or mpirun tasks), and returns nullopt: main carries on as a worker or a single process.
// With --help or -h the flags are only taken out, so that the help is printed once.
std::optional<int> run_launcher_if_requested(int& argc, char** argv);

// The launch flags, for `codagpt train --help` (the launcher parses them before CLI11 runs).
const char* launch_help();

}  // namespace codagpt
