// The CODA GEMM engine on the GPU (kernels/gemm.cuh), each mainloop: every epilogue program of
// coda_programs.cuh against fp64 math through the same checks as the CPU emulator
// (coda_checks.hpp, bounds justified there), on awkward shapes (no tile multiples; 1600, 6400 and
// 50304 wide, scaled down in the other dimensions to keep the fp64 references quick) and every
// operand layout the programs use; partials against the emulator run with the engine's tile
// shape; bit-identical reruns; one full-size GEMM; and the refusal of bad problems.
// A .cu file: the engine is templates, instantiated here for every program.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "coda_checks.hpp"
#include "gemm.cuh"
#include "gpu_test_util.hpp"
#include "test_util.hpp"

using namespace codagpt;
using namespace codagpt::coda;
using namespace codagpt::coda::check;

namespace {

// Skips a test whose mainloop this machine cannot run: Auto is Hopper's mainloop, and without it
// would only repeat the Sm80 run.
#define REQUIRE_MAINLOOP(mainloop)                                                                 \
    do {                                                                                           \
        REQUIRE_GPU();                                                                             \
        if ((mainloop) == Mainloop::Auto && !coda::detail::sm90_available())                      \
            GTEST_SKIP() << "the sm90 mainloop is not available here (needs a compute capability " \
                            "9.x GPU and an sm_90a build): Auto would repeat Sm80";               \
    } while (0)

const char* name_of(Mainloop m) { return m == Mainloop::Sm80 ? "Sm80" : m == Mainloop::Sm90 ? "Sm90" : "Auto"; }

// Tensor cores add each k16 step into the fp32 accumulator rounding toward zero (coda_checks.hpp).
double gpu_tol(int K) { return kFp32Bound + K / 16 * std::ldexp(1.0, -23); }

// The checks' Runner on the GPU: host vectors are mirrored in device buffers for one run.
// sm90_tile >= 0: GEMMs (K > 0) on that tile configuration of the Hopper mainloop (sm90::kTiles)
// and with K split `splits` ways (fewer where K has too few k-blocks for that many), instead of
// the plan the engine picks for the shape.
class GpuRunner {
  public:
    explicit GpuRunner(Mainloop m, int sm90_tile = -1, int splits = 1) : mainloop_(m), tile_(sm90_tile), splits_(splits) {}
    ~GpuRunner() { release(); }
    GpuRunner(const GpuRunner&) = delete;
    GpuRunner& operator=(const GpuRunner&) = delete;

    template <class T>
    T* at(std::vector<T>& v) { return static_cast<T*>(mirror(v.data(), v.size() * sizeof(T), v.data())); }
    template <class T>
    const T* at(const std::vector<T>& v) { return static_cast<const T*>(mirror(v.data(), v.size() * sizeof(T), nullptr)); }
    template <class P>
    TileShape shape(const HostGemm& g) const {
        if (forced(g)) return sm90::detail::tile_shape_of(sm90::kTiles[tile_]);
        return gemm_tile_shape<P>(GemmProblem{g.M, g.N, g.K, {nullptr, g.la}, {nullptr, g.lb}}, mainloop_);
    }
    double tol(int K) const { return gpu_tol(K); }
    template <class P>
    void run(const P& p, const HostGemm& g) {
        GemmProblem prob{g.M, g.N, g.K, {}, {}};
        if (g.K > 0) prob.a = {at(*g.a), g.la}, prob.b = {at(*g.b), g.lb};
        if constexpr (is_pass<P>) gemm(p, prob, 0, mainloop_);  // no mainloop to force
        else if (forced(g)) sm90::detail::gemm_with_plan(p, prob, {sm90::kTiles[tile_], splits_for(g.K)}, 0);
        else gemm(p, prob, 0, mainloop_);
        CUDA_CHECK(cudaDeviceSynchronize());
        for (const Mirror& m : mirrors_)
            if (m.out) CUDA_CHECK(cudaMemcpy(m.out, m.dev, m.bytes, cudaMemcpyDeviceToHost));
        release();
    }

