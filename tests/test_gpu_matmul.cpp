// cuBLASLt GEMMs (kernels/matmul.cu) against a double-precision host reference computed from the
// same bf16 inputs, at GPT-2 124M / 1.5B shapes, the tied LM head and an awkward small shape.
//
// Tolerances (relative error ||out - ref|| / ||ref|| over the checked elements):
//  - bf16 outputs: products of bf16 values are exact in fp32 and fp32 accumulation over K <= 6400
//    adds ~sqrt(K) 2^-24 ~ 5e-6; what remains is the single rounding of the result (with its bias
//    or old value added in fp32 first) to bf16: relative error uniform in +-2^-9, ~1.1e-3 rms.
//    The bound 1e-2 leaves ~8x margin for that while any layout, transpose, bias or beta mistake
//    gives an error of order 1 (the operands are random, so wrong pairings are uncorrelated).
//  - fp32 outputs (weight gradients): no output rounding, only fp32 accumulation over K' <= 2048
//    (even with truncating accumulation at every add, <= ~K' 2^-24 ~ 1e-4 worst case): bound 2e-4,
//    which also proves the result did not pass through bf16 (that would give ~1e-3).
// Large outputs are checked on 8 whole rows and 8 whole columns (first, last and random ones) so the
// double reference stays fast; every element is checked to be finite (outputs are poisoned first).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "gpu_test_util.hpp"
#include "matmul.cuh"

