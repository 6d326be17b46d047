// ZeRO-1 sharding (zero_shard.hpp) against the unsharded CPU optimizer: the plan covers every
// element once with 8-aligned shards and zero padding, the buckets cover the layout in backward
// order, the sharded AdamW step equals AdamWCPU bit for bit, and resharding a state saved with R
// ranks into R' ranks continues the same run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "common.hpp"
#include "optim_cpu.hpp"
#include "rng.hpp"
#include "zero_shard.hpp"

using namespace codagpt;

namespace {

const int kRankCounts[] = {1, 2, 3, 4, 7, 8};

// A model whose tensor sizes are multiples of nothing useful: C = 12, 13 positions, 3 layers.
ModelConfig odd_model() {
    ModelConfig m;
    m.n_layer = 3;
    m.n_head = 3;
    m.n_embd = 12;
    m.max_seq_len = 13;
    m.vocab_size = 101;
    return m;
}

// Layouts: gpt2-tiny, the odd model, and synthetic ones of odd sizes (fewer elements than ranks
// too), decayed and not decayed tensors interleaved.
std::vector<std::vector<ParamInfo>> layouts() {
    return {param_layout(ModelConfig{}),
            param_layout(odd_model()),
            {{"w", 100003, true}, {"b", 13, false}, {"e", 7919, true}, {"g", 1, false}},
            {{"x", 5, true}},
            {{"a", 9, false}, {"b", 17, true}, {"c", 33, false}}};
}

size_t total(const std::vector<ParamInfo>& layout) {
    size_t n = 0;
    for (const ParamInfo& t : layout) n += t.size;
    return n;
}

std::vector<float> random_vector(size_t n, double std, uint64_t seed) {
    Rng rng(seed);
    std::vector<float> x(n);
    for (float& v : x) v = float(std * rng.normal());
    return x;
}

// Bit equality of two float arrays, naming the first element that differs.
::testing::AssertionResult same_bits(const std::vector<float>& got, const std::vector<float>& want, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0)
            return ::testing::AssertionFailure() << "element " << i << ": " << got[i] << " != " << want[i];
    return ::testing::AssertionSuccess();
}

TrainConfig optim_config() {
    TrainConfig c;
    c.grad_clip = 1.0;
    c.weight_decay = 0.5;  // large, so decay applied to the wrong tensor shows
    return c;
}

// Step s's gradients: large on even steps (norm above grad_clip: clipped), small on odd ones.
std::vector<float> step_grads(size_t n, int s) {
    return random_vector(n, (s % 2 == 0 ? 1.0 : 1e-4) / std::sqrt(double(n)) * 4, 1000 + s);
}

// One sharded step of every rank, as the NCCL trainer runs it: partial sums in rank order make the
// norm, each rank updates its shard. Returns the norm used.
double sharded_step(const ZeroPlan& plan, std::vector<ZeroShardState>& shards, const std::vector<float>& grads,
                    double lr, const TrainConfig& c) {
    std::vector<double> partials;
    for (int r = 0; r < plan.ranks; r++) partials.push_back(shard_grad_sum_of_squares(plan, r, grads.data()));
    const double norm = zero_grad_norm(partials);
    for (int r = 0; r < plan.ranks; r++) zero_adamw_step(plan, r, shards[r], grads.data(), lr, norm, c);
    return norm;
}

}  // namespace

