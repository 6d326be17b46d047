// The CODA epilogue primitives and the GPT-2 epilogue programs, run by the CPU emulator, against
// fp64 math written plainly (textbook LayerNorm, GEMM, GELU, backprop, as in
// ../shared/design/coda_gpt2_check.py). The per-program checks and their bounds are in
// coda_checks.hpp, shared with the GPU engine's tests.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "coda_checks.hpp"

using namespace codagpt;
using namespace codagpt::coda;
using namespace codagpt::coda::check;

namespace {

// Textbook LayerNorm backward: dx, dgamma, dbeta from da = dLoss/dLN(x).
struct LnGrads {
    Vec dx, dgamma, dbeta;
};
LnGrads ln_backward(const Vec& da, const Vec& x, const Stats& s, const Vec& gamma, int M, int C) {
    LnGrads g{Vec(x.size()), Vec(C, 0.0), Vec(C, 0.0)};
    for (int i = 0; i < M; i++) {
        double mean_dxh = 0, mean_dxh_xh = 0;
        for (int k = 0; k < C; k++) {
            const double xh = (x[(size_t)i * C + k] - s.mu[i]) * s.rstd[i], dxh = da[(size_t)i * C + k] * gamma[k];
            mean_dxh += dxh / C;
            mean_dxh_xh += dxh * xh / C;
            g.dgamma[k] += da[(size_t)i * C + k] * xh;
            g.dbeta[k] += da[(size_t)i * C + k];
        }
        for (int k = 0; k < C; k++) {
            const double xh = (x[(size_t)i * C + k] - s.mu[i]) * s.rstd[i], dxh = da[(size_t)i * C + k] * gamma[k];
            g.dx[(size_t)i * C + k] = s.rstd[i] * (dxh - mean_dxh - xh * mean_dxh_xh);
        }
    }
    return g;
}

// ---------------------------------------------------------------- checks

// ||out - ref|| / ||ref||, for the chained layer.
void expect_norm(const std::string& what, const Vec& out, const Vec& ref, double bound) {
    ASSERT_EQ(out.size(), ref.size());
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); i++) {
        num += (out[i] - ref[i]) * (out[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    report(what, std::sqrt(num / den), bound);
}

// A plain GEMM through the emulator (attention stand-in, dY, dW_p, dW_o in the chained layer).
template <class T>
struct Store : NoRowPartials, NoColPartials {
    StoreTile<T> out;
    template <class E>
    void element(const E& e, Row&, Col&) const { out.store(e, e.acc); }
};
template <class T>
struct Accumulate : NoRowPartials, NoColPartials {
    AccumulateTile<T> out;
    template <class E>
    void element(const E& e, Row&, Col&) const { out.add(e, e.acc); }
};

// ---------------------------------------------------------------- primitives

TEST(Bf16, RoundsToNearestEven) {
    const float one_plus_half_ulp = 1.f + std::ldexp(1.f, -8), odd_plus_half_ulp = 1.f + 3 * std::ldexp(1.f, -8);
    EXPECT_EQ(to_bf16(1.f).bits, 0x3f80);
    EXPECT_EQ(to_bf16(one_plus_half_ulp).bits, 0x3f80);  // tie to the even 1.0
    EXPECT_EQ(to_float(to_bf16(odd_plus_half_ulp)), 1.f + std::ldexp(1.f, -6));
    EXPECT_EQ(to_bf16(-2.5f).bits, 0xc020);
    EXPECT_TRUE(std::isinf(to_float(to_bf16(3.4e38f))));  // rounds past the largest bf16
    EXPECT_TRUE(std::isnan(to_float(to_bf16(NAN))));
    Rng rng(1);
    for (int n = 0; n < 10000; n++) {
        const float x = (float)(rng.normal() * std::exp(10 * rng.normal()));
        ASSERT_LE(std::fabs(to_float(to_bf16(x)) - x), std::ldexp(std::fabs(x), -8)) << x;  // half an ulp
    }
}

TEST(Gelu, ValueAndDerivativeMatchFp64) {
    double err = 0, err_grad = 0;
    for (double x = -12; x <= 12; x += 1.0 / 64) {
        err = std::max(err, std::fabs(gelu((float)x) - gelu64(x)) / std::max(1.0, std::fabs(x)));
        err_grad = std::max(err_grad, std::fabs(gelu_grad((float)x) - dgelu64(x)));
    }
    report("gelu(x) (relative to max(1, |x|))", err, 1e-6);
    report("gelu'(x) (absolute)", err_grad, 1e-6);
}

// Every reduction, fed in random pieces (some empty) combined in random order, equals one fp64 pass.
TEST(Reductions, AnySplitAndCombineOrderMatchesFp64) {
    Rng rng(2);
    const int n = 5000;
    const Vec x = to_double(random_floats(rng, n, 1.0, 3.0)), w = to_double(random_floats(rng, n));
    double sum = 0, dot = 0, mean = 0, m2 = 0, mx = -INFINITY, sum_abs = 0, dot_abs = 0;
    for (int k = 0; k < n; k++) sum += x[k], dot += x[k] * w[k], mean += x[k] / n, mx = std::max(mx, x[k]);
    for (int k = 0; k < n; k++) m2 += (x[k] - mean) * (x[k] - mean), sum_abs += std::fabs(x[k]), dot_abs += std::fabs(x[k] * w[k]);
    double sumexp = 0;
    for (int k = 0; k < n; k++) sumexp += std::exp(x[k] - mx);
    const double lse = mx + std::log(sumexp);

    for (int trial = 0; trial < 20; trial++) {
        // Pieces of random lengths (empty ones included), merged in a random order.
        std::vector<int> cuts{0, n};
        for (int c = 0; c < 1 + trial * 3; c++) cuts.push_back((int)rng.below(n + 1));
        std::sort(cuts.begin(), cuts.end());
        std::vector<Sum> sums, dots;
        std::vector<Welford> welfords;
        std::vector<MaxSumExp> lses;
        for (size_t p = 0; p + 1 < cuts.size(); p++) {
            Sum s, d;
            Welford wf;
            MaxSumExp l;
            for (int k = cuts[p]; k < cuts[p + 1]; k++) s.add((float)x[k]), d.add((float)x[k], (float)w[k]), wf.add((float)x[k]), l.add((float)x[k]);
            sums.push_back(s), dots.push_back(d), welfords.push_back(wf), lses.push_back(l);
        }
        std::vector<size_t> order(sums.size());
        for (size_t p = 0; p < order.size(); p++) order[p] = p;
        for (size_t p = order.size(); p > 1; p--) std::swap(order[p - 1], order[rng.below(p)]);
        Sum s, d;
        Welford wf;
        MaxSumExp l;
        for (const size_t q : order) s.combine(sums[q]), d.combine(dots[q]), wf.combine(welfords[q]), l.combine(lses[q]);
        ASSERT_EQ(wf.n, n);
        EXPECT_LE(std::fabs(s.s - sum) / sum_abs, kFp32Bound);
        EXPECT_LE(std::fabs(d.s - dot) / dot_abs, kFp32Bound);
        EXPECT_LE(std::fabs(wf.mean - mean) / std::fabs(mean), kFp32Bound);
        EXPECT_LE(std::fabs(wf.m2 - m2) / m2, kFp32Bound);
        EXPECT_LE(std::fabs(l.lse() - lse) / std::fabs(lse), kFp32Bound);
    }
    // Empty states are neutral, including max = -inf.
    Welford empty_w, one_w;
    one_w.add(2.f);
    one_w.combine(empty_w);
    empty_w.combine(one_w);
    EXPECT_EQ(empty_w.n, 1.f);
    EXPECT_EQ(empty_w.mean, 2.f);
    MaxSumExp empty_l, one_l;
    one_l.add(-3.f);
    empty_l.combine(one_l);
    one_l.combine(MaxSumExp{});
    EXPECT_EQ(empty_l.lse(), -3.f);
    EXPECT_EQ(one_l.lse(), -3.f);
}

// MaxSumExp::add_if counts exactly the elements it is told to, bit for bit as add() on those alone:
// skipped ones change nothing, whatever they hold (-inf, NaN, a new maximum) and wherever they come
// (before the first counted element too, while max is still -inf).
TEST(Reductions, MaxSumExpAddIfSkipsWhatItIsTold) {
    Rng rng(7);
    const std::vector<float> x = random_floats(rng, 300, 4.0, 0.0);
    for (int trial = 0; trial < 4; trial++) {
        MaxSumExp masked, counted_only;
        for (size_t k = 0; k < x.size(); k++) {
            const bool counted = k >= 3 && (k * 7 + trial) % 5 != 0;
            const float v = counted ? x[k] : k % 3 == 0 ? -INFINITY : k % 3 == 1 ? NAN : 100.f;
            masked.add_if(v, counted);
            if (counted) counted_only.add(v);
        }
        EXPECT_EQ(masked.max, counted_only.max);
        EXPECT_EQ(masked.sum, counted_only.sum);
        EXPECT_TRUE(std::isfinite(masked.lse()));
    }
    MaxSumExp none;
    none.add_if(NAN, false);
    none.add_if(5.f, false);
    EXPECT_EQ(none.max, -INFINITY);
    EXPECT_EQ(none.sum, 0.f);
}

// The GEMM of the emulator in every operand layout, edge tiles included: elements outside M x N
// (the padding of a wider leading dimension) are never written.
TEST(Emulator, OperandLayoutsAndEdgeTiles) {
    const int M = 37, K = 40, N = 72, ld_out = N + 5;
    Rng rng(3);
    const std::vector<bf16> a = random_act<bf16>(rng, (size_t)M * K), b = random_act<bf16>(rng, (size_t)K * N);
    const Vec a64 = to_double(a), b64 = to_double(b);
    const std::vector<bf16> a_t = to_act<bf16>(transpose(a64, M, K)), b_t = to_act<bf16>(transpose(b64, K, N));
    const Vec ref = matmul(a64, b64, M, K, N);
    for (const TileShape shape : {TileShape{32, 32}, TileShape{64, 96}, TileShape{16, 8, {2, 1}, {1, 1}}})
        for (int layout = 0; layout < 4; layout++) {
            const bool at = layout & 1, bt = layout & 2;
            std::vector<float> out = nan_filled<float>((size_t)M * ld_out);
            Store<float> p;
            p.out = {out.data(), {ld_out}};
            emulate_gemm(p, M, N, K, Operand<bf16>{at ? a_t.data() : a.data(), {at ? M : K, at}},
                         Operand<bf16>{bt ? b_t.data() : b.data(), {bt ? K : N, bt}}, shape);
            Vec got((size_t)M * N);
            for (int i = 0; i < M; i++)
                for (int j = 0; j < ld_out; j++) {
                    if (j < N) got[(size_t)i * N + j] = out[(size_t)i * ld_out + j];
                    else ASSERT_TRUE(std::isnan(out[(size_t)i * ld_out + j])) << "wrote outside N at " << i << "," << j;
                }
            expect_fp32("GEMM " + std::string(at ? "A^T " : "A ") + (bt ? "B^T " : "B ") + std::to_string(shape.bm) +
                            "x" + std::to_string(shape.bn),
                        got, ref);
        }
}

// Each element primitive and partials buffer once, in one probe program:
//   y = r_i * acc + b_j - u_i * w_j + t_ij        (row scale, column add, rank-1, load-and-add a transposed tile)
//   out = bf16(y) ; acc_out (+)= y (transposed) ; picked_i = y at column target_i
//   row partials: sum_j out, sum_j out * w_j ; column partials: sum_i out, sum_i u_i * out
struct Probe {
    RowVec r, u;
    ColVec b, w;
    LoadTile<bf16> t;
    StoreTile<bf16> out;
    AccumulateTile<float> acc_out;
    Gather picked;
    RowPartials<Sum> row_sum, row_dot;
    ColPartials<Sum> col_sum, col_weighted;

    struct Row {
        Sum sum, dot;
        void combine(const Row& o) { sum.combine(o.sum), dot.combine(o.dot); }
    };
    struct Col {
        Sum sum, weighted;
        void combine(const Col& o) { sum.combine(o.sum), weighted.combine(o.weighted); }
    };
    template <class E>
    void element(const E& e, Row& row, Col& col) const {
        const float y = r(e) * e.acc + b(e) - u(e) * w(e) + t(e);
        const float stored = out.store(e, y);
        acc_out.add(e, y);
        picked.take(e, y);
        row.sum.add(stored), row.dot.add(stored, w(e));
        col.sum.add(stored), col.weighted.add(u(e), stored);
    }
    void write_row(const Row& row, RowSlot s) const { row_sum.write(row.sum, s), row_dot.write(row.dot, s); }
    void write_col(const Col& col, ColSlot s) const { col_sum.write(col.sum, s), col_weighted.write(col.weighted, s); }
};

TEST(Primitives, EachThroughTheEmulator) {
    const int M = 37, K = 40, N = 72;
    const TileShape shape{32, 32};
    const int tiles_m = n_tiles(M, shape.bm), tiles_n = n_tiles(N, shape.bn);
    Rng rng(4);
    const std::vector<float> a = random_floats(rng, (size_t)M * K), bm = random_floats(rng, (size_t)K * N);
    std::vector<float> r = random_floats(rng, M, 0.5, 1.0), u = random_floats(rng, M), b = random_floats(rng, N),
                       w = random_floats(rng, N), acc_out = random_floats(rng, (size_t)N * M);
    const std::vector<bf16> t = random_act<bf16>(rng, (size_t)N * M);  // stored transposed, [N, M]
    std::vector<int> target(M);
    for (int& x : target) x = (int)rng.below(N);
    std::vector<bf16> out((size_t)M * N);
    std::vector<float> picked(M), row_sum((size_t)M * tiles_n), row_dot(row_sum.size()), col_sum((size_t)tiles_m * N),
        col_weighted(col_sum.size());
    const Vec acc_before = to_double(acc_out);

    Probe p;
    p.r = {r.data()}, p.u = {u.data()}, p.b = {b.data()}, p.w = {w.data()};
    p.t = {t.data(), {M, true}};
    p.out = {out.data(), {N}};
    p.acc_out = {acc_out.data(), {M, true}};
    p.picked = {target.data(), picked.data()};
    p.row_sum = {row_sum.data()}, p.row_dot = {row_dot.data()}, p.col_sum = {col_sum.data()}, p.col_weighted = {col_weighted.data()};
    emulate_gemm(p, M, N, K, Operand<float>{a.data(), {K}}, Operand<float>{bm.data(), {N}}, shape);

    const Vec acc = matmul(to_double(a), to_double(bm), M, K, N), stored = to_double(out);
    Vec y((size_t)M * N), acc_ref((size_t)N * M), picked_ref(M), rs(M, 0.0), rd(M, 0.0), rs_mag(M, 0.0), rd_mag(M, 0.0),
        cs(N, 0.0), cw(N, 0.0), cs_mag(N, 0.0), cw_mag(N, 0.0);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            const size_t ij = (size_t)i * N + j, ji = (size_t)j * M + i;
            y[ij] = (double)r[i] * acc[ij] + b[j] - (double)u[i] * w[j] + to_float(t[ji]);
            acc_ref[ji] = acc_before[ji] + y[ij];
            if (j == target[i]) picked_ref[i] = y[ij];
            rs[i] += stored[ij], rs_mag[i] += std::fabs(stored[ij]);
            rd[i] += stored[ij] * w[j], rd_mag[i] += std::fabs(stored[ij] * w[j]);
            cs[j] += stored[ij], cs_mag[j] += std::fabs(stored[ij]);
            cw[j] += u[i] * stored[ij], cw_mag[j] += std::fabs(u[i] * stored[ij]);
        }
    expect_rounded("stored y", out, y);
    expect_fp32("accumulated y (transposed)", to_double(acc_out), acc_ref);
    expect_fp32("gathered y", to_double(picked), picked_ref);
    expect_sum("row sums", row_sums(row_sum, M, tiles_n), rs, rs_mag);
    expect_sum("row dots with w", row_sums(row_dot, M, tiles_n), rd, rd_mag);
    expect_sum("column sums", col_sums(col_sum, N, tiles_m), cs, cs_mag);
    expect_sum("column sums weighted by u", col_sums(col_weighted, N, tiles_m), cw, cw_mag);
}

// ---------------------------------------------------------------- the programs, one GEMM each
// The checks live in coda_checks.hpp, shared with the GPU engine's tests.

std::string case_name(const testing::TestParamInfo<Case>& info) {
    const Case& c = info.param;
    return "M" + std::to_string(c.M) + "K" + std::to_string(c.K) + "N" + std::to_string(c.N) + "tile" +
           std::to_string(c.shape.bm) + "x" + std::to_string(c.shape.bn);
}

class Programs : public testing::TestWithParam<Case> {
  protected:
    EmulatorRunner run{GetParam().shape};
};

// What the GPU engine makes of a program when it runs element() only to learn what it reads
// (gemm_epilogue.cuh: PrefetchElement, PreloadElement): every read gives zeros, every write through
// the element does nothing. It counts the element's column-vector reads.
struct ReadOnlyElement {
    float acc = 0.f;
    int i, j;
    int* column_reads;
    template <class T, class L>
    T load(const T*, const L&) const { return T{}; }
    template <class T, class L>
    float store(T*, const L&, float) const { return 0.f; }
    void row_output(float*, float) const {}
    template <class T>
    T row_input(const T*) const { return T{}; }
    template <class T>
    T col_input(const T*) const {
        ++*column_reads;
        return T{};
    }
};

// The emulator, then each program once more over every element with a ReadOnlyElement: so a
// program that wrote anywhere but through its element (before e.row_output, Gather wrote its
// output directly: zeros would land in the picked logits) fails the check that follows, as would
// one reading more column vectors than the GPU engine keeps.
struct ReadOnlyAfterRunner : EmulatorRunner {
    template <class P>
    void run(const P& p, const HostGemm& g) {
        EmulatorRunner::run(p, g);
        for (int i = 0; i < g.M; i++)
            for (int j = 0; j < g.N; j++) {
                int column_reads = 0;
                typename P::Row row{};
                typename P::Col col{};
                p.element(ReadOnlyElement{0.f, i, j, &column_reads}, row, col);
                ASSERT_LE(column_reads, kMaxColumnVectors) << "column vectors read by one element()";
            }
    }
};
class ProgramsWriteOnlyThroughTheElement : public testing::TestWithParam<Case> {
  protected:
    ReadOnlyAfterRunner run{{GetParam().shape}};
};

TEST_P(Programs, QkvForward) { check_qkv_forward(run, GetParam()); }
TEST_P(Programs, FcForward) { check_fc_forward(run, GetParam()); }
TEST_P(Programs, ResidualForwardAndRowStats) { check_residual_forward(run, GetParam()); }
TEST_P(Programs, ResidualStats) { check_residual_stats(run, GetParam()); }
TEST_P(Programs, LmHeadForwardAndLoss) { check_lm_head_forward(run, GetParam()); }
TEST_P(Programs, GeluBackward) { check_gelu_backward(run, GetParam()); }
TEST_P(Programs, QkvGradient) { check_qkv_gradient(run, GetParam()); }
TEST_P(Programs, CrossEntropyGradient) { check_cross_entropy_gradient(run, GetParam()); }
TEST_P(Programs, LnBackwardX) { check_ln_backward_x(run, GetParam()); }
TEST_P(Programs, PlainStoreAndAccumulate) { check_plain(run, GetParam()); }

TEST_P(ProgramsWriteOnlyThroughTheElement, QkvForward) { check_qkv_forward(run, GetParam()); }
TEST_P(ProgramsWriteOnlyThroughTheElement, FcForward) { check_fc_forward(run, GetParam()); }
TEST_P(ProgramsWriteOnlyThroughTheElement, ResidualForwardAndRowStats) { check_residual_forward(run, GetParam()); }
TEST_P(ProgramsWriteOnlyThroughTheElement, ResidualStats) { check_residual_stats(run, GetParam()); }
TEST_P(ProgramsWriteOnlyThroughTheElement, LmHeadForwardAndLoss) { check_lm_head_forward(run, GetParam()); }
TEST_P(ProgramsWriteOnlyThroughTheElement, GeluBackward) { check_gelu_backward(run, GetParam()); }
TEST_P(ProgramsWriteOnlyThroughTheElement, QkvGradient) { check_qkv_gradient(run, GetParam()); }
TEST_P(ProgramsWriteOnlyThroughTheElement, CrossEntropyGradient) { check_cross_entropy_gradient(run, GetParam()); }
TEST_P(ProgramsWriteOnlyThroughTheElement, LnBackwardX) { check_ln_backward_x(run, GetParam()); }
TEST_P(ProgramsWriteOnlyThroughTheElement, PlainStoreAndAccumulate) { check_plain(run, GetParam()); }

INSTANTIATE_TEST_SUITE_P(Shapes, ProgramsWriteOnlyThroughTheElement, testing::Values(Case{37, 40, 72, {32, 32}}),
                         case_name);

INSTANTIATE_TEST_SUITE_P(Shapes, Programs,
                         testing::Values(Case{37, 40, 72, {32, 32}},
                                         Case{45, 96, 200, {64, 96, {8, 1}, {4, 4}}},
                                         Case{50, 1600, 1600, {128, 128}}),
                         case_name);

// The tile loads of one element() (a pass sizes its shared copy of the tiles by them): each
// program's LoadTiles, an optional one only where it is set.
TEST(Programs, CountTheirTileLoads) {
    const std::vector<bf16> tile(8);
    EXPECT_EQ(tile_loads(QkvGradient<>{}), 2);
    EXPECT_EQ(tile_loads(CrossEntropyGradient<>{}), 1);
    EXPECT_EQ(tile_loads(ResidualStats<>{}), 1);
    EXPECT_EQ(tile_loads(GeluBackward<>{}), 1);
    EXPECT_EQ(tile_loads(FcForward<>{}), 0);
    LnBackwardX<> ln_backward;
    EXPECT_EQ(tile_loads(ln_backward), 1) << "dres unset: x alone";
    ln_backward.dres = {tile.data(), {8}};
    EXPECT_EQ(tile_loads(ln_backward), 2) << "x and dres";
}

// ---------------------------------------------------------------- one layer, chained

// One GPT-2 layer, attention replaced by a fixed linear map y = qkv Att as in the spec, with a given
// gradient dx2 arriving at its output: the CODA forward and backward, every GEMM through the
// emulator and every partial through its finalize, against textbook forward and backprop in fp64.
struct Layer {
    int M, C, H;
    Vec x0, dx2, g1, b1, wqkv, bqkv, att, wo, bo, g2, b2, wfc, bfc, wp, bp;
    Layer(Rng& rng, int M_, int C_) : M(M_), C(C_), H(4 * C_) {
        auto vec = [&](size_t n, double scale, double offset = 0.0) { return to_double(random_floats(rng, n, scale, offset)); };
        x0 = to_double(random_act<bf16>(rng, (size_t)M * C, 1.0, 0.7)), dx2 = to_double(random_act<bf16>(rng, (size_t)M * C));
        g1 = vec(C, 0.1, 1.0), b1 = vec(C, 0.1), wqkv = vec((size_t)C * 3 * C, 1 / std::sqrt(C)), bqkv = vec(3 * C, 0.1);
        att = vec((size_t)3 * C * C, 1 / std::sqrt(3 * C)), wo = vec((size_t)C * C, 1 / std::sqrt(C)), bo = vec(C, 0.1);
        g2 = vec(C, 0.1, 1.0), b2 = vec(C, 0.1), wfc = vec((size_t)C * H, 1 / std::sqrt(C)), bfc = vec(H, 0.1);
        wp = vec((size_t)H * C, 1 / std::sqrt(H)), bp = vec(C, 0.1);
    }
};
struct LayerResult {
    Vec x2, dx0, dwqkv, dbqkv, dg1, db1, dwo, dbo, dg2, db2, dwfc, dbfc, dwp;
};

Vec col_sum64(const Vec& a, int M, int N) {
    Vec s(N, 0.0);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) s[j] += a[(size_t)i * N + j];
    return s;
}
Vec add_bias(Vec a, const Vec& b) {
    for (size_t e = 0; e < a.size(); e++) a[e] += b[e % b.size()];
    return a;
}
Vec add(Vec a, const Vec& b) {
    for (size_t e = 0; e < a.size(); e++) a[e] += b[e];
    return a;
}

