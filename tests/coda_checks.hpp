// The GPT-2 epilogue programs checked against fp64 math, once for every engine that runs them:
// the CPU emulator (test_epilogue.cpp) and the GPU engine's mainloops (test_gpu_gemm.cu). Each
// check_* function draws its inputs, runs one program through a Runner and compares every output
// and finalized partial with plain fp64 math (textbook LayerNorm, GEMM, GELU, backprop, as in
// ../shared/design/coda_gpt2_check.py).
//
// Bounds. fp32 arithmetic against fp64 on the same inputs: error <= `tol` of the largest reference
// magnitude (for sums: of the sum of the magnitudes of the summands, which is what fp32
// accumulation error scales with). tol is the Runner's: 1e-5 for the emulator's round-to-nearest
// sums; the GPU's tensor cores add each k16 step into the fp32 accumulator rounding toward zero,
// an error of up to 2^-23 of the accumulator per step, so K/16 steps add K/16 * 2^-23 to it.
// bf16 outputs: within one bf16 rounding, |out - ref| <= 2^-8 |ref| (twice the half-ulp of a
// round-to-nearest: the value rounded is itself an fp32 result), plus the fp32 slack above. Each
// check prints its error next to its bound.
//
// A Runner runs a program on one GEMM (or a pass with K = 0) and moves the buffers:
//   T* at(std::vector<T>& v)              where the program sees v; v receives the results
//   const T* at(const std::vector<T>& v)  where the program sees the input v
//   TileShape shape<P>(const HostGemm& g) the tile shape of a run of program type P (sizes the partials)
//   double tol(int K)                     the fp32 bound above
//   void run(const P& p, const HostGemm& g)
// at() hands out places for the next run() only; run() leaves every result in its host vector.
// Outputs and partials start as NaN, so an element or slot left unwritten fails its check.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "coda_programs.cuh"
#include "gemm_emulator.hpp"
#include "rng.hpp"

namespace codagpt::coda::check {

constexpr double kFp32Bound = 1e-5;
const double kBf16Rounding = std::ldexp(1.0, -8);

using Vec = std::vector<double>;

// ---------------------------------------------------------------- data

// n values offset + scale * N(0, 1), rounded to Act (what the kernels would read).
template <class Act>
std::vector<Act> random_act(Rng& rng, size_t n, double scale = 1.0, double offset = 0.0) {
    std::vector<Act> v(n);
    for (Act& x : v) x = round_to<Act>((float)(offset + scale * rng.normal()));
    return v;
}
inline std::vector<float> random_floats(Rng& rng, size_t n, double scale = 1.0, double offset = 0.0) {
    return random_act<float>(rng, n, scale, offset);
}
template <class T>
inline Vec to_double(const std::vector<T>& v) {
    Vec d(v.size());
    for (size_t i = 0; i < v.size(); i++) d[i] = to_float(v[i]);
    return d;
}
template <class Act>
std::vector<Act> to_act(const Vec& v) {
    std::vector<Act> o(v.size());
    for (size_t i = 0; i < v.size(); i++) o[i] = round_to<Act>((float)v[i]);
    return o;
}
inline std::vector<float> to_floats(const Vec& v) { return to_act<float>(v); }
template <class T>
std::vector<T> nan_filled(size_t n) {
    return std::vector<T>(n, round_to<T>(NAN));
}

// ---------------------------------------------------------------- fp64 math

// C[M, N] = A[M, K] B[K, N]; at/bt: the operand is given as its transpose.
inline Vec matmul(const Vec& a, const Vec& b, int M, int K, int N, bool at = false, bool bt = false) {
    Vec c((size_t)M * N, 0.0);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++) {
            const double aik = at ? a[(size_t)k * M + i] : a[(size_t)i * K + k];
            for (int j = 0; j < N; j++) c[(size_t)i * N + j] += aik * (bt ? b[(size_t)j * K + k] : b[(size_t)k * N + j]);
        }
    return c;
}
inline Vec transpose(const Vec& a, int rows, int cols) {
    Vec t(a.size());
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) t[(size_t)j * rows + i] = a[(size_t)i * cols + j];
    return t;
}

