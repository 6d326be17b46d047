#include "gpu_training.hpp"

#include <cstdio>
#include <limits>

#include "adamw.cuh"
#include "master_weights.cuh"
#include "tensor_dump.hpp"

namespace codagpt {

std::string DeviceBuffers::out_of_memory(size_t asked) const {
    constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) (void)cudaGetLastError();
    char msg[256];
    std::snprintf(msg, sizeof msg,
                  "out of GPU memory: a cudaMalloc of %.2f GiB failed with %.2f GiB of this model's buffers allocated "
                  "and %.2f of %.2f GiB free",
                  asked / kGiB, bytes / kGiB, free / kGiB, total / kGiB);
    return hint.empty() ? msg : std::string(msg) + "; " + hint;
}

double mean_device_loss(const float* losses, int n, cudaStream_t stream, std::vector<float>& host) {
    host.resize(n);
    CUDA_CHECK(cudaMemcpyAsync(host.data(), losses, n * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    double sum = 0;
    for (float x : host) sum += x;
    return sum / n;
}

void upload_bf16(bf16* dst, const std::vector<float>& params) {
    std::vector<uint16_t> rounded(params.size());
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < params.size(); i++) rounded[i] = master_hi(params[i]);
    CUDA_CHECK(cudaMemcpy(dst, rounded.data(), rounded.size() * sizeof(bf16), cudaMemcpyHostToDevice));
}

std::vector<float> download_bf16(const bf16* src, size_t n, cudaStream_t stream) {
    std::vector<bf16> h(n);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaMemcpy(h.data(), src, n * sizeof(bf16), cudaMemcpyDeviceToHost));
    std::vector<float> out(n);
    for (size_t i = 0; i < n; i++) out[i] = __bfloat162float(h[i]);
    return out;
}

void dump(int layer, std::initializer_list<DumpedTensor> tensors, cudaStream_t stream) {
    if (!dump_layer(layer)) return;
    for (const DumpedTensor& t : tensors) dump_tensor(t.name, layer, download_bf16(t.data, t.n, stream).data(), t.n);
}

void device_shard_norm_squared(const OptimizerBuffers& b, float* out, cudaStream_t stream) {
    global_norm_squared(out, b.norm_scratch, b.grads + b.shard->begin, b.shard->end - b.shard->begin, stream);
}

void device_adamw_step(const OptimizerBuffers& b, int t, double lr, const TrainConfig& c, cudaStream_t stream) {
    float* const norm_sq = b.scalars;
    float* const grad_scale = b.scalars + 2;
    clip_scale(grad_scale, nullptr, norm_sq, (float)c.grad_clip, stream);
    for (const TensorSpan& span : b.shard->tensors) {
        const AdamWArgs args{(float)lr, (float)c.beta1, (float)c.beta2, (float)c.adam_eps,
                             span.decay ? (float)c.weight_decay : 0.0f, t};
        const size_t local = span.begin - b.shard->begin;  // where the span sits in master_lo, m, v
        adamw_update(b.params + span.begin, b.master_lo + local, b.grads + span.begin, b.m + local, b.v + local,
                     span.end - span.begin, args, grad_scale, stream);
    }
}

namespace {
ZeroPlan plan_of(const ModelConfig& c, const DataParallel* dp) {
    return dp ? dp->plan() : make_zero_plan(param_layout(c), 1);
}
}  // namespace

bool written_by_weight_gemms(const std::string& tensor) {
    for (const char* name : {"wte", "qkv_w", "proj_w", "fc_w", "fcproj_w"})
        if (tensor == name) return true;
    return false;
}

size_t TrainableParams::device_bytes(const ModelConfig& c, const DataParallel* dp) {
    const ZeroPlan plan = plan_of(c, dp);
    const size_t P = plan.padded_total, S = plan.shard_size;
    return P * (sizeof(bf16) + sizeof(float)) + S * (sizeof(uint16_t) + 2 * sizeof(float));
}