TEST(ZeroPlan, ShardsCoverEveryElementOnceAlignedAndPadded) {
    for (const std::vector<ParamInfo>& layout : layouts())
        for (int R : kRankCounts) {
            SCOPED_TRACE("n = " + std::to_string(total(layout)) + ", R = " + std::to_string(R));
            const ZeroPlan plan = make_zero_plan(layout, R);
            const size_t n = total(layout);
            ASSERT_EQ(plan.n, n);
            ASSERT_EQ(plan.shards.size(), size_t(R));
            EXPECT_EQ(plan.shard_size % kShardAlign, 0u);
            EXPECT_EQ(plan.padded_total, plan.shard_size * R);
            EXPECT_GE(plan.padded_total, n);
            EXPECT_LT(plan.shard_size, (n + R - 1) / R + kShardAlign);  // no more padding than alignment needs
            std::vector<int> owners(n, 0);
            for (int r = 0; r < R; r++) {
                const RankShard& s = plan.shards[r];
                EXPECT_EQ(s.padded_begin, r * plan.shard_size);
                EXPECT_EQ(s.padded_end - s.padded_begin, plan.shard_size);
                EXPECT_LE(s.begin, s.end);
                if (s.begin < s.end) {
                    EXPECT_EQ(s.begin, s.padded_begin);
                    EXPECT_EQ(s.begin % kShardAlign, 0u);
                }
                for (size_t i = s.begin; i < s.end; i++) owners[i]++;
                // The touched tensors tile [begin, end), each inside its tensor, with its decay class.
                size_t at = s.begin;
                for (const TensorSpan& span : s.tensors) {
                    size_t tensor_begin = 0;
                    for (size_t i = 0; i < span.tensor; i++) tensor_begin += layout[i].size;
                    EXPECT_EQ(span.begin, at);
                    EXPECT_GE(span.begin, tensor_begin);
                    EXPECT_LE(span.end, tensor_begin + layout[span.tensor].size);
                    EXPECT_EQ(span.decay, layout[span.tensor].decay);
                    at = span.end;
                }
                EXPECT_EQ(at, s.end);
            }
            for (size_t i = 0; i < n; i++) ASSERT_EQ(owners[i], 1) << "element " << i;
        }
}

TEST(ZeroPlan, RefusesNoRanks) { EXPECT_THROW(make_zero_plan({{"w", 8, true}}, 0), Error); }

TEST(ZeroPlan, BucketsInBackwardOrderCoverTheLayoutAndSplitAtShards) {
    for (const ModelConfig& m : {ModelConfig{}, odd_model()})
        for (int R : kRankCounts) {
            SCOPED_TRACE("L = " + std::to_string(m.n_layer) + ", R = " + std::to_string(R));
            const ZeroPlan plan = make_zero_plan(param_layout(m), R);
            const std::vector<GradBucket> buckets = make_grad_buckets(m, plan);
            ASSERT_EQ(buckets.size(), size_t(m.n_layer + 1));
            for (int b = 0; b < m.n_layer; b++) EXPECT_EQ(buckets[b].layer, m.n_layer - 1 - b);
            EXPECT_EQ(buckets.back().layer, -1);
            std::vector<int> in_segment(plan.n, 0), in_piece(plan.n, 0);
            for (const GradBucket& bucket : buckets) {
                EXPECT_EQ(bucket.segments.size(), bucket.layer < 0 ? 4u : 12u);  // LayerParams' 12 tensors
                size_t segment_elements = 0, piece_elements = 0, last_end = 0;
                for (const TensorSpan& seg : bucket.segments) {
                    for (size_t i = seg.begin; i < seg.end; i++) in_segment[i]++;
                    segment_elements += seg.end - seg.begin;
                }
                for (const GradPiece& p : bucket.pieces) {
                    const RankShard& s = plan.shards[p.owner];
                    EXPECT_GE(p.begin, s.begin);
                    EXPECT_LE(p.end, s.end);
                    EXPECT_GE(p.begin, last_end);  // flat order
                    last_end = p.end;
                    for (size_t i = p.begin; i < p.end; i++) in_piece[i]++;
                    piece_elements += p.end - p.begin;
                }
                EXPECT_EQ(piece_elements, segment_elements);
            }
            for (size_t i = 0; i < plan.n; i++) {
                ASSERT_EQ(in_segment[i], 1) << "element " << i;
                ASSERT_EQ(in_piece[i], 1) << "element " << i;
            }
        }
}

