// Data parallelism over NCCL with ZeRO-1 (issue 6): one process per GPU, each training on its own
// share of the data, the gradients averaged across ranks, each rank updating only its ZeRO-1 shard
// of the fp32 master weights and AdamW moments (zero_shard.hpp), then the bf16 weights all-gathered.
//
// Who calls what. Both GPU models hold their trainable state in a TrainableParams
// (gpu_training.hpp), which is the only caller of the collectives below; the training loop uses
// all_gather for the loss, metrics and stop signals; the GPU backend marks the last micro-step.
//
// Streams. Every NCCL call is issued on one side stream, in the same order on every rank (what NCCL
// needs): a gradient bucket waits for an event recorded on the compute stream when backward has
// completed that layer, so the reduction of layer l runs while backward computes layer l-1; the
// compute stream waits for the side stream before the gradient norm (wait_for_gradients) and after
// each collective of the optimizer step.
//
// Averaging. The reductions use ncclAvg: rank r's chunk receives the mean over ranks of every
// rank's gradient (each rank's gradient is already the mean over its micro-batches), i.e. the
// gradient of the mean loss over the global batch. With one rank the average is a copy, so a
// one-rank job takes exactly the arithmetic of a single process.
//
// Failures. A rank that fails exits with its error line and the launcher stops the others
// (launcher.hpp). Host waits on the side stream (every step waits there for the loss) watch NCCL's
// asynchronous errors, so a connection broken by a dead peer ends a rank with an error instead of a
// hang; a rank blocked elsewhere is ended by the launcher (SIGTERM, then SIGKILL 10 s later). On an
// error the communicator is aborted, not destroyed (pending collectives would never complete).
//
// Timing (--phase-times, step_phases.hpp). Once time_reductions() has been called, each bucket's
// reductions are bracketed by two CUDA events on the side stream; TrainableParams reads them after
// the step's optimizer update (which waits for the side stream), against its compute-stream events.
#pragma once
#include <memory>
#include <utility>
#include <vector>

#include "config.hpp"
#include "dist_env.hpp"
#include "zero_shard.hpp"

struct CUstream_st;     // cudaStream_t, without CUDA headers
struct CUevent_st;      // cudaEvent_t
struct __nv_bfloat16;   // bf16

namespace codagpt {

class DataParallel {
public:
    virtual ~DataParallel() = default;
    int rank() const { return rank_; }
    int world_size() const { return plan_.ranks; }
    const ZeroPlan& plan() const { return plan_; }
    const RankShard& shard() const { return plan_.shards[rank_]; }

    // Every rank's `values` (the same count on each), concatenated in rank order; synchronizes. The
    // loop sums them in rank order: the same bits on every rank and run to run.
    virtual std::vector<double> all_gather(const std::vector<double>& values) = 0;

    // Gradients are reduced only in the backward that completes a step's accumulation: the backend
    // says whether the coming backward is that one (true unless told otherwise).
    void set_last_micro_step(bool last) { last_micro_step_ = last; }
    // Backward has completed the gradients of `layer` (-1: wte, wpe and LN_f, after the embedding
    // backward) in `grads` (the padded flat gradient buffer) on `stream`. On the last micro-step,
    // enqueues that bucket's reductions onto their owners on the side stream.
    virtual void bucket_done(int layer, float* grads, CUstream_st* stream) = 0;
    // Enqueues the buckets not reduced yet this step (a backward that did not report them), then
    // makes `stream` wait for every reduction: afterwards this rank's shard of `grads` holds the
    // rank-averaged gradient.
    virtual void wait_for_gradients(float* grads, CUstream_st* stream) = 0;

    // The optimizer step's collectives, ordered after and before the work on `stream`:
    // partials[rank] (one float) from every rank into partials[0..R).
    virtual void all_gather_norm_partials(float* partials, CUstream_st* stream) = 0;
    // Every rank's chunk of the padded bf16 weights into every rank's buffer, in place.
    virtual void all_gather_weights(__nv_bfloat16* params, CUstream_st* stream) = 0;
    // For checkpoints: the real elements of every rank's chunk `shard` (plan().shard_size elements
    // of elem_bytes each on the device) into `full` (plan().n elements) on rank 0; other ranks leave
    // `full` alone. Synchronizes.
    virtual void gather_to_root(void* full, const void* shard, size_t elem_bytes, CUstream_st* stream) = 0;

    // From now on every bucket's reduction is timed: its events are created here, once.
    virtual void time_reductions() = 0;
    // The (start, end) events of each bucket's last reduction on the side stream; empty unless
    // time_reductions() was called.
    virtual const std::vector<std::pair<CUevent_st*, CUevent_st*>>& reduction_events() const = 0;

protected:
    DataParallel(int rank, ZeroPlan plan) : rank_(rank), plan_(std::move(plan)) {}
    int rank_;
    ZeroPlan plan_;
    bool last_micro_step_ = true;
};

// Joins the job of `dist` on GPU dist.local_rank (or on the one GPU the process sees, if it sees
// one): cudaSetDevice, the unique id from rank 0 (ncclGetUniqueId there, the rendezvous for the
// rest: exchange_unique_id), ncclCommInitRank, the ZeRO-1 plan and gradient buckets of `m` for
// dist.world_size ranks. Throws Error when the build has no NCCL, no GPU is visible, or
// dist.local_rank has no GPU.
std::shared_ptr<DataParallel> make_data_parallel(const DistContext& dist, const ModelConfig& m);

}  // namespace codagpt