inline double gelu64(double u) { return 0.5 * u * (1 + std::tanh(std::sqrt(2 / M_PI) * (u + 0.044715 * u * u * u))); }
inline double dgelu64(double u) {
    const double a = std::sqrt(2 / M_PI) * (u + 0.044715 * u * u * u), t = std::tanh(a);
    return 0.5 * (1 + t) + 0.5 * u * (1 - t * t) * std::sqrt(2 / M_PI) * (1 + 3 * 0.044715 * u * u);
}

struct Stats {
    Vec mu, rstd;
};
inline Stats ln_stats(const Vec& x, int M, int C) {
    Stats s{Vec(M), Vec(M)};
    for (int i = 0; i < M; i++) {
        double mean = 0, var = 0;
        for (int k = 0; k < C; k++) mean += x[(size_t)i * C + k];
        mean /= C;
        for (int k = 0; k < C; k++) var += (x[(size_t)i * C + k] - mean) * (x[(size_t)i * C + k] - mean);
        s.mu[i] = mean;
        s.rstd[i] = 1 / std::sqrt(var / C + 1e-5);
    }
    return s;
}
inline Vec layernorm(const Vec& x, const Stats& s, const Vec& gamma, const Vec& beta, int M, int C) {
    Vec a(x.size());
    for (int i = 0; i < M; i++)
        for (int k = 0; k < C; k++)
            a[(size_t)i * C + k] = (x[(size_t)i * C + k] - s.mu[i]) * s.rstd[i] * gamma[k] + beta[k];
    return a;
}
// ---------------------------------------------------------------- checks

inline double max_abs(const Vec& v) {
    double m = 0;
    for (double x : v) m = std::max(m, std::fabs(x));
    return m;
}
inline void report(const std::string& what, double err, double bound) {
    std::printf("    %-42s error %.2e  bound %.1e\n", what.c_str(), err, bound);
    EXPECT_LE(err, bound) << what;  // NaN fails too
}
// max |out - ref| / max |ref|
inline void expect_fp32(const std::string& what, const Vec& out, const Vec& ref, double bound = kFp32Bound) {
    ASSERT_EQ(out.size(), ref.size());
    double err = 0;
    for (size_t i = 0; i < ref.size(); i++) err = std::isnan(out[i]) ? INFINITY : std::max(err, std::fabs(out[i] - ref[i]));
    report(what, err / std::max(max_abs(ref), 1e-30), bound);
}
// max |out - ref| / sum |summands|, per entry: sums whose terms cancel.
inline void expect_sum(const std::string& what, const Vec& out, const Vec& ref, const Vec& magnitude,
                       double bound = kFp32Bound) {
    ASSERT_EQ(out.size(), ref.size());
    double err = 0;
    for (size_t i = 0; i < ref.size(); i++)
        err = std::isnan(out[i]) ? INFINITY : std::max(err, std::fabs(out[i] - ref[i]) / std::max(magnitude[i], 1e-30));
    report(what, err, bound);
}
// Within one bf16 rounding plus fp32 slack: reports the worst ratio to that allowance (bound 1).
template <class T>
void expect_rounded(const std::string& what, const std::vector<T>& out, const Vec& ref, double tol = kFp32Bound) {
    ASSERT_EQ(out.size(), ref.size());
    const double slack = tol * max_abs(ref);
    double worst = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        const double err = std::fabs(to_float(out[i]) - ref[i]);
        worst = std::max(worst, err / (kBf16Rounding * std::fabs(ref[i]) + slack));
        if (!std::isfinite(to_float(out[i]))) worst = INFINITY;
    }
    report(what + " (x one bf16 rounding)", worst, 1.0);
}

// ---------------------------------------------------------------- partials

inline Vec row_sums(const std::vector<float>& partials, int M, int tiles_n, double scale = 1.0) {
    Vec s(M);
    for (int i = 0; i < M; i++) s[i] = finalize_row_sum(partials.data(), i, tiles_n, (float)scale);
    return s;
}
inline Vec col_sums(const std::vector<float>& partials, int N, int tiles_m) {
    Vec s(N);
    for (int j = 0; j < N; j++) s[j] = finalize_col_sum(partials.data(), j, tiles_m, N);
    return s;
}
// A partials buffer [rows, tiles, words] that a run must fill completely.
inline std::vector<float> partials(int rows, int tiles, int words) { return nan_filled<float>((size_t)rows * tiles * words); }