TrainableParams::TrainableParams(const ModelConfig& c, std::shared_ptr<DataParallel> dp, cudaStream_t stream,
                                 const std::function<void*(size_t)>& alloc)
    : plan_(plan_of(c, dp.get())), rank_(dp ? dp->rank() : 0), dp_(std::move(dp)), stream_(stream) {
    const size_t P = plan_.padded_total, S = plan_.shard_size;
    params_ = static_cast<bf16*>(alloc(P * sizeof(bf16)));
    grads_ = static_cast<float*>(alloc(P * sizeof(float)));
    master_lo_ = static_cast<uint16_t*>(alloc(S * sizeof(uint16_t)));
    m_ = static_cast<float*>(alloc(S * sizeof(float)));
    v_ = static_cast<float*>(alloc(S * sizeof(float)));
    scalars_ = static_cast<float*>(alloc(4 * sizeof(float)));
    norm_scratch_ = static_cast<float*>(alloc(global_norm_scratch_floats() * sizeof(float)));
    norm_partials_ = static_cast<float*>(alloc(plan_.ranks * sizeof(float)));
    size_t offset = 0;  // zero_grad's ranges
    for (const ParamInfo& t : plan_.layout) {
        if (!written_by_weight_gemms(t.name)) {
            if (!zeroed_.empty() && zeroed_.back().second == offset) zeroed_.back().second += t.size;
            else zeroed_.push_back({offset, offset + t.size});
        }
        offset += t.size;
    }
    // The padding stays zero in every buffer: nothing ever writes past the real elements.
    CUDA_CHECK(cudaMemset(params_, 0, P * sizeof(bf16)));
    CUDA_CHECK(cudaMemset(grads_, 0, P * sizeof(float)));
    CUDA_CHECK(cudaMemset(master_lo_, 0, S * sizeof(uint16_t)));
    CUDA_CHECK(cudaMemset(m_, 0, S * sizeof(float)));
    CUDA_CHECK(cudaMemset(v_, 0, S * sizeof(float)));
}

TrainableParams::~TrainableParams() {
    for (cudaEvent_t e : phase_events_)
        if (e) cudaEventDestroy(e);
}

OptimizerBuffers TrainableParams::buffers() const {
    return {&plan_.shards[rank_], params_, master_lo_, grads_, m_, v_, scalars_, norm_scratch_};
}

