#include "zero_shard.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "common.hpp"
#include "optim_cpu.hpp"

namespace codagpt {

namespace {

// The spans of `layout`'s tensors that flat [begin, end) touches, in layout order.
std::vector<TensorSpan> spans_of(const std::vector<ParamInfo>& layout, size_t begin, size_t end) {
    std::vector<TensorSpan> spans;
    size_t tensor_begin = 0;
    for (size_t i = 0; i < layout.size(); i++) {
        const size_t lo = std::max(begin, tensor_begin), hi = std::min(end, tensor_begin + layout[i].size);
        if (lo < hi) spans.push_back({i, layout[i].decay, lo, hi});
        tensor_begin += layout[i].size;
    }
    return spans;
}

// The tensors of for_each_param that are not stacked over layers; every other one is [L, ...].
bool is_layer_stacked(const std::string& name) {
    return name != "wte" && name != "wpe" && name != "lnf_w" && name != "lnf_b";
}

}  // namespace

ZeroPlan make_zero_plan(const std::vector<ParamInfo>& layout, int ranks) {
    if (ranks < 1) throw Error("ZeRO-1 plan: rank count " + std::to_string(ranks) + " is not positive");
    ZeroPlan plan;
    plan.layout = layout;
    for (const ParamInfo& t : layout) plan.n += t.size;
    plan.ranks = ranks;
    const size_t per_rank = (plan.n + ranks - 1) / ranks;
    plan.shard_size = (per_rank + kShardAlign - 1) / kShardAlign * kShardAlign;
    plan.padded_total = plan.shard_size * ranks;
    for (int r = 0; r < ranks; r++) {
        RankShard s;
        s.padded_begin = r * plan.shard_size;
        s.padded_end = s.padded_begin + plan.shard_size;
        s.begin = std::min(s.padded_begin, plan.n);
        s.end = std::min(s.padded_end, plan.n);
        s.tensors = spans_of(layout, s.begin, s.end);
        plan.shards.push_back(std::move(s));
    }
    return plan;
}

std::vector<GradBucket> make_grad_buckets(const ModelConfig& m, const ZeroPlan& plan) {
    const std::vector<ParamInfo> layout = param_layout(m);
    bool same = plan.layout.size() == layout.size();
    for (size_t i = 0; same && i < layout.size(); i++)
        same = plan.layout[i].name == layout[i].name && plan.layout[i].size == layout[i].size;
    if (!same) throw Error("ZeRO-1 buckets: the plan is not of this model's parameter layout");
    const size_t L = m.n_layer;
    std::vector<GradBucket> buckets(L + 1);
    for (size_t l = 0; l < L; l++) buckets[l].layer = int(L - 1 - l);
    buckets[L].layer = -1;
    size_t tensor_begin = 0;
    for (size_t i = 0; i < layout.size(); i++) {
        const ParamInfo& t = layout[i];
        if (is_layer_stacked(t.name)) {
            const size_t per_layer = t.size / L;
            for (size_t l = 0; l < L; l++) {
                const size_t b = tensor_begin + l * per_layer;
                buckets[L - 1 - l].segments.push_back({i, t.decay, b, b + per_layer});
            }
        } else {
            buckets[L].segments.push_back({i, t.decay, tensor_begin, tensor_begin + t.size});
        }
        tensor_begin += t.size;
    }
    for (GradBucket& bucket : buckets)
        for (const TensorSpan& seg : bucket.segments)
            for (int r = 0; r < plan.ranks; r++) {
                const RankShard& s = plan.shards[r];
                const size_t lo = std::max(seg.begin, s.begin), hi = std::min(seg.end, s.end);
                if (lo < hi) bucket.pieces.push_back({lo, hi, r});
            }
    return buckets;
}

std::vector<ZeroShardState> shard_zero_state(const ZeroPlan& plan, const std::vector<float>& master,
                                             const std::vector<float>& m, const std::vector<float>& v, long t) {
    if (master.size() != plan.n || m.size() != plan.n || v.size() != plan.n)
        throw Error("ZeRO-1: optimizer state of " + std::to_string(master.size()) + " elements for a plan of " +
                    std::to_string(plan.n));
    std::vector<ZeroShardState> shards(plan.ranks);
    for (int r = 0; r < plan.ranks; r++) {
        const RankShard& s = plan.shards[r];
        auto chunk = [&](const std::vector<float>& full) {
            std::vector<float> c(plan.shard_size, 0.0f);
            std::copy(full.begin() + s.begin, full.begin() + s.end, c.begin());
            return c;
        };
        shards[r] = {chunk(master), chunk(m), chunk(v), t};
    }
    return shards;
}

ZeroFullState gather_zero_state(const ZeroPlan& plan, const std::vector<ZeroShardState>& shards) {
    ZeroFullState full{std::vector<float>(plan.n), std::vector<float>(plan.n), std::vector<float>(plan.n),
                       shards.at(0).t};
    for (int r = 0; r < plan.ranks; r++) {
        const RankShard& s = plan.shards[r];
        const size_t len = s.end - s.begin;
        std::copy_n(shards[r].master.begin(), len, full.master.begin() + s.begin);
        std::copy_n(shards[r].m.begin(), len, full.m.begin() + s.begin);
        std::copy_n(shards[r].v.begin(), len, full.v.begin() + s.begin);
    }
    return full;
}

double shard_grad_sum_of_squares(const ZeroPlan& plan, int rank, const float* grads) {
    const RankShard& s = plan.shards.at(rank);
    return sum_of_squares(grads + s.begin, s.end - s.begin);
}

double zero_grad_norm(const std::vector<double>& partial_sums) {
    double sum = 0;
    for (double s : partial_sums) sum += s;
    return std::sqrt(sum);
}

void zero_adamw_step(const ZeroPlan& plan, int rank, ZeroShardState& state, const float* grads, double lr,
                     double grad_norm, const TrainConfig& c) {
    const RankShard& s = plan.shards.at(rank);
    state.t++;
    adamw_update_range(plan.layout, s.begin, s.end, state.master.data(), grads + s.begin, state.m.data(),
                       state.v.data(), state.t, lr, grad_norm, c);
}

std::vector<float> all_gather_master(const ZeroPlan& plan, const std::vector<ZeroShardState>& shards) {
    std::vector<float> gathered(plan.padded_total);
    for (int r = 0; r < plan.ranks; r++)
        std::copy(shards[r].master.begin(), shards[r].master.end(), gathered.begin() + plan.shards[r].padded_begin);
    return gathered;
}

}  // namespace codagpt