// ---------------------------------------------------------------- the runners' common part

// The GEMM of a check: out[M, N] = A[M, K] B[K, N], operands as host vectors with their layouts
// (null for a pass, K = 0).
struct HostGemm {
    int M, N, K;
    const std::vector<bf16>* a = nullptr;
    Layout la;
    const std::vector<bf16>* b = nullptr;
    Layout lb;
};

// The CPU emulator with a given tile shape.
struct EmulatorRunner {
    TileShape tile;
    template <class T>
    T* at(std::vector<T>& v) { return v.data(); }
    template <class T>
    const T* at(const std::vector<T>& v) { return v.data(); }
    template <class P>
    TileShape shape(const HostGemm&) const {
        return tile;
    }
    double tol(int) const { return kFp32Bound; }
    template <class P>
    void run(const P& p, const HostGemm& g) {
        if (g.K == 0) return emulate_pass(p, g.M, g.N, tile);
        emulate_gemm(p, g.M, g.N, g.K, Operand<bf16>{g.a->data(), g.la}, Operand<bf16>{g.b->data(), g.lb}, tile);
    }
};

// ---------------------------------------------------------------- the programs, one GEMM each

struct Case {
    int M, K, N;
    TileShape shape;  // the emulator's
};

// A GEMM z = LN(x) W + b with LayerNorm folded (CODA_GPT2.md): W~ = diag(gamma) W, c = column sums
// of W~, b~ = beta W + b. gamma are powers of two so that the bf16 W~ is exactly gamma W and the
// textbook reference sees the very weights the GEMM uses.
struct FoldedLinear {
    int K, N;
    Vec gamma, beta, w, b;             // textbook parameters (w: bf16 values)
    std::vector<bf16> w_folded;        // [K, N], the B operand
    std::vector<float> c, b_folded;    // [N]
    FoldedLinear(Rng& rng, int K_, int N_) : K(K_), N(N_), gamma(K), beta(K), b(N) {
        for (double& g : gamma) g = std::ldexp(rng.uniform() < 0.5 ? -1.0 : 1.0, (int)rng.below(3) - 1);
        for (double& x : beta) x = 0.1 * rng.normal();
        for (double& x : b) x = 0.1 * rng.normal();
        w = to_double(random_act<bf16>(rng, (size_t)K * N, 1 / std::sqrt(K)));
        Vec wf(w.size()), cv(N, 0.0), bt(b);
        for (int k = 0; k < K; k++)
            for (int j = 0; j < N; j++) {
                wf[(size_t)k * N + j] = gamma[k] * w[(size_t)k * N + j];
                cv[j] += wf[(size_t)k * N + j];
                bt[j] += beta[k] * w[(size_t)k * N + j];
            }
        w_folded = to_act<bf16>(wf), c = to_floats(cv), b_folded = to_floats(bt);
    }
    // textbook: LayerNorm(x) W + b
    Vec forward(const std::vector<bf16>& x, const Stats& s, int M) const {
        Vec z = matmul(layernorm(to_double(x), s, gamma, beta, M, K), w, M, K, N);
        for (size_t e = 0; e < z.size(); e++) z[e] += b[e % N];
        return z;
    }
    template <class R>
    LnFold fold(R& run, const std::vector<float>& mu, const std::vector<float>& rstd) const {
        return {{run.at(mu)}, {run.at(rstd)}, {run.at(c)}, {run.at(b_folded)}};
    }
};
// The residual stream: non-zero mean (as in the spec: randn + 0.7), and its statistics as fp32.
struct Residual {
    std::vector<bf16> x;
    std::vector<float> mu, rstd;
    Stats stats;  // of the fp32 mu, rstd: the values the kernels see
    Residual(Rng& rng, int M, int K) : x(random_act<bf16>(rng, (size_t)M * K, 1.0, 0.7)) {
        const Stats s = ln_stats(to_double(x), M, K);
        mu = to_floats(s.mu), rstd = to_floats(s.rstd);
        stats = {to_double(mu), to_double(rstd)};
    }
};

