#include "dist_env.hpp"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "common.hpp"

extern char** environ;

namespace codagpt {

namespace {

std::optional<std::string> get(const Env& env, const std::string& name) {
    const auto it = env.find(name);
    if (it == env.end() || it->second.empty()) return std::nullopt;
    return it->second;
}

// The first of the names that is set, as {name, value}.
std::optional<std::pair<std::string, std::string>> first_of(const Env& env, std::initializer_list<const char*> names) {
    for (const char* n : names)
        if (auto v = get(env, n)) return std::make_pair(std::string(n), *v);
    return std::nullopt;
}

// `what` names the text in the message: "SLURM_PROCID=abc is not a whole number".
long parse_long(const std::string& what, const std::string& text, long lo, long hi) {
    errno = 0;
    char* end = nullptr;
    const long v = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || errno == ERANGE || std::isspace((unsigned char)text[0]) || text[0] == '+')
        throw Error(what + " is not a whole number");
    if (v < lo || v > hi)
        throw Error(what + " is out of range (" + std::to_string(lo) + " to " + std::to_string(hi) + ")");
    return v;
}



int int_var(const Env& env, const std::string& name, int lo, int hi, int fallback) {
    const auto v = get(env, name);
    return v ? (int)parse_whole_number(name, *v, lo, hi) : fallback;
}

int required_int(const Env& env, const std::string& name, const std::string& because, int lo, int hi) {
    const auto v = get(env, name);
    if (!v) throw Error(because + " but " + name + " is not set");
    return (int)parse_whole_number(name, *v, lo, hi);
}

constexpr int kMaxRanks = 1 << 20;

void check_group(const DistContext& c) {
    const std::string from = " (from " + c.source + ")";
    if (c.rank >= c.world_size)
        throw Error("rank " + std::to_string(c.rank) + " is not below the world size " + std::to_string(c.world_size) + from);
    if (c.local_rank >= c.local_world_size)
        throw Error("local rank " + std::to_string(c.local_rank) + " is not below the local world size " +
                    std::to_string(c.local_world_size) + from);
    if (c.node_rank >= c.nnodes)
        throw Error("node rank " + std::to_string(c.node_rank) + " is not below the node count " + std::to_string(c.nnodes) + from);
}

// `slurm`: whether Slurm's variables describe this process's job step. They do not for processes
// mpirun starts inside a Slurm allocation: those inherit the variables of the steps that started
// mpirun's daemons, which differ from node to node (a job key, step node list and port each node
// would see differently), so an Open MPI rank group takes nothing from Slurm.
std::string scheduler_job(const Env& env, bool slurm) {
    if (auto job = get(env, "SLURM_JOB_ID"); job && slurm) return "slurm:" + *job + "." + get(env, "SLURM_STEP_ID").value_or("");
    if (auto job = first_of(env, {"OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"})) return "ompi:" + job->second;
    return "";
}

// The rendezvous address and timeout, shared by workers and launchers (precedence in the header).
void fill_endpoint(const Env& env, bool slurm, int nnodes, std::string& addr, int& port, double& timeout_s) {
    const auto list = first_of(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"});
    if (auto a = get(env, "CODAGPT_MASTER_ADDR")) {
        addr = *a;
    } else if (list && slurm) {
        addr = expand_slurm_nodelist(list->second).front();
    } else if (nnodes == 1) {
        addr = "127.0.0.1";
    } else {
        throw Error("a job on " + std::to_string(nnodes) +
                    " nodes needs the address of rank 0's host: give --master-addr (or CODAGPT_MASTER_ADDR)");
    }
    if (get(env, "CODAGPT_MASTER_PORT"))
        port = int_var(env, "CODAGPT_MASTER_PORT", 1, 65535, 0);
    else if (get(env, "SLURM_JOB_ID") && slurm)
        port = 29500 + (int)(parse_whole_number("SLURM_JOB_ID", *get(env, "SLURM_JOB_ID"), 0, 1L << 62) % 1000);
    else
        port = 29500;
    timeout_s = int_var(env, "CODAGPT_START_TIMEOUT", 1, 7 * 24 * 3600, (int)timeout_s);
}

}  // namespace

long parse_whole_number(const std::string& name, const std::string& value, long lo, long hi) {
    return parse_long(name + "=" + one_line(value), value, lo, hi);
}

Env current_env() {
    Env env;
    for (char** e = environ; *e; e++) {
        const char* eq = std::strchr(*e, '=');
        if (eq) env.emplace(std::string(*e, size_t(eq - *e)), std::string(eq + 1));
    }
    return env;
}

DistContext dist_context_from(const Env& env) {
    DistContext c;
    if (get(env, "CODAGPT_RANK")) {
        c.source = "CODAGPT_* variables";
        const std::string why = "CODAGPT_RANK is set";
        c.world_size = required_int(env, "CODAGPT_WORLD_SIZE", why, 1, kMaxRanks);
        c.rank = int_var(env, "CODAGPT_RANK", 0, kMaxRanks, 0);
        c.local_rank = int_var(env, "CODAGPT_LOCAL_RANK", 0, kMaxRanks, c.rank);
        c.local_world_size = int_var(env, "CODAGPT_LOCAL_WORLD_SIZE", 1, kMaxRanks, c.world_size);
        c.node_rank = int_var(env, "CODAGPT_NODE_RANK", 0, kMaxRanks, 0);
        c.nnodes = int_var(env, "CODAGPT_NNODES", 1, kMaxRanks, 1);
    } else if (get(env, "OMPI_COMM_WORLD_RANK") && get(env, "OMPI_COMM_WORLD_SIZE")) {
        c.source = "Open MPI";
        const std::string why = "OMPI_COMM_WORLD_RANK is set";
        c.world_size = int_var(env, "OMPI_COMM_WORLD_SIZE", 1, kMaxRanks, 1);
        c.rank = int_var(env, "OMPI_COMM_WORLD_RANK", 0, kMaxRanks, 0);
        c.local_rank = required_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", why, 0, kMaxRanks);
        c.local_world_size = required_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", why, 1, kMaxRanks);
        // Open MPI names no node index; with its default by-slot mapping, ranks fill nodes in order.
        c.nnodes = (c.world_size + c.local_world_size - 1) / c.local_world_size;
        c.node_rank = c.rank / c.local_world_size;
    } else if (auto ntasks = first_of(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"}); ntasks && get(env, "SLURM_PROCID")) {
        c.source = "Slurm";
        const std::string why = "SLURM_PROCID is set";
        c.world_size = (int)parse_whole_number(ntasks->first, ntasks->second, 1, kMaxRanks);
        c.rank = int_var(env, "SLURM_PROCID", 0, kMaxRanks, 0);
        c.local_rank = required_int(env, "SLURM_LOCALID", why, 0, kMaxRanks);
        c.node_rank = required_int(env, "SLURM_NODEID", why, 0, kMaxRanks);
        const auto nodes = first_of(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES"});
        if (!nodes) throw Error(why + " but neither SLURM_STEP_NUM_NODES nor SLURM_NNODES is");
        c.nnodes = (int)parse_whole_number(nodes->first, nodes->second, 1, kMaxRanks);
        if (auto per_node = first_of(env, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}))
            c.local_world_size = slurm_tasks_on_node(per_node->second, c.node_rank);
        else
            c.local_world_size = (c.world_size + c.nnodes - 1) / c.nnodes;
    }
    check_group(c);
    const bool slurm = c.source != "Open MPI";
    if (get(env, "CODAGPT_JOB_KEY"))
        c.job_key = *get(env, "CODAGPT_JOB_KEY");
    else
        c.job_key = scheduler_job(env, slurm);
    c.ready_fd = int_var(env, "CODAGPT_READY_FD", 0, 1 << 30, -1);
    // One process needs no rendezvous, so no address: a stray CODAGPT_MASTER_ADDR must not fail it.
    if (c.world_size > 1) fill_endpoint(env, slurm, c.nnodes, c.master_addr, c.master_port, c.start_timeout_s);
    return c;
}

DistContext dist_context_from_env() {
    if (setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0) != 0)
        throw Error(std::string("cannot set NCCL_NVLS_ENABLE: ") + std::strerror(errno));
    return dist_context_from(current_env());
}

NodePlan node_plan_from(const Env& env) {
    NodePlan p;
    if (get(env, "CODAGPT_NNODES") || get(env, "CODAGPT_NODE_RANK")) {
        p.nnodes = int_var(env, "CODAGPT_NNODES", 1, kMaxRanks, 1);
        p.node_rank = int_var(env, "CODAGPT_NODE_RANK", 0, kMaxRanks, 0);
    } else if (get(env, "SLURM_NODEID")) {
        p.nnodes = required_int(env, "SLURM_NNODES", "SLURM_NODEID is set", 1, kMaxRanks);
        p.node_rank = int_var(env, "SLURM_NODEID", 0, kMaxRanks, 0);
    }
    if (p.node_rank >= p.nnodes)
        throw Error("node rank " + std::to_string(p.node_rank) + " is not below the node count " + std::to_string(p.nnodes));
    fill_endpoint(env, /*slurm=*/true, p.nnodes, p.master_addr, p.master_port, p.start_timeout_s);
    p.scheduler_job = scheduler_job(env, /*slurm=*/true);
    return p;
}

namespace {

// Expands the bracket groups of one host pattern ("gpu[01-02]-ib") into out.
void expand_host(const std::string& list, const std::string& pattern, std::vector<std::string>& out) {
    const size_t open = pattern.find('[');
    if (open == std::string::npos) {
        if (pattern.find(']') != std::string::npos) throw Error("Slurm node list '" + one_line(list) + "': unmatched ']'");
        out.push_back(pattern);
        return;
    }
    const size_t close = pattern.find(']', open);
    if (close == std::string::npos) throw Error("Slurm node list '" + one_line(list) + "': unmatched '['");
    const std::string prefix = pattern.substr(0, open), rest = pattern.substr(close + 1);
    const std::string ranges = pattern.substr(open + 1, close - open - 1);
    size_t pos = 0;
    do {
        const size_t comma = std::min(ranges.find(',', pos), ranges.size());
        const std::string range = ranges.substr(pos, comma - pos);
        const size_t dash = range.find('-');
        const std::string lo = range.substr(0, dash), hi = dash == std::string::npos ? lo : range.substr(dash + 1);
        const auto digits = [](const std::string& s) {
            return !s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string::npos;
        };
        if (!digits(lo) || !digits(hi) || std::stol(lo) > std::stol(hi))
            throw Error("Slurm node list '" + one_line(list) + "': bad range '" + one_line(range) + "'");
        for (long i = std::stol(lo); i <= std::stol(hi); i++) {
            std::string num = std::to_string(i);
            if (num.size() < lo.size()) num.insert(0, lo.size() - num.size(), '0');  // gpu[01-04]: keep the width
            expand_host(list, prefix + num + rest, out);
            if (out.size() > 1000000) throw Error("Slurm node list '" + one_line(list) + "' has over a million hosts");
        }
        pos = comma + 1;
    } while (pos <= ranges.size());
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string& list) {
    std::vector<std::string> hosts;
    // Split at the commas outside brackets: "a[1,3],b" is a[1,3] and b.
    int depth = 0;
    size_t start = 0;
    for (size_t i = 0; i <= list.size(); i++) {
        if (i < list.size() && list[i] == '[') depth++;
        if (i < list.size() && list[i] == ']') depth--;
        if (i == list.size() || (list[i] == ',' && depth == 0)) {
            const std::string host = list.substr(start, i - start);
            if (host.empty()) throw Error("Slurm node list '" + one_line(list) + "' has an empty host name");
            expand_host(list, host, hosts);
            start = i + 1;
        }
    }
    return hosts;
}

int slurm_tasks_on_node(const std::string& list, int node) {
    // Entries "N" or "N(xK)", comma separated.
    int seen = 0;
    size_t pos = 0;
    while (pos <= list.size()) {
        const size_t comma = std::min(list.find(',', pos), list.size());
        const std::string entry = list.substr(pos, comma - pos);
        const size_t paren = entry.find("(x");
        const std::string what = "Slurm tasks-per-node entry '" + one_line(entry) + "' (in '" + one_line(list) + "')";
        const long tasks = parse_long(what, entry.substr(0, paren), 1, kMaxRanks);
        long repeat = 1;
        if (paren != std::string::npos) {
            if (entry.back() != ')') throw Error(what + " lacks its closing ')'");
            repeat = parse_long(what, entry.substr(paren + 2, entry.size() - paren - 3), 1, kMaxRanks);
        }
        if (node < seen + repeat) return (int)tasks;
        seen += (int)repeat;
        pos = comma + 1;
    }
    throw Error("Slurm tasks-per-node list '" + one_line(list) + "' has no entry for node " + std::to_string(node));
}

}  // namespace codagpt