  private:
    struct Mirror {
        const void* host;
        void* dev;
        size_t bytes;
        void* out;  // where results go back to; null for inputs
    };
    void* mirror(const void* host, size_t bytes, void* out) {
        for (Mirror& m : mirrors_)
            if (m.host == host) {  // one buffer seen as input and output (in place) is one mirror
                if (out) m.out = out;
                return m.dev;
            }
        void* dev = nullptr;
        CUDA_CHECK(cudaMalloc(&dev, bytes + 16));
        mirrors_.push_back({host, dev, bytes, out});
        CUDA_CHECK(cudaMemcpy(dev, host, bytes, cudaMemcpyHostToDevice));
        return dev;
    }
    void release() {
        for (const Mirror& m : mirrors_) cudaFree(m.dev);
        mirrors_.clear();
    }
    bool forced(const HostGemm& g) const { return tile_ >= 0 && g.K > 0; }  // passes (K = 0) have no mainloop
    int splits_for(int K) const {
        int s = splits_;
        while (!sm90::detail::splits_fit(n_tiles(K, sm90::kBK), s)) s--;
        return s;
    }
    Mainloop mainloop_;
    int tile_, splits_;
    std::vector<Mirror> mirrors_;
};

// ---------------------------------------------------------------- every program against fp64

// (shape, mainloop, Hopper tile configuration or -1: the engine's pick, K splits with a forced tile)
using ProgramCase = std::tuple<Case, Mainloop, int, int>;
std::string case_name(const testing::TestParamInfo<ProgramCase>& info) {
    const auto& [c, m, tile, splits] = info.param;
    return std::string(name_of(m)) + (tile >= 0 ? std::string("_") + sm90::tile_name(sm90::kTiles[tile]) : "") +
           (splits > 1 ? "_split" + std::to_string(splits) : "") + "_M" + std::to_string(c.M) + "K" +
           std::to_string(c.K) + "N" + std::to_string(c.N);
}

class GpuPrograms : public testing::TestWithParam<ProgramCase> {
  protected:
    void SetUp() override { REQUIRE_MAINLOOP(mainloop()); }
    Mainloop mainloop() const { return std::get<1>(GetParam()); }
    const Case& shape() const { return std::get<0>(GetParam()); }
    GpuRunner run{mainloop(), std::get<2>(GetParam()), std::get<3>(GetParam())};
};

TEST_P(GpuPrograms, QkvForward) { check_qkv_forward(run, shape()); }
TEST_P(GpuPrograms, FcForward) { check_fc_forward(run, shape()); }
TEST_P(GpuPrograms, ResidualForwardAndRowStats) { check_residual_forward(run, shape()); }
TEST_P(GpuPrograms, ResidualStats) { check_residual_stats(run, shape()); }
TEST_P(GpuPrograms, LmHeadForwardAndLoss) { check_lm_head_forward(run, shape()); }
TEST_P(GpuPrograms, GeluBackward) { check_gelu_backward(run, shape()); }
TEST_P(GpuPrograms, QkvGradient) { check_qkv_gradient(run, shape()); }
TEST_P(GpuPrograms, CrossEntropyGradient) { check_cross_entropy_gradient(run, shape()); }
TEST_P(GpuPrograms, LnBackwardX) { check_ln_backward_x(run, shape()); }
TEST_P(GpuPrograms, PlainStoreAndAccumulate) { check_plain(run, shape()); }

// (M, K, N) as the checks read them; the dX check turns them into a GEMM of (M, N, K) x (N, K).
// Small odd sizes; GPT-2 1.5B's C = 1600; 4C = 6400 as a reduction and as the dX GEMM's columns;
// the padded vocabulary 50304 as columns and (dX of the LM head) as a reduction.
INSTANTIATE_TEST_SUITE_P(Shapes, GpuPrograms,
                         testing::Combine(testing::Values(Case{136, 72, 200}, Case{264, 1600, 1600}, Case{136, 6400, 200},
                                                          Case{136, 64, 50304}),
                                          testing::Values(Mainloop::Sm80, Mainloop::Auto), testing::Values(-1),
                                          testing::Values(1)),
                         case_name);
// Every program on each tile configuration of the Hopper mainloop, which the engine picks by
// shape: their ring stages, epilogue warps (one consumer or two) and staging buffers differ.
INSTANTIATE_TEST_SUITE_P(Tiles, GpuPrograms,
                         testing::Combine(testing::Values(Case{136, 72, 200}, Case{264, 1600, 1600}),
                                          testing::Values(Mainloop::Auto), testing::Range(0, sm90::kNumTiles),
                                          testing::Values(1)),
                         case_name);
// Split-K: every program with its GEMM's K split 2 and 3 ways (partials through global memory,
// the last split adding them and running the epilogue), cooperative and ping-pong, on reductions
// of 1600 and 6400 and on the dX check's short one (200: 4 k-blocks).
INSTANTIATE_TEST_SUITE_P(Splits, GpuPrograms,
                         testing::Combine(testing::Values(Case{264, 1600, 1600}, Case{136, 6400, 200}),
                                          testing::Values(Mainloop::Auto), testing::Values(0, 3), testing::Values(2, 3)),
                         case_name);

// ---------------------------------------------------------------- against the emulator, and determinism

using Buffers = std::vector<std::pair<std::string, std::vector<float>>>;
// Every named buffer of `got` has the same bits as the one of `want`; `how` says what differs.
void expect_same_bits(const Buffers& got, const Buffers& want, const std::string& how) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t b = 0; b < got.size(); b++) {
        ASSERT_EQ(got[b].second.size(), want[b].second.size()) << got[b].first;
        EXPECT_EQ(0, std::memcmp(got[b].second.data(), want[b].second.data(), got[b].second.size() * sizeof(float)))
            << got[b].first << " differs " << how;
    }
}
// Elements left unwritten (the NaN a buffer was poisoned with) or otherwise not finite.
size_t non_finite(const std::vector<float>& v) {
    return std::count_if(v.begin(), v.end(), [](float x) { return !std::isfinite(x); });
}
template <class T>
std::vector<float> floats(const std::vector<T>& v) {
    std::vector<float> f(v.size());
    for (size_t e = 0; e < v.size(); e++) f[e] = to_float(v[e]);
    return f;
}