template <class R>
void check_qkv_forward(R& run, const Case& c) {
    const int M = c.M, K = c.K, N = c.N;
    Rng rng(10);
    const Residual x(rng, M, K);
    const FoldedLinear lin(rng, K, N);
    std::vector<bf16> z = nan_filled<bf16>((size_t)M * N);
    QkvForward<> p;
    p.ln = lin.fold(run, x.mu, x.rstd);
    p.z = {run.at(z), {N}};
    run.run(p, HostGemm{M, N, K, &x.x, {K}, &lin.w_folded, {N}});
    expect_rounded("z = LN(x) W + b", z, lin.forward(x.x, x.stats, M), run.tol(K));
}

template <class R>
void check_fc_forward(R& run, const Case& c) {
    const int M = c.M, K = c.K, N = c.N;
    Rng rng(11);
    const Residual x(rng, M, K);
    const FoldedLinear lin(rng, K, N);
    std::vector<bf16> f = nan_filled<bf16>((size_t)M * N), g = f;
    FcForward<> p;
    p.ln = lin.fold(run, x.mu, x.rstd);
    p.f = {run.at(f), {N}}, p.g = {run.at(g), {N}};
    run.run(p, HostGemm{M, N, K, &x.x, {K}, &lin.w_folded, {N}});
    Vec g_ref = to_double(f);  // g = gelu of the stored f
    for (double& v : g_ref) v = gelu64(v);
    expect_rounded("f = LN(x) W + b", f, lin.forward(x.x, x.stats, M), run.tol(K));
    expect_rounded("g = gelu(f)", g, g_ref, run.tol(K));
}

// Row statistics of a stored bf16 residual stream against fp64 ones, after finalize_row_stats.
inline void expect_row_stats(const std::string& what, const std::vector<float>& partials, const std::vector<bf16>& x,
                             int M, int N, int tiles_n, double tol) {
    const Stats s = ln_stats(to_double(x), M, N);
    Vec mu(M), rstd(M), mu_err(M), zero(M, 0.0), scale(M);
    for (int i = 0; i < M; i++) {
        const RowStats rs = finalize_row_stats(partials.data(), i, tiles_n);
        mu[i] = rs.mu, rstd[i] = rs.rstd;
        mu_err[i] = mu[i] - s.mu[i], scale[i] = std::fabs(s.mu[i]) + 1 / s.rstd[i];
    }
    expect_sum("mean of " + what + " (relative to |mean| + std)", mu_err, zero, scale, tol);
    expect_fp32("rstd of " + what, rstd, s.rstd, tol);
}

template <class R>
void check_residual_forward(R& run, const Case& c) {
    const int M = c.M, K = c.K, N = c.N;
    Rng rng(12);
    const std::vector<bf16> y = random_act<bf16>(rng, (size_t)M * K), w = random_act<bf16>(rng, (size_t)K * N, 1 / std::sqrt(K));
    const std::vector<bf16> residual = random_act<bf16>(rng, (size_t)M * N, 1.0, 0.7);
    const std::vector<float> bias = random_floats(rng, N, 0.1);
    std::vector<bf16> x_out = nan_filled<bf16>((size_t)M * N);
    const HostGemm gemm{M, N, K, &y, {K}, &w, {N}};
    const int tiles_n = n_tiles(N, run.template shape<ResidualForward<>>(gemm).bn);
    std::vector<float> stats = partials(M, tiles_n, Welford::kWords);
    ResidualForward<> p;
    p.bias = {run.at(bias)};
    p.residual = {run.at(residual), {N}};
    p.x_out = {run.at(x_out), {N}};
    p.row_stats = {run.at(stats)};
    run.run(p, gemm);

    Vec ref = matmul(to_double(y), to_double(w), M, K, N);
    const Vec res = to_double(residual);
    for (size_t e = 0; e < ref.size(); e++) ref[e] += bias[e % N] + res[e];
    expect_rounded("x' = y W + b + x", x_out, ref, run.tol(K));
    expect_row_stats("x'", stats, x_out, M, N, tiles_n, run.tol(K));  // of the stored bf16 x'
}

