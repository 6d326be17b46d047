// Getting one opaque 128-byte id (NCCL's ncclUniqueId) from rank 0 to every rank, over TCP: rank 0
// listens on master_port, the others connect to master_addr:master_port. The same path serves one
// node (loopback) and many. Independent of NCCL so that it builds, and is tested, without it.
//
// Protocol (big-endian): a rank sends a 32-byte hello {"CGPTRDZV", version, rank, world size, 0,
// 64-bit hash of the job key}; once every rank has said hello, rank 0 answers each with
// {"CGPTRDZV", status, length} and `length` bytes: the id (status 0) or an error message (status 1).
// Rank 0 refuses, with a message the peer prints, a peer of another job (a stale run on the same
// port), a wrong world size, a rank out of range and a rank that joined twice; the last three fail
// rank 0 too, as the job is misconfigured.
#pragma once
#include <array>
#include <cstdint>
#include <functional>

#include "dist_env.hpp"

namespace codagpt {

using UniqueId = std::array<uint8_t, 128>;

// Every rank calls this with the same world size and job key; it returns rank 0's create() on all.
// Until ctx.start_timeout_s, a rank retries connecting (rank 0 may not be listening yet) and rank 0
// waits for the others. Then, when started by the launcher (ctx.ready_fd), tells it that start-up
// is done. Throws Error with one line: the port in use, the timeout with the ranks still missing
// or the last connection error (refused, unreachable, unknown host), a refusal by rank 0, rank 0
// closing the connection without an id (it failed).
// create() runs on rank 0 only, after every rank has joined; with one rank no socket is opened.
UniqueId exchange_unique_id(const DistContext& ctx, const std::function<UniqueId()>& create);

// When started by the launcher: tells it that this rank made progress (a training step, a
// checkpoint), one byte on the start-up pipe, which stays open after the rendezvous for this. The
// launcher stops a job whose rank reports no progress for --hang-timeout seconds. Never blocks
// (a full pipe means the launcher has unread progress already); no-op without a launcher.
void report_progress();

// 128 bytes from /dev/urandom: a stand-in id for tests and for runs without NCCL.
UniqueId random_unique_id();

}  // namespace codagpt
