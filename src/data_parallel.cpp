// The NCCL side of data parallelism (data_parallel.hpp): the communicator, the side stream, and the
// collectives of the ZeRO-1 step. Host code; builds without NCCL to a factory that says so.
#include "data_parallel.hpp"

#include <string>

#include "common.hpp"
#ifdef CODAGPT_HAVE_NCCL
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <thread>

#include "common.cuh"
#include "rendezvous.hpp"
#endif

namespace codagpt {

#ifdef CODAGPT_HAVE_NCCL
namespace {

[[noreturn]] void nccl_fail(ncclResult_t r, const char* call, ncclComm_t comm) {
    std::string msg = std::string("NCCL error in ") + call + ": " + ncclGetErrorString(r);
    const char* last = comm ? ncclGetLastError(comm) : nullptr;
    if (last && *last) msg += " (" + std::string(last) + ")";
    throw Error(msg);
}
#define NCCL_CHECK(call, comm)                                          \
    do {                                                                \
        const ncclResult_t r_ = (call);                                 \
        if (r_ != ncclSuccess) nccl_fail(r_, #call, comm);              \
    } while (0)

class NcclDataParallel final : public DataParallel {
public:
    NcclDataParallel(const DistContext& dist, const ModelConfig& m)
        : DataParallel(dist.rank, make_zero_plan(param_layout(m), dist.world_size)),
          buckets_(make_grad_buckets(m, plan_)),
          reduced_(buckets_.size(), false) {
        int devices = 0;
        if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
            (void)cudaGetLastError();
            throw Error("rank " + std::to_string(dist.rank) + ": no CUDA GPU is visible (data-parallel training needs one per rank)");
        }
        // GPU local_rank of the node's; a rank that sees a single GPU (a scheduler that binds one
        // to each task, e.g. srun --gpus-per-task=1) uses that one.
        if (devices > 1 && dist.local_rank >= devices)
            throw Error("rank " + std::to_string(dist.rank) + ": local rank " + std::to_string(dist.local_rank) +
                        " needs GPU " + std::to_string(dist.local_rank) + ", but " + std::to_string(devices) +
                        " are visible (start at most that many ranks per node)");
        CUDA_CHECK(cudaSetDevice(devices == 1 ? 0 : dist.local_rank));
        const UniqueId id = exchange_unique_id(dist, [] {
            ncclUniqueId nid;
            NCCL_CHECK(ncclGetUniqueId(&nid), nullptr);
            UniqueId u;
            static_assert(sizeof(nid) == sizeof(u), "ncclUniqueId is 128 bytes");
            std::memcpy(u.data(), &nid, sizeof nid);
            return u;
        });
        ncclUniqueId nid;
        std::memcpy(&nid, id.data(), sizeof nid);
        NCCL_CHECK(ncclCommInitRank(&comm_, dist.world_size, nid, dist.rank), nullptr);
        CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
        CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
        CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    }
    ~NcclDataParallel() override {
        // Leaving on an error (this rank's or a peer's), collectives may be pending that will never
        // complete: abort them rather than wait, and before cudaFree, which waits for the device.
        if (comm_) std::uncaught_exceptions() > 0 ? ncclCommAbort(comm_) : ncclCommDestroy(comm_);
        if (values_) cudaFree(values_);
        for (auto [start, end] : bucket_events_)
            for (cudaEvent_t e : {start, end})
                if (e) cudaEventDestroy(e);
        if (done_) cudaEventDestroy(done_);
        if (ready_) cudaEventDestroy(ready_);
        if (side_) cudaStreamDestroy(side_);
    }

    std::vector<double> all_gather(const std::vector<double>& values) override {
        const size_t k = values.size(), R = plan_.ranks;
        if (k > kMaxValues) throw Error("DataParallel::all_gather: at most " + std::to_string(kMaxValues) + " values");
        if (!values_) CUDA_CHECK(cudaMalloc(&values_, kMaxValues * R * sizeof(double)));
        std::vector<double> all(k * R);
        CUDA_CHECK(cudaMemcpyAsync(values_ + rank_ * k, values.data(), k * sizeof(double), cudaMemcpyHostToDevice, side_));
        NCCL_CHECK(ncclAllGather(values_ + rank_ * k, values_, k, ncclFloat64, comm_, side_), comm_);
        CUDA_CHECK(cudaMemcpyAsync(all.data(), values_, all.size() * sizeof(double), cudaMemcpyDeviceToHost, side_));
        sync_side();
        return all;
    }

    void bucket_done(int layer, float* grads, cudaStream_t stream) override {
        if (!last_micro_step_) return;
        reduce_bucket(layer < 0 ? buckets_.size() - 1 : plan_layers() - 1 - layer, grads, stream);
    }

    void wait_for_gradients(float* grads, cudaStream_t stream) override {
        for (size_t i = 0; i < buckets_.size(); i++) reduce_bucket(i, grads, stream);
        CUDA_CHECK(cudaEventRecord(done_, side_));
        CUDA_CHECK(cudaStreamWaitEvent(stream, done_, 0));
        reduced_.assign(buckets_.size(), false);
    }

    void all_gather_norm_partials(float* partials, cudaStream_t stream) override {
        on_side(stream, [&] { NCCL_CHECK(ncclAllGather(partials + rank_, partials, 1, ncclFloat32, comm_, side_), comm_); });
    }

    void all_gather_weights(bf16* params, cudaStream_t stream) override {
        const size_t S = plan_.shard_size, own = shard().padded_begin;
        on_side(stream, [&] { NCCL_CHECK(ncclAllGather(params + own, params, S, ncclBfloat16, comm_, side_), comm_); });
    }

    // Rank 0 receives the chunks one at a time into a scratch chunk (allocated here: checkpoints
    // are rare, and a persistent one would cost a shard's bytes of every step's memory).
    void gather_to_root(void* full, const void* shard_buf, size_t elem_bytes, cudaStream_t stream) override {
        const size_t bytes = plan_.shard_size * elem_bytes;
        CUDA_CHECK(cudaStreamSynchronize(stream));
        if (rank_ != 0) {
            NCCL_CHECK(ncclSend(shard_buf, bytes, ncclUint8, 0, comm_, side_), comm_);
            sync_side();
            return;
        }
        auto copy_out = [&](int r, const void* chunk) {
            const RankShard& s = plan_.shards[r];
            CUDA_CHECK(cudaMemcpy(static_cast<char*>(full) + s.begin * elem_bytes, chunk, (s.end - s.begin) * elem_bytes,
                                  cudaMemcpyDeviceToHost));
        };
        copy_out(0, shard_buf);
        void* scratch = nullptr;
        CUDA_CHECK(cudaMalloc(&scratch, bytes));
        try {
            for (int r = 1; r < plan_.ranks; r++) {
                NCCL_CHECK(ncclRecv(scratch, bytes, ncclUint8, r, comm_, side_), comm_);
                sync_side();
                copy_out(r, scratch);
            }
        } catch (...) {
            cudaFree(scratch);
            throw;
        }
        CUDA_CHECK(cudaFree(scratch));
    }

    void time_reductions() override {
        if (!bucket_events_.empty()) return;
        bucket_events_.assign(buckets_.size(), {nullptr, nullptr});
        for (auto& [start, end] : bucket_events_) {
            CUDA_CHECK(cudaEventCreate(&start));
            CUDA_CHECK(cudaEventCreate(&end));
        }
    }

    const std::vector<std::pair<cudaEvent_t, cudaEvent_t>>& reduction_events() const override { return bucket_events_; }

private:
    static constexpr size_t kMaxValues = 16;

    size_t plan_layers() const { return buckets_.size() - 1; }

    // Bucket i's pieces, each reduced (averaged) onto its owner, once the work enqueued so far on
    // `stream` (the backward that completed them) is done.
    void reduce_bucket(size_t i, float* grads, cudaStream_t stream) {
        if (reduced_[i]) return;
        reduced_[i] = true;
        CUDA_CHECK(cudaEventRecord(ready_, stream));
        CUDA_CHECK(cudaStreamWaitEvent(side_, ready_, 0));
        const bool timed = !bucket_events_.empty();
        if (timed) CUDA_CHECK(cudaEventRecord(bucket_events_[i].first, side_));
        NCCL_CHECK(ncclGroupStart(), comm_);
        for (const GradPiece& p : buckets_[i].pieces)
            NCCL_CHECK(ncclReduce(grads + p.begin, grads + p.begin, p.end - p.begin, ncclFloat32, ncclAvg, p.owner,
                                  comm_, side_),
                       comm_);
        NCCL_CHECK(ncclGroupEnd(), comm_);
        if (timed) CUDA_CHECK(cudaEventRecord(bucket_events_[i].second, side_));
    }

    // Waits for the side stream (every step does, for the loss), watching NCCL's asynchronous errors
    // (a peer gone, a broken connection): they abort the communicator and throw, where a plain
    // synchronize would wait for ever.
    void sync_side() {
        for (;;) {
            const cudaError_t e = cudaStreamQuery(side_);
            if (e == cudaSuccess) return;
            if (e != cudaErrorNotReady) CUDA_CHECK(e);
            ncclResult_t async = ncclSuccess;
            NCCL_CHECK(ncclCommGetAsyncError(comm_, &async), comm_);
            if (async != ncclSuccess) {
                std::string why = ncclGetErrorString(async);
                const char* last = ncclGetLastError(comm_);
                if (last && *last) why += " (" + std::string(last) + ")";
                ncclCommAbort(comm_);
                comm_ = nullptr;
                throw Error("rank " + std::to_string(rank_) + ": NCCL failed while waiting for the other ranks: " + why);
            }
            std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
    }

    // f's collectives on the side stream, after the work enqueued so far on `stream` and before
    // what comes after on it.
    template <class F>
    void on_side(cudaStream_t stream, F f) {
        CUDA_CHECK(cudaEventRecord(ready_, stream));
        CUDA_CHECK(cudaStreamWaitEvent(side_, ready_, 0));
        f();
        CUDA_CHECK(cudaEventRecord(done_, side_));
        CUDA_CHECK(cudaStreamWaitEvent(stream, done_, 0));
    }

    std::vector<GradBucket> buckets_;
    std::vector<bool> reduced_;  // this step's buckets already enqueued
    ncclComm_t comm_ = nullptr;
    cudaStream_t side_ = nullptr;
    cudaEvent_t ready_ = nullptr, done_ = nullptr;
    double* values_ = nullptr;  // all_gather's device buffer, kMaxValues per rank
    std::vector<std::pair<cudaEvent_t, cudaEvent_t>> bucket_events_;  // time_reductions(): bucket i's start, end
};

}  // namespace

std::shared_ptr<DataParallel> make_data_parallel(const DistContext& dist, const ModelConfig& m) {
    return std::make_shared<NcclDataParallel>(dist, m);
}
#else
std::shared_ptr<DataParallel> make_data_parallel(const DistContext& dist, const ModelConfig&) {
    throw Error("training as rank " + std::to_string(dist.rank) + " of " + std::to_string(dist.world_size) +
                " needs NCCL, and this build has none (install libnccl-dev, or pass -DNCCL_ROOT=..., and rebuild)");
}
#endif

}  // namespace codagpt