// A pass (K = 0) over a stored residual stream: its row statistics.
template <class R>
void check_residual_stats(R& run, const Case& c) {
    const int M = c.M, N = c.N;
    Rng rng(18);
    const std::vector<bf16> x = random_act<bf16>(rng, (size_t)M * N, 1.0, 0.7);
    const HostGemm pass{M, N, 0};
    const int tiles_n = n_tiles(N, run.template shape<ResidualStats<>>(pass).bn);
    std::vector<float> stats = partials(M, tiles_n, Welford::kWords);
    ResidualStats<> p;
    p.x = {run.at(x), {N}};
    p.row_stats = {run.at(stats)};
    run.run(p, pass);
    expect_row_stats("x", stats, x, M, N, tiles_n, run.tol(0));
}

template <class R>
void check_lm_head_forward(R& run, const Case& c) {
    const int M = c.M, K = c.K, N = c.N, vocab = N - 5;  // the last 5 columns are padding
    Rng rng(13);
    const Residual x(rng, M, K);
    const FoldedLinear lin(rng, K, N);
    std::vector<int> target(M);
    for (int& t : target) t = (int)rng.below(vocab);
    std::vector<bf16> logits = nan_filled<bf16>((size_t)M * N);
    const HostGemm gemm{M, N, K, &x.x, {K}, &lin.w_folded, {N}};
    const int tiles_n = n_tiles(N, run.template shape<LmHeadForward<>>(gemm).bn);
    std::vector<float> lse = partials(M, tiles_n, MaxSumExp::kWords), target_logit = nan_filled<float>(M);
    LmHeadForward<> p;
    p.ln = lin.fold(run, x.mu, x.rstd);
    p.logits = {run.at(logits), {N}};
    p.vocab = vocab;
    p.lse_partials = {run.at(lse)};
    p.target_logit = {run.at(std::as_const(target)), run.at(target_logit)};
    run.run(p, gemm);
    expect_rounded("logits = LN(x) W + b", logits, lin.forward(x.x, x.stats, M), run.tol(K));

    // Loss from the stored logits, over the real vocabulary only.
    const Vec z = to_double(logits);
    Vec loss(M), loss_ref(M), picked(M), picked_ref(M);
    for (int i = 0; i < M; i++) {
        double mx = -INFINITY, se = 0;
        for (int j = 0; j < vocab; j++) mx = std::max(mx, z[(size_t)i * N + j]);
        for (int j = 0; j < vocab; j++) se += std::exp(z[(size_t)i * N + j] - mx);
        picked_ref[i] = z[(size_t)i * N + target[i]], picked[i] = target_logit[i];
        loss_ref[i] = mx + std::log(se) - picked_ref[i];
        loss[i] = finalize_loss(lse.data(), i, tiles_n, target_logit[i]).loss;
    }
    expect_fp32("target logits", picked, picked_ref, 0.0);
    expect_fp32("loss = lse - z_target", loss, loss_ref, run.tol(K));
}