namespace codagpt {
namespace {

using test::DeviceBuffer;

constexpr double kBf16Tol = 1e-2;
constexpr double kFp32Tol = 2e-4;

// Uniform values with standard deviation `scale`, rounded to bf16; filled in parallel chunks, each
// chunk with its own seeded Rng so that the values do not depend on the thread count.
std::vector<float> random_values(size_t n, uint64_t seed, float scale) {
    constexpr size_t chunk = 1 << 16;
    std::vector<float> v(n);
    const long chunks = (long)((n + chunk - 1) / chunk);
#pragma omp parallel for schedule(static)
    for (long c = 0; c < chunks; c++) {
        Rng rng(seed * 1000003ull + (uint64_t)c);
        const size_t end = std::min(n, (size_t)(c + 1) * chunk);
        for (size_t i = (size_t)c * chunk; i < end; i++)
            v[i] = test::bf16_round(scale * 1.7320508f * (float)(2.0 * rng.uniform() - 1.0));
    }
    return v;
}

std::vector<bf16> to_bf16(const std::vector<float>& v) {
    std::vector<bf16> o(v.size());
#pragma omp parallel for schedule(static)
    for (long i = 0; i < (long)v.size(); i++) o[i] = __float2bfloat16(v[i]);
    return o;
}

// [rows, cols] row-major -> [cols, rows] row-major.
std::vector<float> transpose(const std::vector<float>& x, long rows, long cols) {
    std::vector<float> t(x.size());
#pragma omp parallel for schedule(static)
    for (long c = 0; c < cols; c++)
        for (long r = 0; r < rows; r++) t[c * rows + r] = x[r * cols + c];
    return t;
}

// One GEMM as the test sees it: out[M, N] (+)= op(a)[M, K] op(b)[K, N] (+ bias[N]), with a stored
// [M, K] or [K, M] (trans_a), b stored [K, N] or [N, K] (trans_b), written straight from the
// formula in matmul.cuh; `call` runs the public method on the stored operands.
struct Case {
    std::string name;
    long M, K, N;
    bool trans_a, trans_b, out_fp32, bias, accumulate;
    std::function<void(Matmul&, void* out, const bf16* a, const bf16* b, const bf16* bias)> call;
};

// forward: out[M, N] = inp[M, K] w[K, N] (+ bias)
Case forward_case(long M, long K, long N, bool bias) {
    return {"forward" + std::string(bias ? "+bias" : ""), M, K, N, false, false, false, bias, false,
            [=](Matmul& mm, void* out, const bf16* inp, const bf16* w, const bf16* b) {
                mm.forward((bf16*)out, inp, w, b, (int)M, (int)K, (int)N, 0);
            }};
}
// backward_input: dinp[M, K] (+)= dout[M, N] w[K, N]^T
Case backward_input_case(long M, long K, long N, bool acc) {
    return {"backward_input" + std::string(acc ? "+acc" : ""), M, N, K, false, true, false, false, acc,
            [=](Matmul& mm, void* out, const bf16* dout, const bf16* w, const bf16*) {
                mm.backward_input((bf16*)out, dout, w, (int)M, (int)K, (int)N, acc, 0);
            }};
}
// backward_weight: dw[K, N] (+)= inp[M, K]^T dout[M, N]
Case backward_weight_case(long M, long K, long N, bool acc) {
    return {"backward_weight" + std::string(acc ? "+acc" : ""), K, M, N, true, false, true, false, acc,
            [=](Matmul& mm, void* out, const bf16* inp, const bf16* dout, const bf16*) {
                mm.backward_weight((float*)out, inp, dout, (int)M, (int)K, (int)N, acc, 0);
            }};
}
// forward_nt: out[M, N] = a[M, K] b[N, K]^T
Case forward_nt_case(long M, long K, long N) {
    return {"forward_nt", M, K, N, false, true, false, false, false,
            [=](Matmul& mm, void* out, const bf16* a, const bf16* b, const bf16*) {
                mm.forward_nt((bf16*)out, a, b, (int)M, (int)K, (int)N, 0);
            }};
}
// backward_nt_input: da[M, K] (+)= dout[M, N] b[N, K]
Case backward_nt_input_case(long M, long K, long N, bool acc) {
    return {"backward_nt_input" + std::string(acc ? "+acc" : ""), M, N, K, false, false, false, false, acc,
            [=](Matmul& mm, void* out, const bf16* dout, const bf16* b, const bf16*) {
                mm.backward_nt_input((bf16*)out, dout, b, (int)M, (int)K, (int)N, acc, 0);
            }};
}
// backward_nt_weight: db[N, K] (+)= dout[M, N]^T a[M, K]
Case backward_nt_weight_case(long M, long K, long N, bool acc) {
    return {"backward_nt_weight" + std::string(acc ? "+acc" : ""), N, M, K, true, false, true, false, acc,
            [=](Matmul& mm, void* out, const bf16* dout, const bf16* a, const bf16*) {
                mm.backward_nt_weight((float*)out, a, dout, (int)M, (int)K, (int)N, acc, 0);
            }};
}

// Rows (or columns) to check: all of them when few, else first, last and 6 random ones.
std::vector<long> pick(long n, Rng& rng, bool all) {
    std::vector<long> v;
    if (all) {
        for (long i = 0; i < n; i++) v.push_back(i);
        return v;
    }
    v = {0, n - 1};
    for (int i = 0; i < 6; i++) v.push_back((long)rng.below((uint64_t)n));
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    return v;
}

// Runs one case: random operands, poisoned (or pre-filled, when accumulating) output, the double
// reference on the checked elements, and a second run that must match the first bit for bit.
void run_case(Matmul& mm, const Case& c, uint64_t seed) {
    SCOPED_TRACE(c.name + " M=" + std::to_string(c.M) + " K=" + std::to_string(c.K) + " N=" + std::to_string(c.N));
    const long M = c.M, K = c.K, N = c.N;
    // op(a) ~ unit variance, op(b) ~ 1/sqrt(K): products, bias and old values all of order 1.
    const std::vector<float> a = random_values(M * K, seed, 1.0f);
    const std::vector<float> b = random_values(K * N, seed + 1, 1.0f / std::sqrt((float)K));
    const std::vector<float> bias = random_values(N, seed + 2, 0.5f);
    const std::vector<float> old = random_values(M * N, seed + 3, 1.0f);  // bf16-exact, so fp32 too

    DeviceBuffer<bf16> d_a(M * K), d_b(K * N), d_bias(N);
    d_a.upload(to_bf16(a));
    d_b.upload(to_bf16(b));
    d_bias.upload(to_bf16(bias));
    const size_t out_bytes = (size_t)M * N * (c.out_fp32 ? 4 : 2);
    DeviceBuffer<char> d_out(out_bytes);
    const std::vector<bf16> old_bf16 = c.out_fp32 ? std::vector<bf16>() : to_bf16(old);

    auto run_once = [&]() {
        if (!c.accumulate) d_out.poison();
        else if (c.out_fp32) CUDA_CHECK(cudaMemcpy(d_out.ptr, old.data(), out_bytes, cudaMemcpyHostToDevice));
        else CUDA_CHECK(cudaMemcpy(d_out.ptr, old_bf16.data(), out_bytes, cudaMemcpyHostToDevice));
        c.call(mm, d_out.ptr, d_a, d_b, c.bias ? d_bias.ptr : nullptr);
        CUDA_CHECK(cudaDeviceSynchronize());
        return d_out.download();
    };
    const std::vector<char> first = run_once();
    auto out_at = [&](long i, long j) -> double {
        return c.out_fp32 ? (double)((const float*)first.data())[i * N + j]
                          : (double)__bfloat162float(((const bf16*)first.data())[i * N + j]);
    };

    long non_finite = 0;
#pragma omp parallel for reduction(+ : non_finite)
    for (long i = 0; i < M; i++)
        for (long j = 0; j < N; j++) non_finite += std::isfinite(out_at(i, j)) ? 0 : 1;
    EXPECT_EQ(non_finite, 0) << "elements left unwritten (poison) or overflowed";

    // Reference on the checked elements: op(a) rows and op(b) columns made contiguous over k.
    const std::vector<float> opa = c.trans_a ? transpose(a, K, M) : a;      // [M, K]
    const std::vector<float> opbt = c.trans_b ? b : transpose(b, K, N);     // [N, K]
    Rng rng(seed + 4);
    const bool all = (double)M * N * K <= 5e7;
    const std::vector<long> rows = pick(M, rng, all), cols = pick(N, rng, all);
    std::vector<std::pair<long, long>> idx;
    for (long i : rows)
        for (long j = 0; j < N; j++) idx.push_back({i, j});
    if (!all)
        for (long j : cols)
            for (long i = 0; i < M; i++) idx.push_back({i, j});
    std::vector<double> ref(idx.size()), got(idx.size());
#pragma omp parallel for schedule(dynamic, 256)
    for (long e = 0; e < (long)idx.size(); e++) {
        const auto [i, j] = idx[e];
        const float* x = &opa[i * K];
        const float* y = &opbt[j * K];
        double s = 0;
        for (long k = 0; k < K; k++) s += (double)x[k] * (double)y[k];
        if (c.bias) s += bias[j];
        if (c.accumulate) s += old[i * N + j];
        ref[e] = s;
        got[e] = out_at(i, j);
    }
    const double err = test::rel_error(got, ref);
    const double tol = c.out_fp32 ? kFp32Tol : kBf16Tol;
    std::printf("  %-22s M=%-6ld K=%-6ld N=%-6ld rel err %.3e (bound %.0e, %zu elements checked)\n", c.name.c_str(),
                M, K, N, err, tol, idx.size());
    EXPECT_LE(err, tol);

    const std::vector<char> second = run_once();
    EXPECT_TRUE(first == second) << "second run differs: not deterministic";
}

// All six methods for a layer of width K -> N at M tokens (the NT ones read the weights as [N, K]).
void run_all(Matmul& mm, long M, long K, long N, uint64_t seed) {
    run_case(mm, forward_case(M, K, N, true), seed);
    run_case(mm, backward_input_case(M, K, N, false), seed + 10);
    run_case(mm, backward_input_case(M, K, N, true), seed + 20);
    run_case(mm, backward_weight_case(M, K, N, false), seed + 30);
    run_case(mm, backward_weight_case(M, K, N, true), seed + 40);
}
void run_all_nt(Matmul& mm, long M, long K, long N, uint64_t seed) {
    run_case(mm, forward_nt_case(M, K, N), seed);
    run_case(mm, backward_nt_input_case(M, K, N, false), seed + 10);
    run_case(mm, backward_nt_input_case(M, K, N, true), seed + 20);
    run_case(mm, backward_nt_weight_case(M, K, N, false), seed + 30);
    run_case(mm, backward_nt_weight_case(M, K, N, true), seed + 40);
}

TEST(GpuMatmul, AwkwardSmallShape) {
    REQUIRE_GPU();
    Matmul mm;
    run_case(mm, forward_case(37, 40, 24, false), 100);
    run_all(mm, 37, 40, 24, 200);
    run_all_nt(mm, 37, 40, 24, 300);
}

TEST(GpuMatmul, LayerShapes124M) {
    REQUIRE_GPU();
    Matmul mm;
    run_all(mm, 2048, 768, 2304, 1000);  // qkv
}

TEST(GpuMatmul, LayerShapes1558M) {
    REQUIRE_GPU();
    Matmul mm;
    run_case(mm, forward_case(2048, 1600, 4800, false), 1900);
    run_all(mm, 2048, 1600, 4800, 2000);  // qkv
    run_all(mm, 2048, 1600, 1600, 3000);  // attention projection
    run_all(mm, 2048, 1600, 6400, 4000);  // fc
    run_all(mm, 2048, 6400, 1600, 5000);  // fc projection
}

TEST(GpuMatmul, TiedLmHead) {
    REQUIRE_GPU();
    Matmul mm;
    run_all_nt(mm, 1024, 768, 50304, 6000);
}

// A bad shape is refused with an error, not a silent no-op.
TEST(GpuMatmul, EmptyShapeThrows) {
    REQUIRE_GPU();
    Matmul mm;
    EXPECT_THROW(mm.forward(nullptr, nullptr, nullptr, nullptr, 0, 16, 16, 0), Error);
}

// Throughput at training size (B=16, T=1024) for the 1.5B layer shapes and its LM head: median of
// 20 timed calls after warm-up, on random (tiled) data. Compare with ~770 / 745 / 773 / 804 / 711
// TFLOP/s measured through PyTorch on the same GPU (../shared/DEVICE.md).
TEST(GpuMatmul, Throughput1558M) {
    REQUIRE_GPU();
    const long M = 16384;
    struct Shape { const char* name; long K, N; };
    const Shape shapes[] = {{"qkv 1600->4800", 1600, 4800}, {"proj 1600->1600", 1600, 1600},
                            {"fc 1600->6400", 1600, 6400}, {"fcproj 6400->1600", 6400, 1600},
                            {"lm head 1600->50304", 1600, 50304}};
    const size_t max_in = M * 6400, max_w = 1600 * 50304, max_out = M * 50304;
    DeviceBuffer<bf16> inp(max_in), w(max_w), bias(50304), out(max_out), dinp(max_in), dout(M * 6400);
    DeviceBuffer<float> dw(1600 * 50304);
    // Random bf16 tiles copied over every buffer (never time on zeros).
    const std::vector<bf16> tile = to_bf16(random_values(1 << 20, 7, 0.05f));
    for (DeviceBuffer<bf16>* buf : {&inp, &w, &bias, &out, &dinp, &dout})
        for (size_t off = 0; off < buf->n; off += tile.size())
            CUDA_CHECK(cudaMemcpy(buf->ptr + off, tile.data(), std::min(tile.size(), buf->n - off) * sizeof(bf16),
                                  cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(dw.ptr, 0, dw.n * sizeof(float)));

    Matmul mm;
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    auto median_ms = [&](const std::function<void()>& f) {
        for (int i = 0; i < 3; i++) f();  // warm-up (the first call also picks the algorithm)
        std::vector<float> ms(20);
        for (float& t : ms) {
            CUDA_CHECK(cudaEventRecord(start));
            f();
            CUDA_CHECK(cudaEventRecord(stop));
            CUDA_CHECK(cudaEventSynchronize(stop));
            CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
        }
        std::sort(ms.begin(), ms.end());
        return ms[ms.size() / 2];
    };
    std::printf("  M=%ld tokens, TFLOP/s (median of 20)     forward  (no bias)  bwd_input  bwd_weight\n", M);
    for (const Shape& s : shapes) {
        const double flop = 2.0 * M * s.K * s.N;
        const bool head = s.N == 50304;
        float f, f0 = 0, bi, bw;
        if (!head) {
            f = median_ms([&] { mm.forward(out, inp, w, bias, (int)M, (int)s.K, (int)s.N, 0); });
            f0 = median_ms([&] { mm.forward(out, inp, w, nullptr, (int)M, (int)s.K, (int)s.N, 0); });
            bi = median_ms([&] { mm.backward_input(dinp, dout, w, (int)M, (int)s.K, (int)s.N, false, 0); });
            bw = median_ms([&] { mm.backward_weight(dw, inp, dout, (int)M, (int)s.K, (int)s.N, true, 0); });
        } else {  // logits = x wte^T, dx = dlogits wte, dwte += dlogits^T x
            f = median_ms([&] { mm.forward_nt(out, inp, w, (int)M, (int)s.K, (int)s.N, 0); });
            bi = median_ms([&] { mm.backward_nt_input(dinp, out, w, (int)M, (int)s.K, (int)s.N, false, 0); });
            bw = median_ms([&] { mm.backward_nt_weight(dw, inp, out, (int)M, (int)s.K, (int)s.N, true, 0); });
        }
        std::printf("  %-24s %8.3f ms %7.1f %10.1f %10.1f %11.1f\n", s.name, f, flop / f * 1e-9,
                    f0 > 0 ? flop / f0 * 1e-9 : 0.0, flop / bi * 1e-9, flop / bw * 1e-9);
        EXPECT_GT(flop / f * 1e-9, 100.0) << "far below the GPU's GEMM rate";
    }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
}

}  // namespace
}  // namespace codagpt