LayerResult textbook_layer(const Layer& L) {
    const int M = L.M, C = L.C, H = L.H;
    LayerResult r;
    const Stats s1 = ln_stats(L.x0, M, C);
    const Vec a1 = layernorm(L.x0, s1, L.g1, L.b1, M, C), qkv = add_bias(matmul(a1, L.wqkv, M, C, 3 * C), L.bqkv);
    const Vec y = matmul(qkv, L.att, M, 3 * C, C), x1 = add(add_bias(matmul(y, L.wo, M, C, C), L.bo), L.x0);
    const Stats s2 = ln_stats(x1, M, C);
    const Vec a2 = layernorm(x1, s2, L.g2, L.b2, M, C), f = add_bias(matmul(a2, L.wfc, M, C, H), L.bfc);
    Vec g(f.size()), df = matmul(L.dx2, L.wp, M, C, H, false, true);
    for (size_t e = 0; e < f.size(); e++) g[e] = gelu64(f[e]), df[e] *= dgelu64(f[e]);
    r.x2 = add(add_bias(matmul(g, L.wp, M, H, C), L.bp), x1);

    r.dwp = matmul(g, L.dx2, H, M, C, true);
    r.dwfc = matmul(a2, df, C, M, H, true), r.dbfc = col_sum64(df, M, H);
    const LnGrads ln2 = ln_backward(matmul(df, L.wfc, M, H, C, false, true), x1, s2, L.g2, M, C);
    const Vec dx1 = add(ln2.dx, L.dx2);
    r.dg2 = ln2.dgamma, r.db2 = ln2.dbeta;
    r.dwo = matmul(y, dx1, C, M, C, true), r.dbo = col_sum64(dx1, M, C);
    const Vec dqkv = matmul(matmul(dx1, L.wo, M, C, C, false, true), L.att, M, C, 3 * C, false, true);
    r.dwqkv = matmul(a1, dqkv, C, M, 3 * C, true), r.dbqkv = col_sum64(dqkv, M, 3 * C);
    const LnGrads ln1 = ln_backward(matmul(dqkv, L.wqkv, M, 3 * C, C, false, true), L.x0, s1, L.g1, M, C);
    r.dx0 = add(ln1.dx, dx1), r.dg1 = ln1.dgamma, r.db1 = ln1.dbeta;
    return r;
}