// The partials of a dz producer (FoldGradient) and their check against the definitions of
// CODA_GPT2.md (K: the width of the folded LayerNorm; dz: fp64 values of the gradient as the
// producer stored it, the operand of both GEMMs of the fold; z: of the stored pre-activation).
// Without kBias (the LM head's fold) there are no db partials to check.
template <bool kBias = true>
struct FoldGradientBuffers {
    int M, N, tiles_m, tiles_n;
    std::vector<float> m1, m2, db;
    FoldGradientBuffers(int M_, int N_, const TileShape& s)
        : M(M_), N(N_), tiles_m(n_tiles(M_, s.bm)), tiles_n(n_tiles(N_, s.bn)), m1(partials(M, tiles_n, 1)), m2(m1),
          db(kBias ? partials(tiles_m, N, 1) : std::vector<float>{}) {}
    template <class R>
    FoldGradient<kBias> program(R& run, const FoldedLinear& lin) {
        FoldGradient<kBias> f;
        f.c = {run.at(lin.c)}, f.b_folded = {run.at(lin.b_folded)};
        f.m1 = {run.at(m1)}, f.m2 = {run.at(m2)};
        if constexpr (kBias) f.db = {run.at(db)};
        return f;
    }
    void check(const std::string& who, const Vec& dz, const Vec& z, const FoldedLinear& lin, double tol) const {
        const int K = lin.K;
        Vec m1_ref(M, 0.0), m2_ref(M, 0.0), m1_mag(M, 0.0), m2_mag(M, 0.0), db_ref(N, 0.0), db_mag(N, 0.0);
        for (int i = 0; i < M; i++)
            for (int j = 0; j < N; j++) {
                const size_t ij = (size_t)i * N + j;
                m1_ref[i] += dz[ij] * lin.c[j] / K, m1_mag[i] += std::fabs(dz[ij] * lin.c[j]) / K;
                m2_ref[i] += dz[ij] * (z[ij] - lin.b_folded[j]) / K;
                m2_mag[i] += std::fabs(dz[ij] * (z[ij] - lin.b_folded[j])) / K;
                db_ref[j] += dz[ij], db_mag[j] += std::fabs(dz[ij]);
            }
        expect_sum(who + ": m1 = mean_j dz c", row_sums(m1, M, tiles_n, 1.0 / K), m1_ref, m1_mag, tol);
        expect_sum(who + ": m2 = mean_j dz (z - b~)", row_sums(m2, M, tiles_n, 1.0 / K), m2_ref, m2_mag, tol);
        if constexpr (kBias) expect_sum(who + ": db = sum_i dz", col_sums(db, N, tiles_m), db_ref, db_mag, tol);
    }
};

// dG GEMM: A = dres [M, K], B = Wp^T (Wp is [N, K], in x out); the fc fold has width K.
template <class R>
void check_gelu_backward(R& run, const Case& c) {
    const int M = c.M, K = c.K, N = c.N;
    Rng rng(14);
    const FoldedLinear fc(rng, K, N);
    const std::vector<bf16> dres = random_act<bf16>(rng, (size_t)M * K), wp = random_act<bf16>(rng, (size_t)N * K, 1 / std::sqrt(N));
    const std::vector<bf16> f = random_act<bf16>(rng, (size_t)M * N, 1.5);
    std::vector<bf16> g = nan_filled<bf16>((size_t)M * N), df = g;
    const HostGemm gemm{M, N, K, &dres, {K}, &wp, {K, true}};
    FoldGradientBuffers<> out(M, N, run.template shape<GeluBackward<>>(gemm));
    GeluBackward<> p;
    p.f = {run.at(f), {N}};
    p.g = {run.at(g), {N}}, p.df = {run.at(df), {N}};
    p.fold = out.program(run, fc);
    run.run(p, gemm);

    const Vec f64 = to_double(f);
    Vec df_ref = matmul(to_double(dres), to_double(wp), M, K, N, false, true), g_ref(f64.size());
    for (size_t e = 0; e < df_ref.size(); e++) df_ref[e] *= dgelu64(f64[e]), g_ref[e] = gelu64(f64[e]);
    expect_rounded("g = gelu(f)", g, g_ref, run.tol(K));
    expect_rounded("df = (dres Wp^T) gelu'(f)", df, df_ref, run.tol(K));
    out.check("df", to_double(df), f64, fc, run.tol(K));
}

// The pass after attention backward (K = 0): dz-producer partials from dqkv and qkv.
template <class R>
void check_qkv_gradient(R& run, const Case& c) {
    const int M = c.M, K = c.K, N = c.N;
    Rng rng(15);
    const FoldedLinear qkv_lin(rng, K, N);
    const std::vector<bf16> dqkv = random_act<bf16>(rng, (size_t)M * N), qkv = random_act<bf16>(rng, (size_t)M * N);
    const HostGemm pass{M, N, 0};
    FoldGradientBuffers<> out(M, N, run.template shape<QkvGradient<>>(pass));
    QkvGradient<> p;
    p.dqkv = {run.at(dqkv), {N}}, p.qkv = {run.at(qkv), {N}};
    p.fold = out.program(run, qkv_lin);
    run.run(p, pass);
    out.check("dqkv pass", to_double(dqkv), to_double(qkv), qkv_lin, run.tol(0));
}