// Weights and moments after several steps (clipped and not) equal AdamWCPU's bit for bit; padding
// stays zero. The norm each step uses is the sharded one (rank-order sum of the shards' partial
// sums), which equals global_grad_norm up to summation order, exactly for one rank.
TEST(ZeroStep, EqualsUnshardedAdamWBitForBit) {
    const TrainConfig c = optim_config();
    for (const std::vector<ParamInfo>& layout : layouts())
        for (int R : kRankCounts) {
            SCOPED_TRACE("n = " + std::to_string(total(layout)) + ", R = " + std::to_string(R));
            const size_t n = total(layout);
            const ZeroPlan plan = make_zero_plan(layout, R);
            std::vector<float> params = random_vector(n, 0.5, 7);
            AdamWCPU ref(layout);
            std::vector<ZeroShardState> shards = shard_zero_state(plan, params, ref.m, ref.v, ref.t);
            for (int s = 0; s < 4; s++) {
                const std::vector<float> grads = step_grads(n, s);
                const double lr = 1e-2 * (s + 1);
                const double norm = sharded_step(plan, shards, grads, lr, c);
                const double full_norm = global_grad_norm(grads.data(), n);
                if (R == 1) {
                    EXPECT_EQ(norm, full_norm);
                }
                EXPECT_NEAR(norm, full_norm, 1e-12 * full_norm);
                EXPECT_EQ(norm > c.grad_clip, s % 2 == 0);  // both clipped and unclipped steps are covered
                ref.step(params.data(), grads.data(), lr, norm, c);

                const std::vector<float> gathered = all_gather_master(plan, shards);
                ASSERT_EQ(gathered.size(), plan.padded_total);
                ASSERT_TRUE(same_bits(gathered, params, n)) << "weights, step " << s;
                for (size_t i = n; i < plan.padded_total; i++) ASSERT_EQ(gathered[i], 0.0f) << "padding " << i;
                const ZeroFullState full = gather_zero_state(plan, shards);
                ASSERT_TRUE(same_bits(full.m, ref.m, n)) << "first moment, step " << s;
                ASSERT_TRUE(same_bits(full.v, ref.v, n)) << "second moment, step " << s;
                EXPECT_EQ(full.t, ref.t);
                for (int r = 0; r < R; r++) {
                    for (size_t i = plan.shards[r].end - plan.shards[r].begin; i < plan.shard_size; i++) {
                        ASSERT_TRUE(shards[r].m[i] == 0.0f && shards[r].v[i] == 0.0f) << "rank " << r << " padding";
                    }
                }
            }
        }
}

// A state saved by R ranks (gathered to the full flat state, as a checkpoint holds it) and sharded
// for R' ranks gives the same full state, and training on with R' ranks continues the unsharded run
// bit for bit.
TEST(ZeroStep, ReshardingContinuesTheSameRun) {
    const TrainConfig c = optim_config();
    const std::vector<ParamInfo> layout = param_layout(odd_model());
    const size_t n = total(layout);
    for (int R : kRankCounts)
        for (int R2 : kRankCounts) {
            SCOPED_TRACE("R = " + std::to_string(R) + " -> R' = " + std::to_string(R2));
            std::vector<float> params = random_vector(n, 0.5, 7);
            AdamWCPU ref(layout);
            const ZeroPlan plan = make_zero_plan(layout, R), plan2 = make_zero_plan(layout, R2);
            std::vector<ZeroShardState> shards = shard_zero_state(plan, params, ref.m, ref.v, ref.t);
            for (int s = 0; s < 2; s++) {
                const std::vector<float> grads = step_grads(n, s);
                ref.step(params.data(), grads.data(), 1e-2, sharded_step(plan, shards, grads, 1e-2, c), c);
            }
            const ZeroFullState saved = gather_zero_state(plan, shards);
            std::vector<ZeroShardState> shards2 = shard_zero_state(plan2, saved.master, saved.m, saved.v, saved.t);
            const ZeroFullState resumed = gather_zero_state(plan2, shards2);
            ASSERT_TRUE(same_bits(resumed.master, saved.master, n));
            ASSERT_TRUE(same_bits(resumed.m, saved.m, n));
            ASSERT_TRUE(same_bits(resumed.v, saved.v, n));
            EXPECT_EQ(resumed.t, 2);
            for (int s = 2; s < 4; s++) {
                const std::vector<float> grads = step_grads(n, s);
                ref.step(params.data(), grads.data(), 1e-2, sharded_step(plan2, shards2, grads, 1e-2, c), c);
            }
            const ZeroFullState after = gather_zero_state(plan2, shards2);
            ASSERT_TRUE(same_bits(after.master, params, n));
            ASSERT_TRUE(same_bits(after.m, ref.m, n));
            ASSERT_TRUE(same_bits(after.v, ref.v, n));
            EXPECT_EQ(after.t, 4);
        }
}