// W~ = diag(gamma) W as stored (the forward's B operand), c = column sums of that W~, b~ = beta W +
// b; the unfolded W as stored (the backward's) and c_bwd = column sums of diag(gamma) times it.
template <class Act>
struct Fold {
    std::vector<Act> w, w_unfolded;
    std::vector<float> c, c_bwd, b;
    Fold(const Vec& gamma, const Vec& beta, const Vec& W, const Vec& bias, int K, int N) {
        w_unfolded = to_act<Act>(W);
        const Vec wu = to_double(w_unfolded);
        Vec wf(W.size()), bt(bias), gw(W.size());
        for (int k = 0; k < K; k++)
            for (int j = 0; j < N; j++) {
                const size_t kj = (size_t)k * N + j;
                wf[kj] = gamma[k] * W[kj], bt[j] += beta[k] * W[kj], gw[kj] = gamma[k] * wu[kj];
            }
        w = to_act<Act>(wf), b = to_floats(bt), c = to_floats(col_sum64(to_double(w), K, N));
        c_bwd = to_floats(col_sum64(gw, K, N));
    }
};

// Buffers of one folded GEMM's backward: the dz-producer partials, then their finals.
template <class Act>
struct FoldBackward {
    int M, N, K;
    TileShape shape;
    std::vector<float> m1p, m2p, dbp, m1, m2, db;
    FoldBackward(int M_, int N_, int K_, const TileShape& s)
        : M(M_), N(N_), K(K_), shape(s), m1p((size_t)M * n_tiles(N, s.bn)), m2p(m1p.size()),
          dbp((size_t)n_tiles(M, s.bm) * N) {}
    FoldGradient<> producer(const Fold<Act>& fold) {
        FoldGradient<> p;
        p.c = {fold.c_bwd.data()}, p.b_folded = {fold.b.data()};
        p.m1 = {m1p.data()}, p.m2 = {m2p.data()}, p.db = {dbp.data()};
        return p;
    }
    void finalize() {  // the tiny reduction kernels between the producer and the dX / dW GEMMs
        m1 = to_floats(row_sums(m1p, M, n_tiles(N, shape.bn), 1.0 / K));
        m2 = to_floats(row_sums(m2p, M, n_tiles(N, shape.bn), 1.0 / K));
        db = to_floats(col_sums(dbp, N, n_tiles(M, shape.bm)));
    }
};