// Runs three programs with row, column and both kinds of partials (every reduction type) and
// returns all their outputs and partials.
template <class Act, class R>
Buffers fused_outputs(R& run, const Case& c) {
    const int M = c.M, K = c.K, N = c.N, vocab = N - 5;
    Rng rng(30);
    const Residual x(rng, M, K);
    const FoldedLinear lin(rng, K, N);
    const std::vector<bf16> dres = random_act<bf16>(rng, (size_t)M * K), wp = random_act<bf16>(rng, (size_t)N * K, 1 / std::sqrt(N));
    const std::vector<Act> f = random_act<Act>(rng, (size_t)M * N, 1.5), residual = random_act<Act>(rng, (size_t)M * N, 1.0, 0.7);
    const std::vector<float> bias = random_floats(rng, N, 0.1);
    std::vector<int> target(M);
    for (int& t : target) t = (int)rng.below(vocab);
    Buffers out;

    const HostGemm dg{M, N, K, &dres, {K}, &wp, {K, true}};
    FoldGradientBuffers<> fold(M, N, run.template shape<GeluBackward<Act>>(dg));
    std::vector<Act> g = nan_filled<Act>((size_t)M * N), df = g;
    GeluBackward<Act> gelu_backward;
    gelu_backward.f = {run.at(f), {N}}, gelu_backward.g = {run.at(g), {N}}, gelu_backward.df = {run.at(df), {N}};
    gelu_backward.fold = fold.program(run, lin);
    run.run(gelu_backward, dg);
    out.insert(out.end(), {{"g", floats(g)}, {"df", floats(df)}, {"m1", fold.m1}, {"m2", fold.m2}, {"db", fold.db}});

    const HostGemm proj{M, N, K, &x.x, {K}, &lin.w_folded, {N}};
    std::vector<Act> x_out = nan_filled<Act>((size_t)M * N);
    std::vector<float> stats = partials(M, n_tiles(N, run.template shape<ResidualForward<Act>>(proj).bn), Welford::kWords);
    ResidualForward<Act> residual_forward;
    residual_forward.bias = {run.at(bias)}, residual_forward.residual = {run.at(residual), {N}};
    residual_forward.x_out = {run.at(x_out), {N}}, residual_forward.row_stats = {run.at(stats)};
    run.run(residual_forward, proj);
    out.insert(out.end(), {{"x'", floats(x_out)}, {"Welford partials", stats}});

    std::vector<Act> logits = nan_filled<Act>((size_t)M * N);
    std::vector<float> lse = partials(M, n_tiles(N, run.template shape<LmHeadForward<Act>>(proj).bn), MaxSumExp::kWords);
    std::vector<float> target_logit = nan_filled<float>(M);
    LmHeadForward<Act> lm_head;
    lm_head.ln = lin.fold(run, x.mu, x.rstd);
    lm_head.logits = {run.at(logits), {N}}, lm_head.vocab = vocab, lm_head.lse_partials = {run.at(lse)};
    lm_head.target_logit = {run.at(std::as_const(target)), run.at(target_logit)};
    run.run(lm_head, proj);
    out.insert(out.end(), {{"logits", floats(logits)}, {"max/sum-exp partials", lse}, {"target logits", target_logit}});
    return out;
}

class GpuEngine : public testing::TestWithParam<Mainloop> {
  protected:
    void SetUp() override { REQUIRE_MAINLOOP(GetParam()); }
};

// With fp32 activations nothing is rounded to bf16, so outputs and every partial slot differ
// between the GPU and the emulator (same tile shape) only by the order of fp32 sums: the
// accumulators by the GPU's tol(K), the partials by rounding. Bound: 2 tol(K) of the buffer's
// largest magnitude. Counts (Welford n) must agree exactly, which the bound enforces at |n| >= 8.
TEST_P(GpuEngine, PartialsMatchTheEmulator) {
    const Case c{264, 1600, 1600};
    GpuRunner gpu(GetParam());
    const HostGemm g{c.M, c.N, c.K, nullptr, {c.K}, nullptr, {c.N}};
    // the emulator runs the three programs of fused_outputs on one tile: the GPU's plan for each
    const TileShape tile = gpu.shape<GeluBackward<float>>(g);
    for (const TileShape& t : {gpu.shape<ResidualForward<float>>(g), gpu.shape<LmHeadForward<float>>(g)})
        ASSERT_TRUE(t.bm == tile.bm && t.bn == tile.bn) << "the programs' plans differ at this size";
    EmulatorRunner emulator{tile};
    std::printf("  tile %dx%d\n", emulator.tile.bm, emulator.tile.bn);
    const Buffers got = fused_outputs<float>(gpu, c), want = fused_outputs<float>(emulator, c);
    ASSERT_EQ(got.size(), want.size());
    for (size_t b = 0; b < got.size(); b++) {
        const std::vector<float>&x = got[b].second, &y = want[b].second;
        ASSERT_EQ(x.size(), y.size());
        double err = 0, scale = 0;
        for (size_t e = 0; e < x.size(); e++) {
            err = std::isnan(x[e]) || std::isnan(y[e]) ? INFINITY : std::max(err, (double)std::fabs(x[e] - y[e]));
            scale = std::max(scale, (double)std::fabs(y[e]));
        }
        report(got[b].first + " GPU vs emulator", err / scale, 2 * gpu_tol(c.K));
    }
}

