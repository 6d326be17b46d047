// The loss and optimizer kernels against the CPU reference: the fused classifier (softmax +
// cross-entropy + dlogits) against a double-precision softmax of the same bf16 logits, the global
// gradient norm against a double sum, and AdamW against AdamWCPU over several steps. Each also
// checks determinism (same inputs, same bytes) and prints its bandwidth on large inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "adamw.cuh"
#include "classifier.cuh"
#include "gpu_test_util.hpp"
#include "optim_cpu.hpp"
#include "test_util.hpp"

using namespace codagpt;
using namespace codagpt::test;

namespace {

constexpr double kCopyBandwidth = 4.24e12;  // H200 device-to-device copy, bytes read + written per s

// dst[0..n) = src[0..chunk) repeated: large inputs made from a small random chunk (random data
// for timing without generating gigabytes on the host).
template <typename T>
void fill_tiled(T* dst, size_t n, const T* src_device, size_t chunk) {
    size_t done = std::min(n, chunk);
    CUDA_CHECK(cudaMemcpy(dst, src_device, done * sizeof(T), cudaMemcpyDeviceToDevice));
    while (done < n) {
        const size_t c = std::min(done, n - done);
        CUDA_CHECK(cudaMemcpy(dst + done, dst, c * sizeof(T), cudaMemcpyDeviceToDevice));
        done += c;
    }
}

template <typename T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Median time in ms of `reps` runs of `body`, each preceded (untimed) by `prepare`.
template <typename Prepare, typename Body>
float median_ms(int reps, Prepare prepare, Body body) {
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    std::vector<float> ms;
    for (int r = 0; r < reps + 1; r++) {  // the first run warms up
        prepare();
        CUDA_CHECK(cudaEventRecord(start));
        body();
        CUDA_CHECK(cudaEventRecord(stop));
        CUDA_CHECK(cudaEventSynchronize(stop));
        float t = 0;
        CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
        if (r > 0) ms.push_back(t);
    }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

// ---------------------------------------------------------------- classifier

// Random bf16 logits (std 2) with padded columns holding +30, which would dominate the softmax if
// the kernel read them. Some rows aim at the awkward places: target in the last real column (the
// lone real column of the last pack when V = 50257), the last real column dominant, target first.
struct ClassifierInput {
    std::vector<float> logits;  // [M, Vp], bf16 values
    std::vector<int> targets;
};
ClassifierInput make_classifier_input(int M, int V, int Vp, uint64_t seed) {
    ClassifierInput in;
    in.logits.resize((size_t)M * Vp);
    in.targets.resize(M);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++) {
        Rng rng(seed * 1000003 + i);
        float* z = in.logits.data() + (size_t)i * Vp;
        for (int c = 0; c < Vp; c++) z[c] = c < V ? bf16_round(2.0f * (float)rng.normal()) : 30.0f;
        int t = (int)rng.below(V);
        if (i % 7 == 3) t = V - 1;
        if (i % 13 == 0) t = 0;
        if (i % 11 == 5) z[V - 1] = 12.0f;
        if (i % 17 == 1) z[t] = 10.0f;  // confident and right: softmax - 1 cancels at the target
        in.targets[i] = t;
    }
    return in;
}

struct ClassifierErrors {
    double loss_abs = 0;        // max |loss - ref|
    double dlogit_ratio = 0;    // max |d - ref| / |ref| over real columns
    double dlogit_rel = 0;      // ||d - ref|| / ||ref|| over the whole matrix
    long bad_padding = 0;       // padded columns not exactly +0
};

// The reference in double from the same bf16 logits.
ClassifierErrors compare_classifier(const ClassifierInput& in, const std::vector<float>& losses,
                                    const std::vector<bf16>* dlogits, int M, int V, int Vp, double dloss) {
    ClassifierErrors e;
    double num = 0, den = 0;
    double loss_abs = 0, ratio = 0;
    long bad_padding = 0;
#pragma omp parallel for schedule(static) reduction(+ : num, den, bad_padding) reduction(max : loss_abs, ratio)
    for (int i = 0; i < M; i++) {
        const float* z = in.logits.data() + (size_t)i * Vp;
        double mx = z[0];
        for (int c = 0; c < V; c++) mx = std::max(mx, (double)z[c]);
        double sum = 0;
        for (int c = 0; c < V; c++) sum += std::exp(z[c] - mx);
        const int t = in.targets[i];
        const double ref_loss = mx + std::log(sum) - z[t];
        const double le = std::isfinite(losses[i]) ? std::fabs(losses[i] - ref_loss) : INFINITY;
        loss_abs = std::max(loss_abs, le);
        if (!dlogits) continue;
        const bf16* d = dlogits->data() + (size_t)i * Vp;
        for (int c = 0; c < V; c++) {
            const double ref = (std::exp(z[c] - mx) / sum - (c == t ? 1.0 : 0.0)) * dloss;
            const double out = __bfloat162float(d[c]);
            const double err = std::isfinite(out) ? std::fabs(out - ref) : INFINITY;
            ratio = std::max(ratio, ref != 0 ? err / std::fabs(ref) : (err == 0 ? 0.0 : INFINITY));
            num += err * err;
            den += ref * ref;
        }
        for (int c = V; c < Vp; c++) {
            uint16_t bits;
            std::memcpy(&bits, &d[c], 2);
            if (bits != 0) bad_padding++;
        }
    }
    e.loss_abs = loss_abs;
    e.dlogit_ratio = ratio;
    e.dlogit_rel = std::sqrt(num / std::max(den, 1e-300));
    e.bad_padding = bad_padding;
    return e;
}

void check_classifier(int M, int V, int Vp, uint64_t seed) {
    SCOPED_TRACE("M=" + std::to_string(M) + " V=" + std::to_string(V) + " Vp=" + std::to_string(Vp));
    const ClassifierInput in = make_classifier_input(M, V, Vp, seed);
    const std::vector<bf16> logits_bf16 = to_bf16(in.logits);
    const float dloss = 1.0f / (float)M;

    DeviceBuffer<bf16> logits((size_t)M * Vp);
    DeviceBuffer<float> losses(M);
    DeviceBuffer<int> targets(M);
    targets.upload(in.targets);

    logits.upload(logits_bf16);
    losses.poison();
    fused_classifier(logits, losses, targets, M, V, Vp, dloss, true, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> loss1 = losses.download();
    const std::vector<bf16> dlogits1 = logits.download();

    // Bounds. Loss: fp32 max/log-sum-exp of up to 5e4 exps (fast-math exp, ~2 ulp each) summed in a
    // tree: relative error ~1e-6 of a loss ~11, i.e. ~1e-5 absolute at worst; 5e-5 still catches a
    // dropped or extra column (the rows whose last real column dominates move by O(1)).
    // dlogits, per element: the fp32 value is within ~1e-5 relative of the exact one (exp, sum,
    // 1/sum; softmax - 1 at a confident target amplifies that by < 1e2 on ~1e-7 terms), then one
    // bf16 rounding (8-bit significand, unit roundoff 2^-8 = 3.906e-3) adds at most 3.906e-3
    // relative: bound 3.95e-3 per element (a wrong column or a missing 1/sum is off by far more).
    const ClassifierErrors e = compare_classifier(in, loss1, &dlogits1, M, V, Vp, dloss);
    printf("[classifier M=%d V=%d Vp=%d] max |loss err| %.3g (bound 5e-5), max dlogit err/|ref| %.3g (bound 3.95e-3), "
           "||d-ref||/||ref|| %.3g (bound 4e-3), nonzero padded %ld\n",
           M, V, Vp, e.loss_abs, e.dlogit_ratio, e.dlogit_rel, e.bad_padding);
    EXPECT_LE(e.loss_abs, 5e-5);
    EXPECT_LE(e.dlogit_ratio, 3.95e-3);
    EXPECT_LE(e.dlogit_rel, 4e-3);
    EXPECT_EQ(e.bad_padding, 0);

    // Determinism: the same logits give the same bytes.
    logits.upload(logits_bf16);
    losses.poison();
    fused_classifier(logits, losses, targets, M, V, Vp, dloss, true, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(same_bytes(losses.download(), loss1)) << "losses differ between two runs";
    EXPECT_TRUE(same_bytes(logits.download(), dlogits1)) << "dlogits differ between two runs";

    // Loss only (evaluation): the same losses, logits untouched.
    logits.upload(logits_bf16);
    losses.poison();
    fused_classifier(logits, losses, targets, M, V, Vp, dloss, false, nullptr);
    CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_TRUE(same_bytes(losses.download(), loss1)) << "loss-only losses differ from the fused run";
    EXPECT_TRUE(same_bytes(logits.download(), logits_bf16)) << "loss-only run wrote the logits";
}

// ---------------------------------------------------------------- AdamW

std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
    Rng rng(seed);
    std::vector<float> x(n);
    for (float& v : x) v = scale * (float)rng.normal();
    return x;
}

// Gradients spanning six decades, so that eps matters for some elements and not for others.
std::vector<float> random_grads(size_t n, uint64_t seed) {
    Rng rng(seed);
    std::vector<float> g(n);
    for (float& v : g) v = (float)(rng.normal() * std::pow(10.0, -6.0 * rng.uniform()));
    return g;
}

// The master weights are params (bf16) and lo (their low halves): master_weights.cuh.
struct GpuAdamW {
    DeviceBuffer<float> grads, m, v, scratch, norm2, norm, scale;
    DeviceBuffer<bf16> params;
    DeviceBuffer<uint16_t> lo;
    explicit GpuAdamW(size_t n)
        : grads(n), m(n), v(n), scratch(global_norm_scratch_floats()), norm2(1), norm(1), scale(1), params(n), lo(n) {}
    void upload_master(const std::vector<float>& w) {
        params.upload(master_his(w));
        lo.upload(master_los(w));
    }
    std::vector<float> master() const { return master_joined(params.download(), lo.download()); }
};

}  // namespace

TEST(FusedClassifier, MatchesDoubleReferenceGpt2Vocab) {
    REQUIRE_GPU();
    check_classifier(4096, 50257, 50304, 1);
}

TEST(FusedClassifier, MatchesDoubleReferenceSmallVocab) {
    REQUIRE_GPU();
    check_classifier(37, 201, 256, 2);   // V not a multiple of 8
    check_classifier(5, 1, 128, 3);      // a single real column: loss 0, dlogits 0
    check_classifier(3, 128, 128, 4);    // no padding
}

TEST(FusedClassifier, RejectsBadShapes) {
    REQUIRE_GPU();
    EXPECT_THROW(fused_classifier(nullptr, nullptr, nullptr, 1, 300, 256, 1.0f, true, nullptr), Error);
    EXPECT_THROW(fused_classifier(nullptr, nullptr, nullptr, 1, 100, 132, 1.0f, true, nullptr), Error);
}

TEST(FusedClassifier, Bandwidth) {
    REQUIRE_GPU();
    const int M = 16384, V = 50257, Vp = 50304, M0 = 1024;
    const ClassifierInput in = make_classifier_input(M0, V, Vp, 5);
    const size_t n = (size_t)M * Vp;
    DeviceBuffer<bf16> chunk((size_t)M0 * Vp), pristine(n), logits(n);
    DeviceBuffer<float> losses(M);
    DeviceBuffer<int> targets(M);
    chunk.upload(to_bf16(in.logits));
    fill_tiled(pristine.ptr, n, chunk.ptr, (size_t)M0 * Vp);
    Rng rng(6);
    std::vector<int> t(M);
    for (int& x : t) x = (int)rng.below(V);
    targets.upload(t);
    auto restore = [&] { CUDA_CHECK(cudaMemcpy(logits.ptr, pristine.ptr, n * 2, cudaMemcpyDeviceToDevice)); };
    const float fused = median_ms(5, restore, [&] { fused_classifier(logits, losses, targets, M, V, Vp, 1.0f / M, true, nullptr); });
    const float loss_only = median_ms(5, restore, [&] { fused_classifier(logits, losses, targets, M, V, Vp, 1.0f / M, false, nullptr); });
    const double bytes = (double)n * 2;
    printf("[classifier bandwidth M=%d V=%d] fused (read 2x + write 1x): %.3f ms, %.0f GB/s = %.0f%% of copy; "
           "loss only (read 1x): %.3f ms, %.0f GB/s = %.0f%%\n",
           M, V, fused, 3 * bytes / fused / 1e6, 100 * 3 * bytes / fused / 1e-3 / kCopyBandwidth, loss_only,
           bytes / loss_only / 1e6, 100 * bytes / loss_only / 1e-3 / kCopyBandwidth);
    // the losses of the last run are real numbers (the timed kernel did its work)
    const std::vector<float> l = losses.download();
    EXPECT_TRUE(std::all_of(l.begin(), l.end(), [](float x) { return std::isfinite(x) && x > 0; }));
}

TEST(GlobalNorm, MatchesDoubleSumAndIsDeterministic) {
    REQUIRE_GPU();
    // odd sizes and unaligned starts exercise the scalar head and tail around the 16-byte packs
    const size_t sizes[] = {1, 3, 1000003, 37000001};
    DeviceBuffer<float> grads(37000001 + 3), scratch(global_norm_scratch_floats()), out(1);
    const std::vector<float> h = random_floats(37000001 + 3, 7, 0.01f);
    grads.upload(h);
    for (size_t n : sizes) {
        for (size_t offset : {size_t(0), size_t(1), size_t(3)}) {
            double ref = 0;
            for (size_t i = 0; i < n; i++) ref += (double)h[offset + i] * h[offset + i];
            float r1, r2;
            out.poison();
            global_norm_squared(out, scratch, grads.ptr + offset, n, nullptr);
            CUDA_CHECK(cudaMemcpy(&r1, out.ptr, 4, cudaMemcpyDeviceToHost));
            out.poison();
            scratch.poison();
            global_norm_squared(out, scratch, grads.ptr + offset, n, nullptr);
            CUDA_CHECK(cudaMemcpy(&r2, out.ptr, 4, cudaMemcpyDeviceToHost));
            const double rel = std::fabs(r1 - ref) / ref;
            if (n > 1000) printf("[global norm n=%zu offset=%zu] rel error %.3g (bound 1e-5)\n", n, offset, rel);
            // double sums per thread, fp32 partials and result: ~1e-7; the bound leaves room
            EXPECT_LE(rel, 1e-5) << "n=" << n << " offset=" << offset;
            EXPECT_EQ(std::memcmp(&r1, &r2, 4), 0) << "two runs differ, n=" << n;
        }
    }
}

TEST(ClipScale, Values) {
    REQUIRE_GPU();
    DeviceBuffer<float> norm2(1), scale(1), norm(1);
    struct Case { float norm2, clip, scale; } cases[] = {
        {16.0f, 1.0f, 0.25f},  // clipped: 1 / 4
        {0.25f, 1.0f, 1.0f},   // norm 0.5 below the clip
        {16.0f, 0.0f, 1.0f},   // clipping disabled
        {16.0f, 4.0f, 1.0f},   // exactly at the clip: unchanged
        {2.0f, 1.0f, (float)(1.0 / std::sqrt(2.0))},
    };
    for (const Case& c : cases) {
        norm2.upload({c.norm2});
        scale.poison();
        norm.poison();
        clip_scale(scale, norm, norm2, c.clip, nullptr);
        const float s = scale.download()[0], nr = norm.download()[0];
        EXPECT_NEAR(s, c.scale, 1e-7) << "norm2=" << c.norm2 << " clip=" << c.clip;
        EXPECT_NEAR(nr, std::sqrt(c.norm2), 1e-7);
    }
    clip_scale(scale, nullptr, norm2, 1.0f, nullptr);  // norm output optional
    CUDA_CHECK(cudaDeviceSynchronize());
}

// Three steps of norm -> clip -> AdamW on a decayed tensor (n not a multiple of 8) followed by a
// non-decayed one at an odd offset, against AdamWCPU with the same settings. Clipping is active at
// step 1, disabled at step 2 and above the norm at step 3.
TEST(AdamW, MatchesCpuReferenceOverSteps) {
    REQUIRE_GPU();
    const size_t n1 = 1000003, n2 = 4099, n = n1 + n2;
    const std::vector<ParamInfo> layout = {{"w", n1, true}, {"b", n2, false}};
    TrainConfig c;
    c.beta1 = 0.9;
    c.beta2 = 0.95;
    c.adam_eps = 1e-8;
    c.weight_decay = 0.1;
    const double lrs[] = {2e-2, 3e-2, 1e-2};
    const double clips[] = {1e-3, 0.0, 1e6};

    const std::vector<float> p0 = random_floats(n, 11);
    std::vector<float> p_cpu = p0;
    AdamWCPU cpu(layout);

    GpuAdamW runs[2] = {GpuAdamW(n), GpuAdamW(n)};
    for (GpuAdamW& g : runs) {
        g.upload_master(p0);
        CUDA_CHECK(cudaMemset(g.m.ptr, 0, n * 4));  // the optimizer state starts at zero, as on the CPU
        CUDA_CHECK(cudaMemset(g.v.ptr, 0, n * 4));
    }
    for (int t = 1; t <= 3; t++) {
        SCOPED_TRACE("step " + std::to_string(t));
        const std::vector<float> grads = random_grads(n, 100 + t);
        c.grad_clip = clips[t - 1];
        for (GpuAdamW& g : runs) {
            g.grads.upload(grads);
            g.norm2.poison();
            g.scale.poison();
            global_norm_squared(g.norm2, g.scratch, g.grads, n, nullptr);
            clip_scale(g.scale, g.norm, g.norm2, (float)c.grad_clip, nullptr);
            AdamWArgs a{(float)lrs[t - 1], (float)c.beta1, (float)c.beta2, (float)c.adam_eps, (float)c.weight_decay, t};
            adamw_update(g.params, g.lo, g.grads, g.m, g.v, n1, a, g.scale, nullptr);
            a.weight_decay = 0.0f;
            adamw_update(g.params.ptr + n1, g.lo.ptr + n1, g.grads.ptr + n1, g.m.ptr + n1, g.v.ptr + n1, n2, a,
                         g.scale, nullptr);
        }
        CUDA_CHECK(cudaDeviceSynchronize());
        const double norm_ref = global_grad_norm(grads.data(), n);
        cpu.step(p_cpu.data(), grads.data(), lrs[t - 1], norm_ref, c);

        const GpuAdamW& g = runs[0];
        const float norm = g.norm.download()[0], scale = g.scale.download()[0];
        const float scale_ref = c.grad_clip > 0 && norm_ref > c.grad_clip ? (float)(c.grad_clip / norm_ref) : 1.0f;
        const std::vector<float> master = g.master(), m = g.m.download(), v = g.v.download();
        const std::vector<float> params = to_float(g.params.download());
        std::vector<float> step_gpu(n), step_cpu(n);
        for (size_t i = 0; i < n; i++) {
            step_gpu[i] = master[i] - p0[i];
            step_cpu[i] = p_cpu[i] - p0[i];
        }
        long params_mismatch = 0;
        for (size_t i = 0; i < n; i++)
            if (params[i] != nearest_bf16_ties_away(master[i])) params_mismatch++;
        const double e_norm = std::fabs(norm - norm_ref) / norm_ref, e_scale = std::fabs(scale - scale_ref) / scale_ref;
        const double e_m = rel_error(m, cpu.m), e_v = rel_error(v, cpu.v);
        const double e_p = rel_error(master, p_cpu), e_step = rel_error(step_gpu, step_cpu);
        printf("[adamw step %d] norm %.3g, scale %.3g, m %.3g, v %.3g, params %.3g, params - p0 %.3g, "
               "bf16 copy mismatches %ld\n", t, e_norm, e_scale, e_m, e_v, e_p, e_step, params_mismatch);
        // fp32 vs fp32 in another order (FMA contraction, the clip factor from an fp32 norm): a few
        // ulps, ~1e-7 relative. The parameter change p - p0 (~lr) carries in addition the final
        // rounding of p (half an ulp of |p| ~ 1, i.e. ~6e-8 / lr = 3e-6 of the change at lr = 2e-2).
        EXPECT_LE(e_norm, 1e-5);
        EXPECT_LE(e_scale, 1e-6);
        EXPECT_LE(e_m, 1e-6);
        EXPECT_LE(e_v, 1e-6);
        EXPECT_LE(e_p, 1e-6);
        EXPECT_LE(e_step, 1e-5);
        EXPECT_EQ(params_mismatch, 0) << "params are not the round-to-nearest copy of master";
    }
    // Determinism: both runs went through the same steps.
    EXPECT_TRUE(same_bytes(runs[0].lo.download(), runs[1].lo.download()));
    EXPECT_TRUE(same_bytes(runs[0].m.download(), runs[1].m.download()));
    EXPECT_TRUE(same_bytes(runs[0].v.download(), runs[1].v.download()));
    EXPECT_TRUE(same_bytes(runs[0].params.download(), runs[1].params.download()));
}

// Buffers that do not share an alignment take the scalar path: same results.
TEST(AdamW, MisalignedBuffersMatchCpu) {
    REQUIRE_GPU();
    const size_t n = 1001;
    TrainConfig c;
    c.grad_clip = 0;
    const std::vector<float> p0 = random_floats(n, 21), grads = random_grads(n, 22);
    std::vector<float> p_cpu = p0;
    AdamWCPU cpu({{"w", n, true}});
    cpu.step(p_cpu.data(), grads.data(), 1e-2, 1.0, c);

    GpuAdamW g(n + 1);
    const std::vector<uint16_t> lo0 = master_los(p0);
    g.params.upload(master_his(p0));
    CUDA_CHECK(cudaMemcpy(g.lo.ptr + 1, lo0.data(), n * 2, cudaMemcpyHostToDevice));  // low halves shifted by 2 bytes
    g.grads.upload(grads);
    CUDA_CHECK(cudaMemset(g.m.ptr, 0, (n + 1) * 4));
    CUDA_CHECK(cudaMemset(g.v.ptr, 0, (n + 1) * 4));
    g.scale.upload({1.0f});
    const AdamWArgs a{1e-2f, (float)c.beta1, (float)c.beta2, (float)c.adam_eps, (float)c.weight_decay, 1};
    adamw_update(g.params, g.lo.ptr + 1, g.grads, g.m, g.v, n, a, g.scale, nullptr);
    std::vector<uint16_t> lo = g.lo.download();
    lo.erase(lo.begin());
    std::vector<bf16> params = g.params.download();
    params.resize(n);
    const std::vector<float> master = master_joined(params, lo);
    std::vector<float> m = g.m.download();
    m.resize(n);
    EXPECT_LE(rel_error(master, p_cpu), 1e-6);
    EXPECT_LE(rel_error(m, cpu.m), 1e-6);
    for (size_t i = 0; i < n; i++) EXPECT_EQ(__bfloat162float(params[i]), nearest_bf16_ties_away(master[i])) << i;
    EXPECT_THROW(adamw_update(g.params, g.lo, g.grads, g.m, g.v, n, AdamWArgs{1e-2f, 0.9f, 0.95f, 1e-8f, 0.f, 0},
                              g.scale, nullptr),
                 Error);
}

// 350M parameters: the master's two halves, m and v read and written, grads read = 28 bytes each.
TEST(AdamW, Bandwidth) {
    REQUIRE_GPU();
    const size_t n = 350000000, chunk = 1 << 20;
    GpuAdamW g(n);
    DeviceBuffer<float> src(chunk);
    auto fill = [&](DeviceBuffer<float>& dst, uint64_t seed, float scale, bool positive) {
        std::vector<float> h = random_floats(chunk, seed, scale);
        if (positive)
            for (float& x : h) x = std::fabs(x);
        src.upload(h);
        fill_tiled(dst.ptr, n, src.ptr, chunk);
    };
    fill(g.grads, 32, 1e-3f, false);
    fill(g.m, 33, 1e-4f, false);
    fill(g.v, 34, 1e-6f, true);
    CUDA_CHECK(cudaMemset(g.params.ptr, 0x3c, n * 2));  // weights near 0.0115
    CUDA_CHECK(cudaMemset(g.lo.ptr, 0x5a, n * 2));
    g.scale.upload({0.5f});
    const AdamWArgs a{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 10};
    const float adamw = median_ms(5, [] {}, [&] { adamw_update(g.params, g.lo, g.grads, g.m, g.v, n, a, g.scale, nullptr); });
    const float norm = median_ms(5, [] {}, [&] { global_norm_squared(g.norm2, g.scratch, g.grads, n, nullptr); });
    printf("[adamw bandwidth n=%zu] adamw_update %.3f ms, %.0f GB/s = %.0f%% of copy; global_norm_squared (read 4 B) "
           "%.3f ms, %.0f GB/s = %.0f%%\n",
           n, adamw, 28.0 * n / adamw / 1e6, 100 * 28.0 * n / adamw / 1e-3 / kCopyBandwidth, norm, 4.0 * n / norm / 1e6,
           100 * 4.0 * n / norm / 1e-3 / kCopyBandwidth);
    std::vector<bf16> head(1000);
    CUDA_CHECK(cudaMemcpy(head.data(), g.params.ptr + n - 1000, 2000, cudaMemcpyDeviceToHost));
    EXPECT_TRUE(std::all_of(head.begin(), head.end(), [](bf16 x) { return std::isfinite(__bfloat162float(x)); }));
}
