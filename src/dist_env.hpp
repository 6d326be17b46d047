// Who this process is in a multi-process job: rank, world size, local rank, and where rank 0's
// rendezvous listens. Read from our own variables (set by `codagpt train --nproc-per-node N`, or by
// the flags --master-addr / --master-port / --start-timeout), from Slurm (`srun`) or from Open MPI
// (`mpirun`). The parsing is pure (an Env in, a DistContext out) so that it is tested table by table.
//
// Precedence, highest first, for the rank group (rank, world size, local rank/size, node rank, nodes):
//   1. CODAGPT_RANK / CODAGPT_WORLD_SIZE / CODAGPT_LOCAL_RANK / CODAGPT_LOCAL_WORLD_SIZE /
//      CODAGPT_NODE_RANK / CODAGPT_NNODES (the launcher sets them for its workers; a launcher started
//      by srun gives its workers these, which must win over the Slurm variables they also inherit)
//   2. Open MPI: OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE both set (only mpirun's runtime
//      sets them, so they win over the Slurm variables that mpirun's processes inherit inside a
//      Slurm allocation, which describe the steps that started mpirun's daemons, not the ranks)
//   3. Slurm: SLURM_PROCID and SLURM_NTASKS both set (srun sets them for every task)
//   4. none: a single process, rank 0 of 1
// The rank group is taken whole from one source, never mixed. For the rendezvous address:
//   CODAGPT_MASTER_ADDR (or --master-addr) > the first host of SLURM_STEP_NODELIST (else
//   SLURM_JOB_NODELIST) > 127.0.0.1 when the job is on one node > an error asking for --master-addr.
//   CODAGPT_MASTER_PORT (or --master-port) > 29500 + SLURM_JOB_ID % 1000 under Slurm (two jobs
//   sharing a node get different ports) > 29500. An Open MPI rank group uses no Slurm variable
//   here either (nor for the job key): mpirun's processes on different nodes see different ones.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace codagpt {

using Env = std::map<std::string, std::string>;

// This process's environment as an Env.
Env current_env();

// A variable's or flag's value as a number in [lo, hi]; else Error "NAME=VALUE is not a whole
// number" or "NAME=VALUE is out of range (lo to hi)".
long parse_whole_number(const std::string& name, const std::string& value, long lo, long hi);

struct DistContext {
    int rank = 0, world_size = 1;
    int local_rank = 0, local_world_size = 1;  // on this node; local_rank picks the GPU
    int node_rank = 0, nnodes = 1;
    std::string master_addr = "127.0.0.1";  // where rank 0 listens for the rendezvous
    int master_port = 29500;
    // Ranks of one job agree on it; the rendezvous refuses a peer with another (a stale job on the
    // same port). The launcher's is a hash of the worker command line; else the scheduler's job id.
    std::string job_key;
    double start_timeout_s = 300;  // how long the rendezvous waits for every rank
    int ready_fd = -1;             // where to tell the launcher that start-up is done; -1: no launcher
    std::string source = "single process";  // which environment gave the rank group, for messages
};

// The context the environment describes (precedence above). Throws Error naming the variable for
// values that are not numbers, out of range or inconsistent (rank >= world size, ...).
DistContext dist_context_from(const Env& env);

// dist_context_from(current_env()), and sets NCCL_NVLS_ENABLE=0 in this process unless the user
// set it: NCCL reads it at communicator creation, and NVLink multicast is off by default here
// (it needs fabric set-up that lent machines do not have).
DistContext dist_context_from_env();

// What a launcher on one node needs: the node's place in the job and the rendezvous address.
// nnodes/node_rank: CODAGPT_NNODES / CODAGPT_NODE_RANK (--nnodes / --node-rank) > Slurm's
// SLURM_NNODES / SLURM_NODEID (srun with one launcher per node) > 1 node, rank 0.
struct NodePlan {
    int nnodes = 1, node_rank = 0;
    std::string master_addr;
    int master_port = 29500;
    double start_timeout_s = 300;
    std::string scheduler_job;  // SLURM_JOB_ID.SLURM_STEP_ID or Open MPI's job id; "" outside them
};
NodePlan node_plan_from(const Env& env);

// Slurm's compressed host lists, e.g. "gpu[01-04,07],login1" -> gpu01 gpu02 gpu03 gpu04 gpu07 login1;
// several bracket groups in one name ("r[1-2]n[1-2]") expand as a product, zero padding is kept.
// Throws Error for malformed lists and for lists of more than a million hosts.
std::vector<std::string> expand_slurm_nodelist(const std::string& list);

// Slurm's tasks-per-node lists ("8(x2),4" = 8, 8, 4): the count for node `node`.
int slurm_tasks_on_node(const std::string& list, int node);

}  // namespace codagpt
