// ZeRO-1 for the NCCL data-parallel trainer (issue 6): which rank owns which fp32 master weights and
// AdamW moments, which gradient buckets backward hands to the reduction while it runs on, and a CPU
// reference of the sharded optimizer step that the NCCL trainer is checked against.
//
// The plan. The flat parameter vector (param_layout order, n floats, any n) is cut into R equal
// chunks of S = round_up(ceil(n / R), 8) elements: rank r owns the flat range [r*S, (r+1)*S)
// clipped to n. Every shard starts at a multiple of 8 elements, so with 32-byte-aligned flat buffers
// a shard starts 32-byte-aligned in fp32 and 16-byte-aligned in bf16 in all of master, params,
// grads, m and v, and kernels/adamw.cuh's vector path runs on it. NCCL's collectives take equal
// counts per rank: the trainer allocates its parameter and gradient buffers with padded_total =
// R*S elements (the n real ones, then zeros), so ncclAllGather(sendcount = S) rebuilds the bf16
// parameters in place from every rank's chunk (send buf + r*S), and ncclReduceScatter(recvcount =
// S) over the whole gradient buffer, when used, leaves rank r its own chunk. Padding is zero in
// every buffer and never updated (the step touches [begin, end) only).
//
// Why one flat shard per rank rather than a slice of every bucket. The alternative (per-bucket
// reduce-scatter, each rank owning a contiguous slice of each bucket) needs buckets contiguous in
// memory, and they are not: tensors are stacked over layers (qkv_w is [L, C, 3C]), so one layer's
// gradients are 12 segments spread over the flat vector. Per-bucket slices would mean packing each
// bucket into a staging buffer, a rank state scattered over L+1 slices in packed order that the
// checkpoint and the bf16 copy must translate back, and optimizer buffers at offsets that differ
// from the parameters' (no common alignment for the vector path). One flat shard keeps a rank's
// state one contiguous range at the parameters' own offsets: the AdamW kernel runs per touched
// tensor exactly as device_adamw_step does, resharding a checkpoint is slicing, and the all-gather
// is one call.
//
// How buckets and shards compose. Backward produces a layer's gradients complete once that layer's
// backward is done, last layer first; a bucket is that layer's segments (and a final bucket for
// wte, wpe and lnf, whose gradients are complete only at the end: wte receives the LM head's
// gradient first and the embedding's last). Each segment is cut at the shard boundaries into
// pieces, each with its owning rank. The NCCL trainer reduces a bucket, on a side stream after an
// event recorded when that layer's backward ends, as one ncclGroupStart/End of ncclReduce(piece,
// root = owner, ncclAvg) calls (src/data_parallel.cpp): every gradient element is reduced once,
// onto its owner (about the bytes per link of a reduce-scatter, a ring carrying each element once),
// and no call needs equal counts. Pieces are in bucket order, then flat order, on every rank, so
// every rank issues the same calls in the same order (what NCCL needs).
#pragma once
#include <cstddef>
#include <vector>

#include "config.hpp"
#include "gpt2_params.hpp"

namespace codagpt {

// Every shard's first element is a multiple of this many elements.
constexpr size_t kShardAlign = 8;

// The part of one parameter tensor that a shard or bucket touches: flat [begin, end).
struct TensorSpan {
    size_t tensor;  // index in the layout
    bool decay;     // ParamInfo::decay of that tensor: AdamW decays it
    size_t begin, end;
};

struct RankShard {
    size_t begin, end;                // real elements owned, flat [begin, end); empty when r*S >= n
    size_t padded_begin, padded_end;  // [r*S, (r+1)*S): the rank's chunk of the padded buffers
    std::vector<TensorSpan> tensors;  // the tensors [begin, end) touches, in layout order
};

struct ZeroPlan {
    std::vector<ParamInfo> layout;
    size_t n = 0;             // real elements (sum of the layout's sizes)
    int ranks = 1;            // R
    size_t shard_size = 0;    // S: elements per rank in the padded buffers, a multiple of kShardAlign
    size_t padded_total = 0;  // R * S >= n: the length of the padded parameter and gradient buffers
    std::vector<RankShard> shards;  // one per rank
};

// The plan for `ranks` >= 1 ranks over `layout` (any sizes). Throws Error for ranks < 1.
ZeroPlan make_zero_plan(const std::vector<ParamInfo>& layout, int ranks);

// A bucket segment's part owned by one rank: the unit the NCCL trainer reduces (ncclReduce to owner).
struct GradPiece {
    size_t begin, end;  // flat
    int owner;
};

struct GradBucket {
    int layer;                          // the layer, or -1 for wte, wpe, lnf_w, lnf_b
    std::vector<TensorSpan> segments;   // flat ranges whose gradients the bucket completes, layout order
    std::vector<GradPiece> pieces;      // the segments cut at shard boundaries, in flat order
};

// The buckets in the order backward completes them: layer L-1 down to 0, then the non-layer
// tensors. Their segments cover [0, n) exactly once. `plan` must be make_zero_plan(param_layout(m), R).
std::vector<GradBucket> make_grad_buckets(const ModelConfig& m, const ZeroPlan& plan);

// One rank's optimizer state: its chunk (S elements, real ones first, then zero padding) of the fp32
// master weights and AdamW moments, and the updates done.
struct ZeroShardState {
    std::vector<float> master, m, v;
    long t = 0;
};

// The shard states of full flat state (what a checkpoint holds: n elements each): rank r gets its
// chunk, padding zero. Resuming on another number of ranks is shard_zero_state of the full state.
std::vector<ZeroShardState> shard_zero_state(const ZeroPlan& plan, const std::vector<float>& master,
                                             const std::vector<float>& m, const std::vector<float>& v, long t);

// The full flat state (n elements each) from every rank's shard: the inverse of shard_zero_state.
struct ZeroFullState {
    std::vector<float> master, m, v;
    long t = 0;
};
ZeroFullState gather_zero_state(const ZeroPlan& plan, const std::vector<ZeroShardState>& shards);

// Rank `rank`'s contribution to the squared global gradient norm: sum_of_squares over its shard of
// the (already rank-averaged) full gradient `grads` (n elements).
double shard_grad_sum_of_squares(const ZeroPlan& plan, int rank, const float* grads);

// The global gradient norm from every rank's partial sum, added in rank order (what an all-gather
// of the R partials followed by the same sum on every rank gives: the same bits on every rank).
double zero_grad_norm(const std::vector<double>& partial_sums);

// Rank `rank`'s AdamW step: t++, then adamw_update_range over its shard only, on its master weights
// and moments, with the full gradient `grads` (n elements) and the global norm.
void zero_adamw_step(const ZeroPlan& plan, int rank, ZeroShardState& state, const float* grads, double lr,
                     double grad_norm, const TrainConfig& c);

// The all-gather: every rank's chunk of master weights, concatenated (padded_total elements; the
// parameters are its first n, the rest the zero padding).
std::vector<float> all_gather_master(const ZeroPlan& plan, const std::vector<ZeroShardState>& shards);

}  // namespace codagpt