// No atomics, a fixed combine order: two runs give the same bits, outputs and partials.
TEST_P(GpuEngine, RerunsAreBitIdentical) {
    const Case c{264, 1600, 1600};
    GpuRunner gpu(GetParam());
    const Buffers first = fused_outputs<bf16>(gpu, c), second = fused_outputs<bf16>(gpu, c);
    expect_same_bits(second, first, "between two runs");
}

// GPT-2 1.5B's attention-projection shape at B*T = 16384: every element written, 256 sampled rows
// against fp64, and the time (information only; the benchmark against cuBLASLt is bench_gemm).
TEST_P(GpuEngine, FullSizePlainGemm) {
    const int M = 16384, K = 1600, N = 1600, rows = 256;
    Rng rng(40);
    const std::vector<bf16> a = random_act<bf16>(rng, (size_t)M * K), b = random_act<bf16>(rng, (size_t)K * N, 1 / std::sqrt(K));
    test::DeviceBuffer<bf16> da((size_t)M * K), db((size_t)K * N), dout((size_t)M * N);
    da.upload(a), db.upload(b);
    dout.poison();
    PlainStore<> p;
    p.out = {dout, {N}};
    const GemmProblem prob{M, N, K, {da, {K}}, {db, {N}}};
    gemm(p, prob, 0, GetParam());
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<bf16> out = dout.download();

    std::vector<bf16> a_rows, out_rows;
    std::vector<int> picked;
    for (int r = 0; r < rows; r++) picked.push_back((int)rng.below(M));
    for (const int i : picked) {
        a_rows.insert(a_rows.end(), a.begin() + (size_t)i * K, a.begin() + (size_t)(i + 1) * K);
        out_rows.insert(out_rows.end(), out.begin() + (size_t)i * N, out.begin() + (size_t)(i + 1) * N);
    }
    size_t unwritten = 0;
    for (const bf16 v : out) unwritten += !std::isfinite(to_float(v));
    EXPECT_EQ(unwritten, 0u) << "elements left unwritten (NaN) or non-finite";
    expect_rounded("sampled rows of out = A B", out_rows, matmul(to_double(a_rows), to_double(b), rows, K, N), gpu_tol(K));

    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    const int reps = 20;
    CUDA_CHECK(cudaEventRecord(start));
    for (int r = 0; r < reps; r++) gemm(p, prob, 0, GetParam());
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    std::printf("  %s %dx%dx%d plain GEMM: %.3f ms, %.0f TFLOP/s (mean of %d after one warm-up)\n", name_of(GetParam()), M,
                N, K, ms / reps, 2.0 * M * N * K / (ms / reps * 1e-3) / 1e12, reps);
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
}

INSTANTIATE_TEST_SUITE_P(Mainloops, GpuEngine, testing::Values(Mainloop::Sm80, Mainloop::Auto),
                         [](const testing::TestParamInfo<Mainloop>& info) { return std::string(name_of(info.param)); });

// A pass copies the tiles it reads into shared memory: 16 bytes at a time where a tile's rows are
// 16-byte aligned, value by value where not. A tile one element off alignment and a tile stored
// transposed hold the same values as aligned row-major ones, so every output has the same bits.
TEST(GpuPass, ReadsUnalignedAndTransposedTilesAsAlignedOnes) {
    REQUIRE_GPU();
    const int M = 136, K = 72, N = 200;  // a partial tile in both dimensions, a chunk of 8 columns
    Rng rng(50);
    const FoldedLinear lin(rng, K, N);
    const std::vector<bf16> dqkv = random_act<bf16>(rng, (size_t)M * N), qkv = random_act<bf16>(rng, (size_t)M * N);
    std::vector<bf16> dqkv_off(1 + (size_t)M * N), qkv_t((size_t)N * M);
    std::copy(dqkv.begin(), dqkv.end(), dqkv_off.begin() + 1);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) qkv_t[(size_t)j * M + i] = qkv[(size_t)i * N + j];
    auto outputs = [&](bool unaligned, bool transposed) {
        GpuRunner run(Mainloop::Sm80);
        const HostGemm pass{M, N, 0};
        FoldGradientBuffers<> out(M, N, run.shape<QkvGradient<>>(pass));
        QkvGradient<> p;
        p.dqkv = unaligned ? LoadTile<bf16>{run.at(std::as_const(dqkv_off)) + 1, {N}} : LoadTile<bf16>{run.at(dqkv), {N}};
        p.qkv = transposed ? LoadTile<bf16>{run.at(qkv_t), {M, true}} : LoadTile<bf16>{run.at(qkv), {N}};
        p.fold = out.program(run, lin);
        run.run(p, pass);
        return Buffers{{"m1", out.m1}, {"m2", out.m2}, {"db", out.db}};
    };
    const Buffers aligned = outputs(false, false);
    for (const auto& [unaligned, transposed] : {std::pair{true, false}, {false, true}})
        expect_same_bits(outputs(unaligned, transposed), aligned, unaligned ? "with dqkv unaligned" : "with qkv transposed");
    // The aligned run's values are checked against fp64 by GpuPrograms.QkvGradient.
    EXPECT_EQ(non_finite(aligned[0].second), 0u) << "m1 partials left unwritten (NaN)";
}