template <class Act>
LayerResult coda_layer(const Layer& L, const TileShape& shape) {
    const int M = L.M, C = L.C, H = L.H, C3 = 3 * C;
    auto op = [](const auto& v, long ld, bool transposed = false) {
        return Operand<typename std::decay_t<decltype(v)>::value_type>{v.data(), {ld, transposed}};
    };
    auto gemm_store = [&](int m, int n, int k, auto a, auto b) {
        std::vector<Act> out((size_t)m * n);
        Store<Act> p;
        p.out = {out.data(), {n}};
        emulate_gemm(p, m, n, k, a, b, shape);
        return out;
    };
    auto gemm_accumulate = [&](int m, int n, int k, auto a, auto b) {
        std::vector<float> out((size_t)m * n, 0.f);
        Accumulate<float> p;
        p.out = {out.data(), {n}};
        emulate_gemm(p, m, n, k, a, b, shape);
        return out;
    };
    const std::vector<Act> x0 = to_act<Act>(L.x0), att = to_act<Act>(L.att), wo = to_act<Act>(L.wo), wp = to_act<Act>(L.wp);
    const std::vector<float> bo = to_floats(L.bo), bp = to_floats(L.bp), g1 = to_floats(L.g1), b1 = to_floats(L.b1),
                             g2 = to_floats(L.g2), b2 = to_floats(L.b2);
    const Fold<Act> fq(L.g1, L.b1, L.wqkv, L.bqkv, C, C3), ff(L.g2, L.b2, L.wfc, L.bfc, C, H);
    LayerResult r;

    // ---- forward
    // x0's statistics come from the layer below's residual epilogue; here from fp64.
    const Stats s1 = ln_stats(L.x0, M, C);
    const std::vector<float> mu1 = to_floats(s1.mu), r1 = to_floats(s1.rstd);
    std::vector<Act> qkv((size_t)M * C3), x1((size_t)M * C), f((size_t)M * H), g(f.size()), x2(x1.size());
    {
        QkvForward<Act> p;
        p.ln = {{mu1.data()}, {r1.data()}, {fq.c.data()}, {fq.b.data()}};
        p.z = {qkv.data(), {C3}};
        emulate_gemm(p, M, C3, C, op(x0, C), op(fq.w, C3), shape);
    }
    const std::vector<Act> y = gemm_store(M, C, C3, op(qkv, C3), op(att, C));
    std::vector<float> mu2(M), r2(M), stats((size_t)M * n_tiles(C, shape.bn) * Welford::kWords);
    auto residual_forward = [&](const std::vector<Act>& a, int k, const std::vector<Act>& w, const std::vector<float>& bias,
                                const std::vector<Act>& residual, std::vector<Act>& out) {
        ResidualForward<Act> p;
        p.bias = {bias.data()}, p.residual = {residual.data(), {C}}, p.x_out = {out.data(), {C}}, p.row_stats = {stats.data()};
        emulate_gemm(p, M, C, k, op(a, k), op(w, C), shape);
    };
    residual_forward(y, C, wo, bo, x0, x1);
    for (int i = 0; i < M; i++) {
        const RowStats rs = finalize_row_stats(stats.data(), i, n_tiles(C, shape.bn));
        mu2[i] = rs.mu, r2[i] = rs.rstd;
    }
    {
        FcForward<Act> p;
        p.ln = {{mu2.data()}, {r2.data()}, {ff.c.data()}, {ff.b.data()}};
        p.f = {f.data(), {H}}, p.g = {g.data(), {H}};
        emulate_gemm(p, M, H, C, op(x1, C), op(ff.w, H), shape);
    }
    residual_forward(g, H, wp, bp, x1, x2);
    r.x2 = to_double(x2);

    // ---- backward
    const std::vector<Act> dres2 = to_act<Act>(L.dx2);
    FoldBackward<Act> fc_grad(M, H, C, shape), qkv_grad(M, C3, C, shape);
    std::vector<Act> df(f.size());
    {
        GeluBackward<Act> p;  // 1. dG
        p.f = {f.data(), {H}}, p.g = {g.data(), {H}}, p.df = {df.data(), {H}};
        p.fold = fc_grad.producer(ff);
        emulate_gemm(p, M, H, C, op(dres2, C), op(wp, C, true), shape);
        fc_grad.finalize();
    }
    r.dwp = to_double(gemm_accumulate(H, C, M, op(g, H, true), op(dres2, C)));  // 2. dW_p
    r.dbfc = to_double(fc_grad.db);
    // dX through a fold: dx, LN(x) for the dW GEMM after it (a plain GEMM), dgamma and dbeta
    auto ln_backward_x = [&](const std::vector<Act>& dz, const FoldBackward<Act>& fg, const Fold<Act>& fold,
                             const std::vector<Act>& x, const std::vector<float>& mu, const std::vector<float>& rstd,
                             const std::vector<float>& gamma, const std::vector<float>& beta, const std::vector<Act>& dres,
                             std::vector<Act>& ln, Vec& dgamma, Vec& dbeta, Vec* bias_grad) {
        const int N = fg.N, tiles_m = n_tiles(M, shape.bm);
        std::vector<Act> dx((size_t)M * C);
        std::vector<float> bgp((size_t)tiles_m * C), dgp(bgp.size()), dbp(bgp.size());
        LnBackwardX<Act> p;
        p.mu = {mu.data()}, p.rstd = {rstd.data()}, p.m1 = {fg.m1.data()}, p.m2 = {fg.m2.data()};
        p.gamma = {gamma.data()}, p.beta = {beta.data()};
        p.x = {x.data(), {C}}, p.dres = {dres.data(), {C}}, p.ln_out = {ln.data(), {C}}, p.dx_out = {dx.data(), {C}};
        p.bias_grad = {bgp.data()}, p.dgamma = {dgp.data()}, p.dbeta = {dbp.data()};
        emulate_gemm(p, M, C, N, op(dz, N), op(fold.w_unfolded, N, true), shape);
        if (bias_grad) *bias_grad = col_sums(bgp, C, tiles_m);
        dgamma = col_sums(dgp, C, tiles_m), dbeta = col_sums(dbp, C, tiles_m);
        return dx;
    };
    std::vector<Act> ln((size_t)M * C);
    const std::vector<Act> dres1 = ln_backward_x(df, fc_grad, ff, x1, mu2, r2, g2, b2, dres2, ln, r.dg2, r.db2, &r.dbo);  // 3. dX
    r.dwfc = to_double(gemm_accumulate(C, H, M, op(ln, C, true), op(df, H)));                  // 4. dW_fc
    const std::vector<Act> dy = gemm_store(M, C, C, op(dres1, C), op(wo, C, true));            // 5. dY
    r.dwo = to_double(gemm_accumulate(C, C, M, op(y, C, true), op(dres1, C)));                 // 6. dW_o
    const std::vector<Act> dqkv = gemm_store(M, C3, C, op(dy, C), op(att, C, true));           // 7. attention backward
    {
        QkvGradient<Act> p;  // 8. the dqkv pass
        p.dqkv = {dqkv.data(), {C3}}, p.qkv = {qkv.data(), {C3}};
        p.fold = qkv_grad.producer(fq);
        emulate_pass(p, M, C3, shape);
        qkv_grad.finalize();
    }
    r.dbqkv = to_double(qkv_grad.db);
    r.dx0 = to_double(ln_backward_x(dqkv, qkv_grad, fq, x0, mu1, r1, g1, b1, dres1, ln, r.dg1, r.db1, nullptr));  // 9. dX
    r.dwqkv = to_double(gemm_accumulate(C, C3, M, op(ln, C, true), op(dqkv, C3)));  // 10. dW_qkv
    return r;
}

