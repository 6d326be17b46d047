// The unfused GPU kernels (encoder, LayerNorm, residual, GELU, bias gradient) against the CPU
// reference ops (codagpt::cpu, run in fp64 or fp32 on exactly the bf16 values the GPU sees), on
// GPT-2 widths and awkward shapes, with poisoned outputs and run-twice determinism checks; plus a
// bandwidth printout (not asserted) at N = 16384 rows of C = 1600.
//
// Tolerances, as ||out - ref|| / ||ref||:
// - bf16 outputs computed in fp32 and rounded once: bf16 keeps 8 significant bits, so rounding to
//   nearest moves each element by at most 2^-8 = 3.9e-3 of its value and the norm-wise error is at
//   most 3.9e-3 plus the fp32 arithmetic (~1e-6): kBf16Out = 4e-3. On thousands of elements the
//   rounding errors average out (measured ~1.2-1.7e-3); a wrong formula, a missed element or a
//   double rounding in fp32/bf16 shows up at or well above the bound.
// - fp32 gradient sums over up to 2048 rows: each fp32 add errs by <= 2^-24 of the running sum; with
//   random signs the error grows like sqrt(rows) 2^-24 ~ 3e-6, so kFp32Sum = 2e-5 (measured
//   <= 3e-7; one missing row, ~1 against column sums of ~45, would be ~2e-2).
// - Encoder gradients are summed in the CPU reference's own order, so they must match its fp32
//   results bit for bit; the encoder output and the residual add are one rounding of an exact fp32
//   sum, so they must equal the rounded fp32 reference exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bias.cuh"
#include "encoder.cuh"
#include "gelu.cuh"
#include "gpu_test_util.hpp"
#include "layernorm.cuh"
#include "ops_cpu.hpp"