// A GEMM's epilogue reads and writes its tiles a whole segment (16 bytes) at a time where their
// rows are 16-byte aligned and row-major, value by value where not. A loaded and a stored tile one
// element off alignment, or both stored transposed, give the same bits as aligned row-major ones,
// on both mainloops: the general segment loop against the whole-segment one (gemm_epilogue.cuh),
// with df aligned and row-major in every form (a tile of mixed accesses).
TEST(GpuEpilogue, AccessesUnalignedAndTransposedTilesAsAlignedOnes) {
    REQUIRE_GPU();
    const int M = 136, K = 72, N = 200;  // partial tiles in both dimensions
    Rng rng(51);
    const FoldedLinear fc(rng, K, N);
    const std::vector<bf16> dres = random_act<bf16>(rng, (size_t)M * K), wp = random_act<bf16>(rng, (size_t)N * K, 1 / std::sqrt(N));
    const std::vector<bf16> f = random_act<bf16>(rng, (size_t)M * N, 1.5);
    std::vector<bf16> f_off(1 + (size_t)M * N), f_t((size_t)N * M);
    std::copy(f.begin(), f.end(), f_off.begin() + 1);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) f_t[(size_t)j * M + i] = f[(size_t)i * N + j];
    const HostGemm gemm{M, N, K, &dres, {K}, &wp, {K, true}};
    enum Form { kAligned, kUnaligned, kTransposed };
    auto outputs = [&](Mainloop mainloop, Form form) {
        GpuRunner run(mainloop);
        FoldGradientBuffers<> out(M, N, run.shape<GeluBackward<>>(gemm));
        std::vector<bf16> g = nan_filled<bf16>(1 + (size_t)M * N);  // unaligned: from element 1
        std::vector<bf16> df = nan_filled<bf16>((size_t)M * N);      // row-major in every form
        GeluBackward<> p;
        p.df = {run.at(df), {N}};
        if (form == kAligned) p.f = {run.at(f), {N}}, p.g = {run.at(g), {N}};
        if (form == kUnaligned) p.f = {run.at(std::as_const(f_off)) + 1, {N}}, p.g = {run.at(g) + 1, {N}};
        if (form == kTransposed) p.f = {run.at(f_t), {M, true}}, p.g = {run.at(g), {M, true}};
        p.fold = out.program(run, fc);
        run.run(p, gemm);
        std::vector<float> g_rows((size_t)M * N);  // g row-major, whatever its layout
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++)
                g_rows[(size_t)i * N + j] = to_float(form == kAligned      ? g[(size_t)i * N + j]
                                                     : form == kUnaligned ? g[1 + (size_t)i * N + j]
                                                                          : g[(size_t)j * M + i]);
        return Buffers{{"g", g_rows}, {"df", floats(df)}, {"m1", out.m1}, {"m2", out.m2}, {"db", out.db}};
    };
    for (const Mainloop mainloop : {Mainloop::Sm80, Mainloop::Auto}) {
        const Buffers aligned = outputs(mainloop, kAligned);
        for (const Form form : {kUnaligned, kTransposed})
            expect_same_bits(outputs(mainloop, form), aligned,
                             std::string("on ") + name_of(mainloop) +
                                 (form == kUnaligned ? " with f and g unaligned" : " with f and g transposed"));
        // The aligned run's values are checked against fp64 by GpuPrograms.GeluBackward.
        EXPECT_EQ(non_finite(aligned[0].second), 0u) << "g elements left unwritten (NaN) on " << name_of(mainloop);
    }
}

// ---------------------------------------------------------------- bad problems (no GPU needed)