// The cross-entropy pass over stored logits (K = 0; dz written in place of the logits).
template <class R>
void check_cross_entropy_gradient(R& run, const Case& c) {
    const int M = c.M, K = c.K, N = c.N, vocab = N - 5;  // the last 5 columns are padding
    Rng rng(19);
    const FoldedLinear lm_head(rng, K, N);
    std::vector<bf16> logits = random_act<bf16>(rng, (size_t)M * N, 2.0);
    const Vec z = to_double(logits);
    std::vector<int> target(M);
    for (int& t : target) t = (int)rng.below(vocab);
    std::vector<float> lse(M);
    for (int i = 0; i < M; i++) {
        double se = 0;
        for (int j = 0; j < vocab; j++) se += std::exp(z[(size_t)i * N + j]);
        lse[i] = (float)std::log(se);
    }
    const float scale = 1.f / 64;
    const HostGemm pass{M, N, 0};
    FoldGradientBuffers</*kBias=*/false> out(M, N, run.template shape<CrossEntropyGradient<>>(pass));
    CrossEntropyGradient<> p;
    p.logits = {run.at(std::as_const(logits)), {N}};
    p.lse = {run.at(std::as_const(lse))};
    p.target = run.at(std::as_const(target));
    p.vocab = vocab;
    p.scale = scale;
    p.dz = {run.at(logits), {N}};  // in place: each element is read before it is written
    p.fold = out.program(run, lm_head);
    run.run(p, pass);

    Vec dz(z.size(), 0.0);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < vocab; j++)
            dz[(size_t)i * N + j] = (std::exp(z[(size_t)i * N + j] - lse[i]) - (j == target[i] ? 1.0 : 0.0)) * scale;
    expect_rounded("dlogits = (softmax - onehot) / BT", logits, dz, run.tol(0));
    out.check("dlogits", to_double(logits), z, lm_head, run.tol(0));
}