void TrainableParams::set_params(const std::vector<float>& params) {
    if (params.size() != plan_.n) throw Error("set_params: expected " + std::to_string(plan_.n) + " values");
    const RankShard& s = plan_.shards[rank_];
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<uint16_t> lo(s.end - s.begin);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < lo.size(); i++) lo[i] = master_lo(params[s.begin + i]);
    CUDA_CHECK(cudaMemcpy(master_lo_, lo.data(), lo.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
    upload_bf16(params_, params);
}

std::vector<float> TrainableParams::gather(const float* shard_buf) const {
    std::vector<float> full(dp_ && rank_ != 0 ? 0 : plan_.n);  // other ranks only send
    gather_into(full.data(), shard_buf, sizeof(float));
    return full;
}

void TrainableParams::gather_into(void* full, const void* shard_buf, size_t elem_bytes) const {
    if (dp_) {
        dp_->gather_to_root(full, shard_buf, elem_bytes, stream_);
    } else {
        CUDA_CHECK(cudaStreamSynchronize(stream_));
        CUDA_CHECK(cudaMemcpy(full, shard_buf, plan_.n * elem_bytes, cudaMemcpyDeviceToHost));
    }
}

// The low halves gathered from the shards, joined on rank 0 with the bf16 halves it holds for all.
std::vector<float> TrainableParams::master_params() const {
    const bool root = !dp_ || rank_ == 0;
    std::vector<uint16_t> lo(root ? plan_.n : 0), hi(lo.size());
    gather_into(lo.data(), master_lo_, sizeof(uint16_t));
    if (!root) return {};
    CUDA_CHECK(cudaMemcpy(hi.data(), params_, plan_.n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    std::vector<float> full(plan_.n);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < full.size(); i++) full[i] = master_join(hi[i], lo[i]);
    return full;
}
std::vector<float> TrainableParams::m() const { return gather(m_); }
std::vector<float> TrainableParams::v() const { return gather(v_); }

void TrainableParams::set_optimizer_state(const std::vector<float>& m, const std::vector<float>& v, long t) {
    if (m.size() != plan_.n || v.size() != plan_.n)
        throw Error("set_optimizer_state: expected " + std::to_string(plan_.n) + " values per moment");
    if (t < 0 || t > std::numeric_limits<int>::max())
        throw Error("set_optimizer_state: step count " + std::to_string(t) + " out of range");
    const RankShard& s = plan_.shards[rank_];
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaMemcpy(m_, m.data() + s.begin, (s.end - s.begin) * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(v_, v.data() + s.begin, (s.end - s.begin) * sizeof(float), cudaMemcpyHostToDevice));
    step_ = (int)t;
}

std::vector<float> TrainableParams::local_grads() const {
    std::vector<float> h(plan_.n);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUDA_CHECK(cudaMemcpy(h.data(), grads_, plan_.n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

void TrainableParams::zero_grad() {
    mark(kStepBegin);  // a step's first work on the stream
    for (const auto& [begin, end] : zeroed_)
        CUDA_CHECK(cudaMemsetAsync(grads_ + begin, 0, (end - begin) * sizeof(float), stream_));
    first_backward_ = true;
}

void TrainableParams::layer_grads_done(int layer) {
    if (layer < 0) {
        mark(kBackwardEnd);  // the last backward of the step records it last
        first_backward_ = false;
    }
    if (dp_) dp_->bucket_done(layer, grads_, stream_);
}

double TrainableParams::grad_norm() {
    const OptimizerBuffers b = buffers();
    float* const norm_sq = scalars_;
    if (dp_) dp_->wait_for_gradients(grads_, stream_);
    mark(kOptimizerBegin);
    if (dp_) {
        device_shard_norm_squared(b, norm_partials_ + rank_, stream_);
        dp_->all_gather_norm_partials(norm_partials_, stream_);
        sum_in_order(norm_sq, norm_partials_, plan_.ranks, stream_);
    } else {
        device_shard_norm_squared(b, norm_sq, stream_);
    }
    float* const norm = scalars_ + 1;
    clip_scale(scalars_ + 2, norm, norm_sq, /*clip=*/0.0f, stream_);  // the norm; the scale is set by the step
    float host_norm = 0;
    CUDA_CHECK(cudaMemcpyAsync(&host_norm, norm, sizeof(float), cudaMemcpyDeviceToHost, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    return host_norm;
}

void TrainableParams::apply_update(double lr, const TrainConfig& c) {
    device_adamw_step(buffers(), ++step_, lr, c, stream_);
    if (dp_) dp_->all_gather_weights(params_, stream_);
    mark(kOptimizerEnd);
}

void TrainableParams::mark(int event) {
    if (!phase_events_.empty()) CUDA_CHECK(cudaEventRecord(phase_events_[event], stream_));
}

void TrainableParams::time_phases() {
    if (!phase_events_.empty()) return;
    phase_events_.assign(kPhaseEvents, nullptr);
    for (cudaEvent_t& e : phase_events_) CUDA_CHECK(cudaEventCreate(&e));
    if (dp_) dp_->time_reductions();
}

StepPhases TrainableParams::phases() const {
    if (phase_events_.empty()) throw Error("TrainableParams::phases: time_phases() was not called");
    auto since_begin = [&](cudaEvent_t e) {
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, phase_events_[kStepBegin], e));
        return (double)ms;
    };
    StepMarks m;
    m.backward_end = since_begin(phase_events_[kBackwardEnd]);
    m.optimizer_begin = since_begin(phase_events_[kOptimizerBegin]);
    m.optimizer_end = since_begin(phase_events_[kOptimizerEnd]);
    if (dp_)
        for (const auto& [start, end] : dp_->reduction_events())
            m.reductions.push_back({since_begin(start), since_begin(end)});
    return step_phases(m);
}

}  // namespace codagpt