TEST(GpuGemm, RefusesBadProblemsNamingTheOperand) {
    alignas(16) static bf16 buf[256];
    PlainStore<> p;
    auto error = [&](const GemmProblem& prob) { return test::error_of([&] { gemm(p, prob, 0, Mainloop::Sm80); }); };
    EXPECT_TRUE(test::mentions(error({8, 8, 8, {nullptr, {8}}, {buf, {8}}}), "operand A: null pointer"));
    EXPECT_TRUE(test::mentions(error({8, 8, 8, {buf, {8}}, {buf + 1, {8}}}), "operand B: pointer not 16-byte aligned"));
    EXPECT_TRUE(test::mentions(error({8, 8, 8, {buf, {12}}, {buf, {8}}}), "operand A: leading dimension 12 is not a multiple of 8"));
    EXPECT_TRUE(test::mentions(error({8, 16, 8, {buf, {8}}, {buf, {8}}}), "operand B: leading dimension 8 is less than"));
    EXPECT_TRUE(test::mentions(error({16, 8, 8, {buf, {8, true}}, {buf, {8}}}), "operand A: leading dimension 8 is less than"));
    EXPECT_TRUE(test::mentions(error({12, 8, 8, {buf, {8}}, {buf, {8}}}), "multiples of 8, got M=12"));
}

// ---------------------------------------------------------------- plans: tiles and K splits

// The 128 x 320 tile, whose epilogue does not overlap the mainloop, where K is long enough to
// hide it and 320 divides N (the 1.5B LM head's dX), not on the short reductions (K = C) nor on
// 350M's 1024-wide outputs, which 128 divides and 320 does not.
TEST(GpuGemm, WideTileOnlyForLongReductions) {
    const int T = 16384, sms = 132;
    auto tile = [&](int M, int N, int K) {
        return sm90::detail::choose_plan(GemmProblem{M, N, K, {}, {}}, sms).tile;
    };
    EXPECT_EQ(tile(T, 1600, 50304), sm90::Tile::k128x320);
    for (const auto& [M, N, K] : {std::tuple{T, 4800, 1600}, {T, 1600, 1600}, {T, 6400, 1600}, {T, 50304, 1600},
                                  {T, 1024, 50304}, {T, 3072, 1024}})
        EXPECT_NE(tile(M, N, K), sm90::Tile::k128x320) << M << "x" << N << "x" << K;
}

// ResidualForward declares that the wide tile pays for it (its plan prices the tile without the
// unhidden-epilogue term where K is long): on it for the 1.5B fcproj forward (K = 6400), not for
// the proj forward (K = 1600), not on 350M's 1024-wide outputs, not on too few tiles, and no other
// program of the trainer asks for it.
TEST(GpuGemm, ResidualForwardTakesTheWideTileOnThe1600WideOutputsWhereKIsLong) {
    EXPECT_TRUE(wide_tile_pays<ResidualForward<>>);
    EXPECT_FALSE(wide_tile_pays<QkvForward<>>);
    EXPECT_FALSE(wide_tile_pays<GeluBackward<>>);
    EXPECT_FALSE(wide_tile_pays<void>);
    const int T = 16384, sms = 132;
    auto tile = [&](int M, int N, int K, bool wide) {
        return sm90::detail::choose_plan(GemmProblem{M, N, K, {}, {}}, sms, wide).tile;
    };
    EXPECT_EQ(tile(T, 1600, 6400, true), sm90::Tile::k128x320);
    EXPECT_NE(tile(T, 1600, 6400, false), sm90::Tile::k128x320);
    EXPECT_NE(tile(T, 1600, 1600, true), sm90::Tile::k128x320);
    EXPECT_NE(tile(T, 1024, 4096, true), sm90::Tile::k128x320);
    EXPECT_NE(tile(264, 1600, 6400, true), sm90::Tile::k128x320);  // 15 tiles for 132 SMs
    // the threshold itself: 3200 = 50 k-blocks takes it, 3136 = 49 does not
    EXPECT_EQ(tile(3328, 1600, 3200, true), sm90::Tile::k128x320);
    EXPECT_NE(tile(3328, 1600, 3136, true), sm90::Tile::k128x320);
}

// LnBackwardX refuses the wide tile (its three column partials beside 160 accumulators): the 1.5B
// LM head's dX (K = 50304), which the plan by shape puts on it, goes to another tile when refused.
TEST(GpuGemm, LnBackwardXRefusesTheWideTile) {
    EXPECT_TRUE(wide_tile_refused<LnBackwardX<>>);
    EXPECT_FALSE(wide_tile_refused<ResidualForward<>>);
    EXPECT_FALSE(wide_tile_refused<GeluBackward<>>);
    EXPECT_FALSE(wide_tile_refused<void>);
    const GemmProblem lm_head_dx{16384, 1600, 50304, {}, {}};
    EXPECT_EQ(sm90::detail::choose_plan(lm_head_dx, 132).tile, sm90::Tile::k128x320);
    EXPECT_NE(sm90::detail::choose_plan(lm_head_dx, 132, false, true).tile, sm90::Tile::k128x320);
}