void compare_layers(const LayerResult& got, const LayerResult& ref, double bound) {
    const std::pair<const char*, Vec LayerResult::*> fields[] = {
        {"x2", &LayerResult::x2},       {"dx0", &LayerResult::dx0},   {"dWqkv", &LayerResult::dwqkv},
        {"dbqkv", &LayerResult::dbqkv}, {"dgamma1", &LayerResult::dg1}, {"dbeta1", &LayerResult::db1},
        {"dWo", &LayerResult::dwo},     {"dbo", &LayerResult::dbo},   {"dgamma2", &LayerResult::dg2},
        {"dbeta2", &LayerResult::db2},  {"dWfc", &LayerResult::dwfc}, {"dbfc", &LayerResult::dbfc},
        {"dWp", &LayerResult::dwp}};
    for (const auto& [name, field] : fields) expect_norm(std::string(name) + " (||err|| / ||ref||)", got.*field, ref.*field, bound);
}

// With fp32 activations the composition must equal textbook backprop to fp32 precision: this
// checks the algebra of CODA_GPT2.md as coded. With bf16 activations (training), to bf16 precision.
TEST(Layer, CodaMatchesTextbookBackprop) {
    Rng rng(20);
    const Layer layer(rng, 37, 40);
    const LayerResult ref = textbook_layer(layer);
    for (const TileShape shape : {TileShape{32, 32}, TileShape{64, 96, {8, 1}, {4, 4}}}) {
        std::printf("  tiles %dx%d, fp32 activations\n", shape.bm, shape.bn);
        compare_layers(coda_layer<float>(layer, shape), ref, 1e-5);
        std::printf("  tiles %dx%d, bf16 activations\n", shape.bm, shape.bn);
        compare_layers(coda_layer<bf16>(layer, shape), ref, 2e-2);
    }
}

}  // namespace
