// A stand-in for a training worker, for test_launcher: it reads its rank from the environment the
// launcher gave it, joins the rendezvous, and then behaves as the test asks.
//
//   launcher_test_worker DIR exchange      write DIR/rank_<r>.id (the id, hex) and DIR/rank_<r>.env,
//                                          one line to stdout and one to stderr, exit 0
//   launcher_test_worker DIR wait          write DIR/rank_<r>.ready, wait for SIGTERM or SIGINT,
//                                          write its name to DIR/rank_<r>.term, exit 0 (as the trainer)
//   launcher_test_worker DIR crash R HOW   rank R fails (HOW: an exit code, or KILL for SIGKILL) after a
//                                          line "boom on rank R" on stderr; the others `wait`
//   launcher_test_worker DIR stubborn R    rank R exits 1; the others ignore SIGTERM (SIGKILL ends them)
//   launcher_test_worker DIR no-join R     rank R never joins the rendezvous; the others `exchange`
//   launcher_test_worker DIR sleep         never joins: a worker stuck before its rendezvous
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "common.hpp"
#include "rendezvous.hpp"

using namespace codagpt;

namespace {

[[noreturn]] void sleep_forever() {
    for (;;) pause();
}

std::string path(const std::string& dir, int rank, const char* what) {
    return dir + "/rank_" + std::to_string(rank) + "." + what;
}

void write_text(const std::string& file, const std::string& text) {
    std::ofstream f(file);
    f << text;
    if (!f.flush()) throw Error("cannot write " + file);
}

[[noreturn]] void wait_for_stop(const std::string& dir, int rank, const sigset_t& stops) {
    write_text(path(dir, rank, "ready"), "");
    int sig = 0;
    if (sigwait(&stops, &sig) != 0) throw Error("sigwait failed");
    write_text(path(dir, rank, "term"), sig == SIGTERM ? "SIGTERM" : "SIGINT");
    std::exit(0);
}

}  // namespace

int main(int argc, char** argv) {
    try {
        if (argc < 3) throw Error("usage: launcher_test_worker DIR MODE [ARGS]");
        const std::string dir = argv[1], mode = argv[2];
        const int target = argc > 3 ? std::atoi(argv[3]) : -1;
        const DistContext ctx = dist_context_from_env();
        // Blocked from the start, so that a stop that arrives during the rendezvous waits for sigwait.
        sigset_t stops;
        sigemptyset(&stops);
        sigaddset(&stops, SIGTERM);
        sigaddset(&stops, SIGINT);
        const bool waits = mode == "wait" || mode == "crash";
        if (waits && sigprocmask(SIG_BLOCK, &stops, nullptr) != 0) throw Error("sigprocmask failed");

        if (mode == "sleep" || (mode == "no-join" && ctx.rank == target)) sleep_forever();
        const UniqueId id = exchange_unique_id(ctx, random_unique_id);

        if (mode == "exchange" || mode == "no-join") {
            std::string hex;
            char b[3];
            for (uint8_t byte : id) {
                std::snprintf(b, sizeof b, "%02x", byte);
                hex += b;
            }
            write_text(path(dir, ctx.rank, "id"), hex);
            const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
            write_text(path(dir, ctx.rank, "env"), std::to_string(ctx.rank) + " " + std::to_string(ctx.world_size) + " " +
                                                       std::to_string(ctx.local_rank) + " " +
                                                       std::to_string(ctx.local_world_size) + " " + (nvls ? nvls : "unset"));
            std::printf("stdout from rank %d\n", ctx.rank);
            std::fprintf(stderr, "stderr from rank %d\n", ctx.rank);
            return 0;
        }
        if (mode == "wait") wait_for_stop(dir, ctx.rank, stops);
        if (mode == "crash") {
            if (argc < 5) throw Error("crash needs a rank and an exit code or KILL");
            if (ctx.rank != target) wait_for_stop(dir, ctx.rank, stops);
            std::fprintf(stderr, "boom on rank %d\n", ctx.rank);
            if (std::string(argv[4]) == "KILL") raise(SIGKILL);
            return std::atoi(argv[4]);
        }
        if (mode == "hang") {  // rank `target` stops making progress; the others report some every 0.1 s
            if (ctx.rank == target) sleep_forever();
            for (;;) {
                report_progress();
                usleep(100000);
            }
        }
        if (mode == "stubborn") {
            if (ctx.rank == target) {
                std::fprintf(stderr, "boom on rank %d\n", ctx.rank);
                return 1;
            }
            signal(SIGTERM, SIG_IGN);
            write_text(path(dir, ctx.rank, "ready"), "");
            sleep_forever();
        }
        throw Error("unknown mode " + mode);
    } catch (const Error& e) {
        std::fprintf(stderr, "codagpt: error: %s\n", e.what());
        return 1;
    }
}