// The plain GEMM's plan on a card with the H100's HBM bandwidth (3.35 TB/s) uses the model fitted
// there: the 1.5B outputs 1600 wide on the 128 x 320 tile, the 350M LM head's dW on 128 x 256,
// ping-pong kept for the short reductions into wide outputs. Programs keep the H200's model, as
// does every GEMM of a card with the H200's bandwidth or one that reports none.
TEST(GpuGemm, PlainGemmsOnTheH100TakeItsCostModel) {
    using sm90::detail::cost_model;
    EXPECT_TRUE(plain_gemm<PlainStore<>>);
    EXPECT_TRUE(plain_gemm<PlainAccumulate>);
    EXPECT_FALSE(plain_gemm<GeluBackward<>>);
    EXPECT_FALSE(plain_gemm<void>);
    EXPECT_EQ(&cost_model(3.35e12, true), &sm90::detail::kH100PlainCosts);
    EXPECT_EQ(&cost_model(3.35e12, false), &sm90::detail::kH200Costs);
    EXPECT_EQ(&cost_model(4.8e12, true), &sm90::detail::kH200Costs);
    EXPECT_EQ(&cost_model(0.0, true), &sm90::detail::kH200Costs);
    const int T = 16384, sms = 132;
    auto tile = [&](int M, int N, int K) {
        return sm90::detail::choose_plan(GemmProblem{M, N, K, {}, {}}, sms, false, false, sm90::detail::kH100PlainCosts)
            .tile;
    };
    for (const auto& [M, N, K] : {std::tuple{T, 1600, 1600}, {T, 1600, 6400}, {T, 1600, 4800}, {T, 1600, 50304}})
        EXPECT_EQ(tile(M, N, K), sm90::Tile::k128x320) << M << "x" << N << "x" << K;
    EXPECT_EQ(tile(50304, 1024, T), sm90::Tile::k128x256);
    for (const auto& [M, N, K] : {std::tuple{T, 3072, 1024}, {T, 50304, 1024}, {T, 4096, 1024}})
        EXPECT_EQ(tile(M, N, K), sm90::Tile::kPingPong128x128) << M << "x" << N << "x" << K;
    // under the H200's model the 1.5B projection stays on ping-pong
    EXPECT_EQ(sm90::detail::choose_plan(GemmProblem{T, 1600, 1600, {}, {}}, sms).tile, sm90::Tile::kPingPong128x128);
}

// The same end to end: partials sized from gemm_tile_shape<ResidualForward> on a problem whose
// plan is the wide tile (26 M-tiles x 5 for 132 SMs, K at the threshold), checked against fp64.
TEST(GpuGemm, ResidualForwardOnItsPlan) {
    REQUIRE_MAINLOOP(Mainloop::Auto);
    const Case c{26 * 128, 3200, 1600};
    ASSERT_EQ(sm90::plan<ResidualForward<>>(GemmProblem{c.M, c.N, c.K, {}, {}}).tile, sm90::Tile::k128x320);
    GpuRunner run{Mainloop::Auto};
    check_residual_forward(run, c);
}

// The engine's plans on an H200 (132 SMs) for GPT-2 1.5B's GEMMs at 16384 tokens: K is split only
// where the output's tiles leave SMs idle (the weight gradients of the small C x C and C x 3C
// outputs), never for the wide forward and dX outputs, and every split has k-blocks.
TEST(GpuGemm, SplitsKOnlyWhereTheTilesAreTooFew) {
    const int T = 16384, C = 1600, sms = 132;
    auto plan = [&](int M, int N, int K) { return sm90::detail::choose_plan(GemmProblem{M, N, K, {}, {}}, sms); };
    for (const auto& [M, N, K] : {std::tuple{T, 3 * C, C}, {T, C, C}, {T, 4 * C, C}, {T, C, 4 * C}, {T, C, 50304}}) {
        const sm90::detail::Plan p = plan(M, N, K);
        EXPECT_EQ(p.splits, 1) << M << "x" << N << "x" << K << " has " << n_tiles(M, 128) * n_tiles(N, 128)
                               << " tiles or more: no split";
    }
    for (const auto& [M, N] : {std::pair{C, C}, {1024, 1024}, {1024, 3072}}) {
        const sm90::detail::Plan p = plan(M, N, T);
        EXPECT_GT(p.splits, 1) << M << "x" << N << "x" << T << ": too few tiles for " << sms << " SMs unsplit";
    }
    for (int K : {64, 512, 1024, 4096, 16384, 50304})
        for (int MN : {128, 1024, 1600}) {
            const sm90::detail::Plan p = plan(MN, MN, K);
            const int k_blocks = n_tiles(K, sm90::kBK);
            EXPECT_LT((p.splits - 1) * sm90::detail::split_k_blocks(k_blocks, p.splits), k_blocks)
                << "an empty split for K = " << K;
        }
}

// ---------------------------------------------------------------- tile order (no GPU needed)