namespace codagpt {
namespace {

using test::DeviceBuffer;
using test::rel_error;

constexpr double kBf16Out = 4e-3;
constexpr double kFp32Sum = 2e-5;

std::vector<double> to_double(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

DeviceBuffer<bf16>* upload_bf16(const std::vector<float>& v) {
    auto* d = new DeviceBuffer<bf16>(v.size());
    d->upload(test::to_bf16(v));
    return d;
}

template <typename T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// Bytes of two downloads of a bf16 buffer compared as raw bits.
std::vector<uint16_t> bits(const std::vector<bf16>& v) {
    std::vector<uint16_t> o(v.size());
    std::memcpy(o.data(), v.data(), v.size() * sizeof(uint16_t));
    return o;
}

// ---------------------------------------------------------------- encoder

struct EncShape {
    int B, T, C;
};
const EncShape kEncShapes[] = {{2, 1024, 768}, {2, 1024, 1600}, {3, 7, 40}, {1, 1, 768}, {4, 33, 1600}};
constexpr int kEncVocab = 1000, kEncVp = 1024;

// Token ids with many repeats (half of them among 20 ids) so that buckets hold several positions.
std::vector<int> random_tokens(size_t n, uint64_t seed) {
    Rng rng(seed);
    std::vector<int> t(n);
    for (auto& x : t) x = (int)(rng.uniform() < 0.5 ? rng.below(20) : rng.below(kEncVocab));
    return t;
}

TEST(GpuEncoder, ForwardMatchesCpu) {
    REQUIRE_GPU();
    for (const EncShape& s : kEncShapes) {
        SCOPED_TRACE("B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " C=" + std::to_string(s.C));
        const long N = (long)s.B * s.T;
        const auto tokens = random_tokens(N, 1 + s.C + s.T);
        const auto wte = test::random_bf16_values((size_t)kEncVp * s.C, 2, 0.5f);
        const auto wpe = test::random_bf16_values((size_t)s.T * s.C, 3, 0.5f);
        std::vector<float> ref(N * s.C);
        cpu::encoder_forward(ref.data(), tokens.data(), wte.data(), wpe.data(), s.B, s.T, s.C);

        DeviceBuffer<int> d_tok(N);
        d_tok.upload(tokens);
        std::unique_ptr<DeviceBuffer<bf16>> d_wte(upload_bf16(wte)), d_wpe(upload_bf16(wpe));
        DeviceBuffer<bf16> d_out(N * s.C);
        d_out.poison();
        encoder_forward(d_out, d_tok, *d_wte, *d_wpe, s.B, s.T, s.C, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        const auto out = test::to_float(d_out.download());
        // one rounding of the exact fp32 sum: equal to the rounded fp32 reference
        size_t mismatches = 0;
        for (size_t i = 0; i < ref.size(); i++) mismatches += out[i] != test::bf16_round(ref[i]);
        EXPECT_EQ(mismatches, 0u);
        EXPECT_LT(rel_error(out, ref), kBf16Out);
    }
}

TEST(GpuEncoder, BackwardMatchesCpuBitForBitAndIsDeterministic) {
    REQUIRE_GPU();
    for (const EncShape& s : kEncShapes) {
        SCOPED_TRACE("B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " C=" + std::to_string(s.C));
        const long N = (long)s.B * s.T;
        const auto tokens = random_tokens(N, 11 + s.C + s.T);
        const auto dout = test::random_bf16_values(N * s.C, 12);
        // accumulated gradients: start from nonzero values
        const auto dwte0 = test::random_bf16_values((size_t)kEncVp * s.C, 13);
        const auto dwpe0 = test::random_bf16_values((size_t)s.T * s.C, 14);
        std::vector<float> ref_wte = dwte0, ref_wpe = dwpe0;
        cpu::encoder_backward(ref_wte.data(), ref_wpe.data(), dout.data(), tokens.data(), s.B, s.T, s.C);
        std::vector<double> ref64_wte = to_double(dwte0), ref64_wpe = to_double(dwpe0);
        cpu::encoder_backward(ref64_wte.data(), ref64_wpe.data(), to_double(dout).data(), tokens.data(), s.B, s.T,
                              s.C);

        std::unique_ptr<DeviceBuffer<bf16>> d_dout(upload_bf16(dout));
        DeviceBuffer<float> d_wte(dwte0.size()), d_wpe(dwpe0.size());
        EncoderBuckets* bk = encoder_buckets_create((int)N + 5);
        std::vector<float> first_wte, first_wpe;
        for (int run = 0; run < 2; run++) {
            d_wte.upload(dwte0);
            d_wpe.upload(dwpe0);
            encoder_buckets_build(bk, tokens.data(), s.B, s.T, 0);
            encoder_backward(d_wte, d_wpe, *d_dout, bk, s.B, s.T, s.C, 0);
            CUDA_CHECK(cudaDeviceSynchronize());
            const auto wte = d_wte.download(), wpe = d_wpe.download();
            if (run == 0) {
                EXPECT_TRUE(same_bytes(wte, ref_wte)) << "dwte differs from the fp32 CPU reference";
                EXPECT_TRUE(same_bytes(wpe, ref_wpe)) << "dwpe differs from the fp32 CPU reference";
                EXPECT_LT(rel_error(wte, ref64_wte), 1e-6);
                EXPECT_LT(rel_error(wpe, ref64_wpe), 1e-6);
                first_wte = wte;
                first_wpe = wpe;
            } else {
                EXPECT_TRUE(same_bytes(wte, first_wte)) << "dwte not deterministic";
                EXPECT_TRUE(same_bytes(wpe, first_wpe)) << "dwpe not deterministic";
            }
        }
        encoder_buckets_destroy(bk);
    }
}

TEST(GpuEncoder, RefusesBadShapes) {
    REQUIRE_GPU();
    EXPECT_THROW(encoder_forward(nullptr, nullptr, nullptr, nullptr, 1, 1, 12, 0), Error);
    EncoderBuckets* bk = encoder_buckets_create(8);
    const int tokens[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    EXPECT_THROW(encoder_buckets_build(bk, tokens, 3, 3, 0), Error);  // 9 > max_tokens
    encoder_buckets_build(bk, tokens, 2, 4, 0);
    EXPECT_THROW(encoder_backward(nullptr, nullptr, nullptr, bk, 1, 4, 768, 0), Error);  // built for 8
    encoder_buckets_destroy(bk);
}

// ---------------------------------------------------------------- LayerNorm

struct RowShape {
    int N, C;
    float offset;  // input mean: a large offset tests the fp32 variance
};
const RowShape kRowShapes[] = {{2048, 768, 0.3f}, {2048, 1600, 0.f}, {7, 768, 8.f}, {7, 40, 0.f}, {5, 2056, 0.f},
                               {333, 1600, 0.f}};

std::string row_trace(const RowShape& s) { return "N=" + std::to_string(s.N) + " C=" + std::to_string(s.C); }

TEST(GpuLayerNorm, ForwardMatchesCpu) {
    REQUIRE_GPU();
    for (const RowShape& s : kRowShapes) {
        SCOPED_TRACE(row_trace(s));
        const size_t NC = (size_t)s.N * s.C;
        const auto x = test::random_bf16_values(NC, 21 + s.C, 1.f, s.offset);
        const auto w = test::random_bf16_values(s.C, 22, 0.2f, 1.f);
        const auto b = test::random_bf16_values(s.C, 23, 0.2f);
        std::vector<double> ref(NC), ref_mean(s.N), ref_rstd(s.N);
        cpu::layernorm_forward(ref.data(), ref_mean.data(), ref_rstd.data(), to_double(x).data(),
                               to_double(w).data(), to_double(b).data(), s.N, s.C);

        std::unique_ptr<DeviceBuffer<bf16>> d_x(upload_bf16(x)), d_w(upload_bf16(w)), d_b(upload_bf16(b));
        DeviceBuffer<bf16> d_out(NC);
        DeviceBuffer<float> d_mean(s.N), d_rstd(s.N);
        std::vector<uint16_t> first;
        for (int run = 0; run < 2; run++) {
            d_out.poison();
            d_mean.poison();
            d_rstd.poison();
            layernorm_forward(d_out, d_mean, d_rstd, *d_x, *d_w, *d_b, s.N, s.C, 0);
            CUDA_CHECK(cudaDeviceSynchronize());
            const auto out_bf = d_out.download();
            if (run == 1) {
                EXPECT_TRUE(same_bytes(bits(out_bf), first)) << "not deterministic";
                break;
            }
            first = bits(out_bf);
            const double e_out = rel_error(test::to_float(out_bf), ref);
            const double e_mean = rel_error(d_mean.download(), ref_mean);
            const double e_rstd = rel_error(d_rstd.download(), ref_rstd);
            printf("    layernorm_forward N=%d C=%d: rel err out %.2e, mean %.2e, rstd %.2e\n", s.N, s.C, e_out,
                   e_mean, e_rstd);
            EXPECT_LT(e_out, kBf16Out);
            EXPECT_LT(e_mean, 1e-5);  // fp32 sums of C bf16 values
            EXPECT_LT(e_rstd, 1e-5);
        }
    }
}

TEST(GpuLayerNorm, BackwardMatchesCpuAndIsDeterministic) {
    REQUIRE_GPU();
    for (const RowShape& s : kRowShapes) {
        SCOPED_TRACE(row_trace(s));
        const size_t NC = (size_t)s.N * s.C;
        const auto x = test::random_bf16_values(NC, 31 + s.C, 1.f, s.offset);
        const auto w = test::random_bf16_values(s.C, 32, 0.2f, 1.f);
        const auto dout = test::random_bf16_values(NC, 33);
        const auto dinp0 = test::random_bf16_values(NC, 34, 0.5f);  // dinp accumulates: start nonzero
        const auto dw0 = test::random_bf16_values(s.C, 35), db0 = test::random_bf16_values(s.C, 36);
        // the row statistics both sides use: the fp64 forward's, rounded to the fp32 the GPU keeps
        std::vector<double> y(NC), mean64(s.N), rstd64(s.N);
        cpu::layernorm_forward(y.data(), mean64.data(), rstd64.data(), to_double(x).data(), to_double(w).data(),
                               to_double(w).data(), s.N, s.C);
        std::vector<float> mean(mean64.begin(), mean64.end()), rstd(rstd64.begin(), rstd64.end());
        std::vector<double> ref_dinp = to_double(dinp0), ref_dw = to_double(dw0), ref_db = to_double(db0);
        cpu::layernorm_backward(ref_dinp.data(), ref_dw.data(), ref_db.data(), to_double(dout).data(),
                                to_double(x).data(), to_double(w).data(), to_double(mean).data(),
                                to_double(rstd).data(), s.N, s.C);

        std::unique_ptr<DeviceBuffer<bf16>> d_x(upload_bf16(x)), d_w(upload_bf16(w)), d_dout(upload_bf16(dout));
        DeviceBuffer<bf16> d_dinp(NC);
        DeviceBuffer<float> d_dw(s.C), d_db(s.C), d_mean(s.N), d_rstd(s.N);
        DeviceBuffer<float> d_scratch(layernorm_backward_scratch_floats(s.N, s.C));
        d_mean.upload(mean);
        d_rstd.upload(rstd);
        const auto dinp0_bf = test::to_bf16(dinp0);
        std::vector<uint16_t> first_dinp;
        std::vector<float> first_dw, first_db;
        for (int run = 0; run < 2; run++) {
            d_dinp.upload(dinp0_bf);
            d_dw.upload(dw0);
            d_db.upload(db0);
            d_scratch.poison();
            layernorm_backward(d_dinp, d_dw, d_db, d_scratch, *d_dout, *d_x, *d_w, d_mean, d_rstd, s.N, s.C, 0);
            CUDA_CHECK(cudaDeviceSynchronize());
            const auto dinp = d_dinp.download();
            const auto dw = d_dw.download(), db = d_db.download();
            if (run == 0) {
                const double e_dinp = rel_error(test::to_float(dinp), ref_dinp);
                const double e_dw = rel_error(dw, ref_dw), e_db = rel_error(db, ref_db);
                printf("    layernorm_backward N=%d C=%d: rel err dinp %.2e, dweight %.2e, dbias %.2e\n", s.N, s.C,
                       e_dinp, e_dw, e_db);
                EXPECT_LT(e_dinp, kBf16Out);
                EXPECT_LT(e_dw, kFp32Sum);
                EXPECT_LT(e_db, kFp32Sum);
                first_dinp = bits(dinp);
                first_dw = dw;
                first_db = db;
            } else {
                EXPECT_TRUE(same_bytes(bits(dinp), first_dinp)) << "dinp not deterministic";
                EXPECT_TRUE(same_bytes(dw, first_dw)) << "dweight not deterministic";
                EXPECT_TRUE(same_bytes(db, first_db)) << "dbias not deterministic";
            }
        }
    }
}

TEST(GpuLayerNorm, RefusesBadWidths) {
    REQUIRE_GPU();
    EXPECT_THROW(layernorm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 4, 100, 0), Error);
    EXPECT_THROW(layernorm_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 4, 8192, 0), Error);
}

// ---------------------------------------------------------------- residual and GELU

const long kFlatSizes[] = {2048L * 1600 * 4, 2048L * 768, 1000003, 5};

TEST(GpuResidual, ForwardMatchesCpu) {
    REQUIRE_GPU();
    for (long n : kFlatSizes) {
        SCOPED_TRACE("n=" + std::to_string(n));
        const auto a = test::random_bf16_values(n, 41), b = test::random_bf16_values(n, 42, 0.3f);
        std::vector<float> ref(n);
        cpu::residual_forward(ref.data(), a.data(), b.data(), n);
        std::unique_ptr<DeviceBuffer<bf16>> d_a(upload_bf16(a)), d_b(upload_bf16(b));
        DeviceBuffer<bf16> d_out(n);
        d_out.poison();
        residual_forward(d_out, *d_a, *d_b, n, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        const auto out = test::to_float(d_out.download());
        size_t mismatches = 0;  // one rounding of the exact fp32 sum
        for (long i = 0; i < n; i++) mismatches += out[i] != test::bf16_round(ref[i]);
        EXPECT_EQ(mismatches, 0u);
        EXPECT_LT(rel_error(out, ref), kBf16Out);
    }
}

TEST(GpuGelu, ForwardMatchesCpu) {
    REQUIRE_GPU();
    for (long n : kFlatSizes) {
        SCOPED_TRACE("n=" + std::to_string(n));
        const auto x = test::random_bf16_values(n, 51, 2.f);  // covers the curved part and both tails
        std::vector<double> ref(n);
        cpu::gelu_forward(ref.data(), to_double(x).data(), n);
        std::unique_ptr<DeviceBuffer<bf16>> d_x(upload_bf16(x));
        DeviceBuffer<bf16> d_out(n);
        d_out.poison();
        gelu_forward(d_out, *d_x, n, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        const double e = rel_error(test::to_float(d_out.download()), ref);
        printf("    gelu_forward n=%ld: rel err %.2e\n", n, e);
        EXPECT_LT(e, kBf16Out);
    }
}

TEST(GpuGelu, BackwardMatchesCpuAndIsDeterministic) {
    REQUIRE_GPU();
    for (long n : kFlatSizes) {
        SCOPED_TRACE("n=" + std::to_string(n));
        const auto x = test::random_bf16_values(n, 61, 2.f), dout = test::random_bf16_values(n, 62);
        std::vector<double> ref(n, 0.0);  // the CPU op accumulates; the GPU op assigns
        cpu::gelu_backward(ref.data(), to_double(x).data(), to_double(dout).data(), n);
        std::unique_ptr<DeviceBuffer<bf16>> d_x(upload_bf16(x)), d_dout(upload_bf16(dout));
        DeviceBuffer<bf16> d_dinp(n);
        d_dinp.poison();
        gelu_backward(d_dinp, *d_x, *d_dout, n, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        const auto first = d_dinp.download();
        const double e = rel_error(test::to_float(first), ref);
        printf("    gelu_backward n=%ld: rel err %.2e\n", n, e);
        EXPECT_LT(e, kBf16Out);
        // in place (dinp aliases dout), as the trainer calls it: same bits
        gelu_backward(*d_dout, *d_x, *d_dout, n, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_TRUE(same_bytes(bits(d_dout->download()), bits(first))) << "in-place or repeated run differs";
    }
}

// ---------------------------------------------------------------- bias gradient

TEST(GpuBias, BackwardMatchesCpuAndIsDeterministic) {
    REQUIRE_GPU();
    const std::pair<int, int> shapes[] = {{2048, 768}, {2048, 3 * 768}, {2048, 4 * 1600}, {7, 768}, {1000, 40},
                                          {1, 1600}};
    for (auto [M, N] : shapes) {
        SCOPED_TRACE("M=" + std::to_string(M) + " N=" + std::to_string(N));
        const auto dout = test::random_bf16_values((size_t)M * N, 71 + N);
        const auto dbias0 = test::random_bf16_values(N, 72);
        // the CPU op: matmul_backward with K = 1 (its dbias is the column sum of dout, rows in order)
        std::vector<double> ref = to_double(dbias0), dinp(M), dw(N), inp(M, 1.0), w(N, 1.0), scratch(std::max(M, N));
        cpu::matmul_backward(dinp.data(), dw.data(), ref.data(), to_double(dout).data(), inp.data(), w.data(),
                             scratch.data(), M, 1, N);
        std::unique_ptr<DeviceBuffer<bf16>> d_dout(upload_bf16(dout));
        DeviceBuffer<float> d_dbias(N), d_scratch(bias_backward_scratch_floats(M, N));
        std::vector<float> first;
        for (int run = 0; run < 2; run++) {
            d_dbias.upload(dbias0);
            d_scratch.poison();
            bias_backward(d_dbias, d_scratch, *d_dout, M, N, 0);
            CUDA_CHECK(cudaDeviceSynchronize());
            const auto got = d_dbias.download();
            if (run == 0) {
                const double e = rel_error(got, ref);
                printf("    bias_backward M=%d N=%d: rel err %.2e\n", M, N, e);
                EXPECT_LT(e, kFp32Sum);
                first = got;
            } else {
                EXPECT_TRUE(same_bytes(got, first)) << "not deterministic";
            }
        }
    }
    EXPECT_THROW(bias_backward(nullptr, nullptr, nullptr, 4, 12, 0), Error);
}

// ---------------------------------------------------------------- bandwidth (printed, not asserted)

// Fills a device buffer with random bf16 values: a 1M-value random block tiled over it.
void fill_random(DeviceBuffer<bf16>& d, uint64_t seed, float scale = 1.f) {
    const size_t block = std::min<size_t>(d.n, 1 << 20);
    const auto h = test::to_bf16(test::random_bf16_values(block, seed, scale));
    for (size_t off = 0; off < d.n; off += block)
        CUDA_CHECK(cudaMemcpy(d.ptr + off, h.data(), std::min(block, d.n - off) * sizeof(bf16),
                              cudaMemcpyHostToDevice));
}

void report(const char* what, double ms, double bytes) {
    const double tbs = bytes / (ms * 1e-3) / 1e12;
    printf("    %-44s %8.4f ms  %6.3f TB/s  %5.1f%% of 4.24 TB/s copy\n", what, ms, tbs, 100 * tbs / 4.24);
}

TEST(GpuBandwidth, PrintsElementwiseBandwidth) {
    REQUIRE_GPU();
    const int N = 16384, C = 1600;
    const long NC = (long)N * C, NC4 = 4 * NC;
    DeviceBuffer<bf16> a(NC4), b(NC4), out(NC4), w(C), bias(C);
    DeviceBuffer<float> mean(N), rstd(N), dw(4 * C), db(C);
    DeviceBuffer<float> ln_scratch(layernorm_backward_scratch_floats(N, C)),
        bias_scratch(bias_backward_scratch_floats(N, 4 * C));
    fill_random(a, 81);
    fill_random(b, 82);
    fill_random(w, 83, 0.1f);
    fill_random(bias, 84, 0.1f);
    CUDA_CHECK(cudaMemset(dw, 0, dw.n * sizeof(float)));
    CUDA_CHECK(cudaMemset(db, 0, db.n * sizeof(float)));

    {  // the copy ceiling, for the same-run comparison
        const double ms = median_ms([&] {
            CUDA_CHECK(cudaMemcpyAsync(out.ptr, a.ptr, NC * sizeof(bf16), cudaMemcpyDeviceToDevice, 0));
        });
        report("cudaMemcpy D2D, N*C bf16", ms, 2.0 * NC * 2);
    }
    {
        const double ms = median_ms([&] { layernorm_forward(out, mean, rstd, a, w, bias, N, C, 0); });
        report("layernorm_forward N=16384 C=1600", ms, 2.0 * NC * 2 + 8.0 * N);
    }
    {
        const double ms = median_ms([&] { residual_forward(out, a, b, NC, 0); });
        report("residual_forward n=N*C", ms, 3.0 * NC * 2);
    }
    {
        const double ms = median_ms([&] { gelu_forward(out, a, NC, 0); });
        report("gelu_forward n=N*C", ms, 2.0 * NC * 2);
    }
    {
        const double ms = median_ms([&] { gelu_forward(out, a, NC4, 0); });
        report("gelu_forward n=N*4C", ms, 2.0 * NC4 * 2);
    }
    {
        const double ms = median_ms([&] { gelu_backward(out, a, b, NC4, 0); });
        report("gelu_backward n=N*4C", ms, 3.0 * NC4 * 2);
    }
    {  // dinp read + written, dout and inp read once (one fused pass), plus the 2C-float partials per block
        layernorm_forward(out, mean, rstd, a, w, bias, N, C, 0);
        const double ms = median_ms([&] { layernorm_backward(out, dw, db, ln_scratch, b, a, w, mean, rstd, N, C, 0); });
        report("layernorm_backward (min traffic 4 NC bf16)", ms, 4.0 * NC * 2);
    }
    {
        const double ms = median_ms([&] { bias_backward(dw, bias_scratch, b, N, 4 * C, 0); });
        report("bias_backward M=16384 N=4C", ms, 1.0 * NC4 * 2);
    }
    {  // LayerNorm on a large input (4N rows: 210 MB a tensor, past the 50 MB L2), beside the copy of
       // one such tensor; a, b and out hold 4 N*C values each
        const int N4 = 4 * N;
        DeviceBuffer<float> mean4(N4), rstd4(N4), scratch4(layernorm_backward_scratch_floats(N4, C));
        const double copy_ms = median_ms([&] {
            CUDA_CHECK(cudaMemcpyAsync(out.ptr, a.ptr, NC4 * sizeof(bf16), cudaMemcpyDeviceToDevice, 0));
        });
        report("cudaMemcpy D2D, 4N*C bf16", copy_ms, 2.0 * NC4 * 2);
        const double fwd_ms = median_ms([&] { layernorm_forward(out, mean4, rstd4, a, w, bias, N4, C, 0); });
        report("layernorm_forward N=65536 C=1600", fwd_ms, 2.0 * NC4 * 2 + 8.0 * N4);
        const double bwd_ms =
            median_ms([&] { layernorm_backward(out, dw, db, scratch4, b, a, w, mean4, rstd4, N4, C, 0); });
        report("layernorm_backward N=65536 C=1600", bwd_ms, 4.0 * NC4 * 2);
        printf("    same-size copy time / kernel time: layernorm_forward %.1f%%, layernorm_backward %.1f%%\n",
               100 * copy_ms * (2.0 * NC4 * 2 + 8.0 * N4) / (2.0 * NC4 * 2) / fwd_ms,
               100 * copy_ms * 2 / bwd_ms);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace codagpt