// dX GEMM: A = dz [M, N], B = W^T (the unfolded W is [K, N]); output [M, K], the LayerNorm output
// [M, K] and three column partials. Without the pass-through, the LayerNorm output is written over
// x (in place, as the trainer does).
template <class R>
void check_ln_backward_x(R& run, const Case& c) {
    const int M = c.M, K = c.K, N = c.N;
    Rng rng(16);
    const Residual x(rng, M, K);
    const FoldedLinear lin(rng, K, N);
    const std::vector<bf16> w = to_act<bf16>(lin.w);
    const std::vector<float> gamma = to_floats(lin.gamma), beta = to_floats(lin.beta);
    const std::vector<bf16> dz = random_act<bf16>(rng, (size_t)M * N), dres = random_act<bf16>(rng, (size_t)M * K);
    const std::vector<float> m1 = random_floats(rng, M, 0.1), m2 = random_floats(rng, M, 0.1);
    const HostGemm gemm{M, K, N, &dz, {N}, &w, {N, true}};
    const int tiles_m = n_tiles(M, run.template shape<LnBackwardX<>>(gemm).bm);
    const Vec acc = matmul(to_double(dz), lin.w, M, N, K, false, true), xv = to_double(x.x), dr = to_double(dres);
    for (const bool pass_through : {true, false}) {
        std::vector<bf16> dx = nan_filled<bf16>((size_t)M * K), x_in_place = x.x;
        std::vector<bf16> ln = pass_through ? nan_filled<bf16>((size_t)M * K) : std::vector<bf16>{};
        std::vector<float> bias_grad = partials(tiles_m, K, 1), dgamma = bias_grad, dbeta = bias_grad;
        LnBackwardX<> p;
        p.mu = {run.at(x.mu)}, p.rstd = {run.at(x.rstd)}, p.m1 = {run.at(m1)}, p.m2 = {run.at(m2)};
        p.gamma = {run.at(gamma)}, p.beta = {run.at(beta)};
        if (pass_through) {
            p.x = {run.at(x.x), {K}}, p.ln_out = {run.at(ln), {K}};
            p.dres = {run.at(dres), {K}};
        } else {
            p.x = {run.at(std::as_const(x_in_place)), {K}}, p.ln_out = {run.at(x_in_place), {K}};
        }
        p.dx_out = {run.at(dx), {K}};
        p.bias_grad = {run.at(bias_grad)}, p.dgamma = {run.at(dgamma)}, p.dbeta = {run.at(dbeta)};
        run.run(p, gemm);

        Vec ref(acc.size()), ln_ref(acc.size()), db(K, 0.0), db_mag(K, 0.0), dg(K, 0.0), dg_mag(K, 0.0),
            dbt(K, 0.0), dbt_mag(K, 0.0);
        for (int i = 0; i < M; i++)
            for (int k = 0; k < K; k++) {
                const size_t ik = (size_t)i * K + k;
                const double r = x.stats.rstd[i], xhat = (xv[ik] - x.stats.mu[i]) * r;
                ln_ref[ik] = xhat * lin.gamma[k] + lin.beta[k];
                ref[ik] = r * (lin.gamma[k] * acc[ik] - m1[i] - xhat * m2[i]) + (pass_through ? dr[ik] : 0.0);
                db[k] += ref[ik], db_mag[k] += std::fabs(ref[ik]);
                dg[k] += xhat * acc[ik], dg_mag[k] += std::fabs(xhat * acc[ik]);
                dbt[k] += acc[ik], dbt_mag[k] += std::fabs(acc[ik]);
            }
        const std::string tag = pass_through ? " + dres" : ", LN(x) in place";
        expect_rounded("dx = r (gamma acc - m1 - xhat m2)" + tag, dx, ref, run.tol(N));
        expect_rounded(pass_through ? "LN(x) = xhat gamma + beta" : "LN(x) = xhat gamma + beta, over x",
                       pass_through ? ln : x_in_place, ln_ref, run.tol(0));
        expect_sum("bias grad = sum_i dx" + tag, col_sums(bias_grad, K, tiles_m), db, db_mag, run.tol(N));
        expect_sum("dgamma = sum_i xhat acc" + tag, col_sums(dgamma, K, tiles_m), dg, dg_mag, run.tol(N));
        expect_sum("dbeta = sum_i acc" + tag, col_sums(dbeta, K, tiles_m), dbt, dbt_mag, run.tol(N));
    }
}

// The plain GEMMs, every operand layout: out = A B stored (bf16), and dW += A B accumulated (fp32).
template <class R>
void check_plain(R& run, const Case& c) {
    const int M = c.M, K = c.K, N = c.N;
    Rng rng(21);
    const std::vector<bf16> a = random_act<bf16>(rng, (size_t)M * K), b = random_act<bf16>(rng, (size_t)K * N, 1 / std::sqrt(K));
    const Vec a64 = to_double(a), b64 = to_double(b), ref = matmul(a64, b64, M, K, N);
    const std::vector<bf16> a_t = to_act<bf16>(transpose(a64, M, K)), b_t = to_act<bf16>(transpose(b64, K, N));
    const std::vector<float> dw_before = random_floats(rng, (size_t)M * N, 0.1);
    for (int layout = 0; layout < 4; layout++) {
        const bool at = layout & 1, bt = layout & 2;
        const std::string name = std::string(at ? "A^T " : "A ") + (bt ? "B^T" : "B");
        const HostGemm gemm{M, N, K, at ? &a_t : &a, {at ? M : K, at}, bt ? &b_t : &b, {bt ? K : N, bt}};
        std::vector<bf16> out = nan_filled<bf16>((size_t)M * N);
        PlainStore<> store;
        store.out = {run.at(out), {N}};
        run.run(store, gemm);
        expect_rounded("out = " + name, out, ref, run.tol(K));

        std::vector<float> dw = dw_before;
        PlainAccumulate accumulate;
        accumulate.dw = {run.at(dw), {N}};
        run.run(accumulate, gemm);
        Vec dw_ref = to_double(dw_before);
        for (size_t e = 0; e < dw_ref.size(); e++) dw_ref[e] += ref[e];
        expect_fp32("dw += " + name, to_double(dw), dw_ref, run.tol(K));
    }
}

}  // namespace codagpt::coda::check