// The Hopper mainloop's tile order, with the group size the engine picks for the shape: every
// tile once, and dealt round robin to the CTAs, the busiest CTA's work (half tiles: a last row or
// column at most half inside the matrix, counted half) no more than with groups of 16, and less
// where the groups' half tiles would pile up on some CTAs: 1.5B's 16384 x 1600 outputs on an H200
// (132 SMs) in 128 x 128 tiles, 12.5 tiles a CTA instead of 13. Outputs without half tiles keep 16.
TEST(GpuGemm, TileOrderSpreadsHalfTiles) {
    const int sms = 132;
    struct Output {
        int M, N, BM, BN, splits;
    };
    for (const Output& o : {Output{16384, 1600, 128, 128, 1}, {16384, 4800, 128, 128, 1}, {1600, 4800, 128, 128, 1},
                            {16384, 1600, 128, 256, 1}, {1600, 1600, 128, 128, 2}, {136, 200, 256, 128, 1},
                            {16384, 6400, 128, 128, 1}}) {
        const int M = o.M, N = o.N, BM = o.BM, BN = o.BN, splits = o.splits;
        const int tiles_m = n_tiles(M, BM), tiles_n = n_tiles(N, BN), grid = std::min(tiles_m * tiles_n * splits, sms);
        const bool half_m = M - (tiles_m - 1) * BM <= BM / 2, half_n = N - (tiles_n - 1) * BN <= BN / 2;
        const std::string shape = std::to_string(M) + "x" + std::to_string(N) + " in " + std::to_string(BM) + "x" +
                                  std::to_string(BN) + " split " + std::to_string(splits);
        auto busiest = [&](int group_m) {
            std::vector<int> seen(tiles_m * tiles_n, 0);
            std::vector<double> work(grid, 0.0);
            for (int u = 0; u < tiles_m * tiles_n * splits; u++) {
                const sm90::TileCoord c = sm90::tile_coord(u / splits, tiles_m, tiles_n, group_m);
                EXPECT_TRUE(c.m >= 0 && c.m < tiles_m && c.n >= 0 && c.n < tiles_n) << shape << " unit " << u;
                if (u % splits == 0) seen[c.m * tiles_n + c.n]++;
                work[u % grid] += (half_m && c.m == tiles_m - 1 ? 0.5 : 1.0) * (half_n && c.n == tiles_n - 1 ? 0.5 : 1.0);
            }
            EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), tiles_m * tiles_n) << shape << ": each tile once";
            return *std::max_element(work.begin(), work.end());
        };
        const int group_m = sm90::detail::group_m_for(sm90::detail::TileGrid::of(M, N, BM, BN), splits, grid, 16);
        EXPECT_TRUE(group_m >= 8 && group_m <= 16) << shape;
        const double most = busiest(group_m);
        EXPECT_LE(most, busiest(16)) << shape;
        if (!half_m && !half_n) EXPECT_EQ(group_m, 16) << shape;
        if (M == 16384 && N == 1600 && BN == 128) {
            EXPECT_EQ(busiest(16), 13.0) << shape;
            EXPECT_EQ(most, 12.5) << shape;
        }
    }
}

// Half tiles only where a group's operands (16 M-tiles of A rows, all of B) fit in L2: on an
// H200 (60 MiB), 1.5B's forward and dX GEMMs with K up to 6400, not the LM head's dX (K = 50304)
// or the weight gradients (K = 16384 tokens).
TEST(GpuGemm, HalfTilesOnlyWhereAGroupFitsInL2) {
    const long l2 = 60l << 20;
    auto pays = [&](int M, int N, int K) { return sm90::detail::half_tiles_pay(GemmProblem{M, N, K, {}, {}}, 128, 16, l2); };
    EXPECT_TRUE(pays(16384, 1600, 6400));
    EXPECT_TRUE(pays(16384, 4800, 1600));
    EXPECT_FALSE(pays(16384, 1600, 50304));
    EXPECT_FALSE(pays(1600, 6400, 16384));
    EXPECT_TRUE(pays(264, 1600, 1600));
}

TEST(GpuGemm, RefusesAGemmForAPassProgram) {
    alignas(16) static bf16 buf[64];
    const std::string error = test::error_of([&] { gemm(QkvGradient<>{}, {8, 8, 8, {buf, {8}}, {buf, {8}}}, 0); });
    EXPECT_TRUE(test::mentions(error, "a pass without a GEMM (K = 0), got K=8")) << error;
}

TEST(GpuGemm, RefusesAnImpossibleSplit) {
    alignas(16) static bf16 buf[256];
    PlainStore<> p;
    auto error = [&](int splits) {
        return test::error_of([&] {
            sm90::detail::gemm_with_plan(p, {8, 8, 128, {buf, {128}}, {buf, {8}}}, {sm90::Tile::k128x128, splits}, 0);
        });
    };
    EXPECT_TRUE(test::mentions(error(3), "3 K splits of 2 k-blocks"));
    EXPECT_TRUE(test::mentions(error(0), "0 K splits"));
}

}  // namespace
