// The fused (CODA) schedule on the CPU, GPT2CodaCPU (every GEMM through the engine's emulator with
// its epilogue program, fp32 activations), against the CPU reference GPT2CPU<double> on gpt2-tiny
// (2 layers, C = 64, 4 heads, the real vocabulary 50257 padded to 50304), B = 2, T = 64, two
// micro-batches accumulated with grad_scale 1/2.
//
// Parameters: GPT-2 init, then LayerNorm gammas 1 + 0.1 N(0,1), LayerNorm betas and all biases
// 0.1 N(0,1) (init's ones and zeros would make the gamma, beta and bias terms of the fold vanish),
// and 0.7 added to wpe, so that the residual stream has a mean far from zero (|mean| / std ~ 20
// at the embedding): the case where the fold's r (acc - mu c) cancels and E[x^2] - mu^2 would fail.
//
// Bounds: fp32 computation against fp64 on the same fp32 parameters. Unit roundoff is 6e-8; sums
// run over up to 50304 terms (the LM head's dX GEMM), and the fold cancels mu c against acc,
// amplifying rounding by about |mu| / std. Each check also prints the error of GPT2CPU<float>, the
// unfused fp32 reference, as the yardstick of fp32 rounding on this problem: the bounds (loss 1e-5
// relative; logits 1e-5 and gradients 1e-4 in ||err|| / ||ref|| per tensor) sit an order of
// magnitude above both, while a missing or wrong term gives errors of 1e-3 and more.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "model_coda_cpu.hpp"
#include "model_cpu.hpp"
#include "model_test_util.hpp"
#include "ops_cpu.hpp"
#include "rng.hpp"
#include "row_chunks.hpp"

using namespace codagpt;
using codagpt::test::random_tokens;

namespace {

constexpr int kB = 2, kT = 64, kMicroBatches = 2;
constexpr double kLossBound = 1e-5, kLogitsBound = 1e-5, kGradBound = 1e-4;

ModelConfig gpt2_tiny() { return ModelConfig{}; }  // the defaults are gpt2-tiny (configs/gpt2-tiny.json)

// What one training step computes: the loss and logits of each micro-batch, the accumulated gradients.
struct StepResult {
    std::vector<double> losses;
    std::vector<std::vector<double>> logits;
    std::vector<double> grads;
};

template <class Model>
StepResult run_step(Model& model, const ModelConfig& m) {
    StepResult r;
    const size_t n_logits = (size_t)kB * kT * m.padded_vocab();
    model.zero_grad();
    for (int step = 0; step < kMicroBatches; step++) {
        const std::vector<int> inputs = random_tokens(kB * kT, m.vocab_size, 100 + step),
                               targets = random_tokens(kB * kT, m.vocab_size, 200 + step);
        r.losses.push_back(model.forward(inputs.data(), targets.data(), kB, kT));
        r.logits.emplace_back(model.logits(), model.logits() + n_logits);
        model.backward(1.f / kMicroBatches);
    }
    r.grads.assign(model.grads.begin(), model.grads.end());
    return r;
}

template <class F>
StepResult reference_step() {
    const ModelConfig m = gpt2_tiny();
    const std::vector<float> params = test::nonzero_mean_params(m);
    GPT2CPU<F> model(m);
    std::copy(params.begin(), params.end(), model.params.begin());
    return run_step(model, m);
}
const StepResult& fp64_reference() {
    static const StepResult r = reference_step<double>();
    return r;
}
const StepResult& fp32_reference() {
    static const StepResult r = reference_step<float>();
    return r;
}

StepResult coda_step(const coda::TileShape& shape) {
    const ModelConfig m = gpt2_tiny();
    GPT2CodaCPU model(m, shape);
    model.set_params(test::nonzero_mean_params(m));
    return run_step(model, m);
}

// ||a[from, from + n) - b[...]|| / ||b[...]||
double relative_error(const std::vector<double>& a, const std::vector<double>& b, size_t from, size_t n) {
    double diff = 0, norm = 0;
    for (size_t i = from; i < from + n; i++) {
        diff += (a[i] - b[i]) * (a[i] - b[i]);
        norm += b[i] * b[i];
    }
    return std::sqrt(diff / norm);
}

// Checks `got` against the fp64 reference; prints the fp32 reference's error beside it.
void expect_matches_reference(const StepResult& got) {
    const StepResult &ref = fp64_reference(), &ref32 = fp32_reference();
    auto check = [](const std::string& what, double err, double err32, double bound) {
        std::printf("    %-28s error %.2e  (fp32 reference %.2e)  bound %.0e\n", what.c_str(), err, err32, bound);
        EXPECT_LE(err, bound) << what;  // NaN fails too
    };
    for (int s = 0; s < kMicroBatches; s++) {
        const std::string batch = "micro-batch " + std::to_string(s) + ": ";
        check(batch + "loss", std::fabs(got.losses[s] / ref.losses[s] - 1), std::fabs(ref32.losses[s] / ref.losses[s] - 1),
              kLossBound);
        const size_t n = ref.logits[s].size();
        check(batch + "logits", relative_error(got.logits[s], ref.logits[s], 0, n),
              relative_error(ref32.logits[s], ref.logits[s], 0, n), kLogitsBound);
    }
    size_t offset = 0;
    for (const ParamInfo& t : param_layout(gpt2_tiny())) {
        check("d" + t.name, relative_error(got.grads, ref.grads, offset, t.size),
              relative_error(ref32.grads, ref.grads, offset, t.size), kGradBound);
        offset += t.size;
    }
}

// The emulator's default tile (128 x 128, Hopper's accumulator lanes), and one with edge tiles in
// every dimension (64 = 1 * 48 + 16, 50304 = 628 * 80 + 64) and other lane splits.
const coda::TileShape kDefaultTiles{}, kOddTiles{48, 80, {8, 1}, {4, 4}};

}  // namespace

// The premise of the test: the embedding output (layer 0's residual) has |mean| >> std per row.
TEST(CodaCPU, ResidualStreamHasNonZeroMean) {
    const ModelConfig m = gpt2_tiny();
    std::vector<float> params = test::nonzero_mean_params(m);
    const GPT2Params<float> pv = param_views(params.data(), m);
    const std::vector<int> inputs = random_tokens(kB * kT, m.vocab_size, 100);
    std::vector<float> x((size_t)kB * kT * m.n_embd);
    cpu::encoder_forward(x.data(), inputs.data(), pv.wte, pv.wpe, kB, kT, m.n_embd);
    double min_ratio = INFINITY;
    for (int i = 0; i < kB * kT; i++) {
        double mean = 0, var = 0;
        for (int k = 0; k < m.n_embd; k++) mean += x[(size_t)i * m.n_embd + k] / m.n_embd;
        for (int k = 0; k < m.n_embd; k++) var += std::pow(x[(size_t)i * m.n_embd + k] - mean, 2) / m.n_embd;
        min_ratio = std::min(min_ratio, std::fabs(mean) / std::sqrt(var));
    }
    std::printf("    smallest |mean| / std of an embedding row: %.1f\n", min_ratio);
    EXPECT_GT(min_ratio, 10.0);
}

TEST(CodaCPU, MatchesReferenceWithDefaultTiles) { expect_matches_reference(coda_step(kDefaultTiles)); }

TEST(CodaCPU, MatchesReferenceWithOddTiles) { expect_matches_reference(coda_step(kOddTiles)); }

// Tile shape and lane split change only the order of fp32 sums: the two runs agree to rounding.
// Each is ~5e-6 from fp64 (see above), so two independent roundings differ by up to ~1e-5: the
// bound is 2e-5, five times tighter than the bound against the reference.
TEST(CodaCPU, TileShapeChangesOnlyRounding) {
    const StepResult a = coda_step(kDefaultTiles), b = coda_step(kOddTiles);
    double worst = 0;
    std::string worst_name;
    size_t offset = 0;
    for (const ParamInfo& t : param_layout(gpt2_tiny())) {
        const double err = relative_error(a.grads, b.grads, offset, t.size);
        if (!(err <= worst)) worst = err, worst_name = t.name;
        offset += t.size;
    }
    for (int s = 0; s < kMicroBatches; s++) EXPECT_NEAR(a.losses[s], b.losses[s], 1e-6 * b.losses[s]);
    std::printf("    worst gradient difference between tile shapes: %.2e (d%s)  bound 2e-5\n", worst, worst_name.c_str());
    EXPECT_LE(worst, 2e-5);
}

// ---------------------------------------------------------------- the LM head's row chunks
// fewest_row_chunks (row_chunks.hpp), which cuts the fused GPU model's LM head rows.

// Every cut it returns covers the rows in order in as few chunks as the cap allows, each chunk
// within the cap and a multiple of the alignment but the last, on random sizes and random costs.
TEST(RowChunks, CoverTheRowsInTheFewestChunks) {
    Rng rng(7);
    for (int trial = 0; trial < 300; trial++) {
        const int align = 1 + (int)rng.below(200), cap = align * (1 + (int)rng.below(6)) + (int)rng.below(align);
        const int total = 1 + (int)rng.below(40 * align);
        std::map<int, double> table;
        auto cost = [&](int rows) { return table.count(rows) ? table[rows] : table[rows] = 1 + 10 * rng.uniform(); };
        const std::vector<int> rows = fewest_row_chunks(total, align, cap, cost);
        const int blocks = (total + align - 1) / align, most = cap / align;
        EXPECT_EQ((int)rows.size(), (blocks + most - 1) / most) << "total " << total << " align " << align << " cap " << cap;
        int sum = 0;
        for (size_t i = 0; i < rows.size(); i++) {
            EXPECT_GE(rows[i], 1);
            EXPECT_LE(rows[i], cap);
            if (i + 1 < rows.size()) {
                EXPECT_EQ(rows[i] % align, 0) << "chunk " << i << " of " << rows.size();
            }
            sum += rows[i];
        }
        EXPECT_EQ(sum, total) << "align " << align << " cap " << cap;
    }
}

// Of the cuts into that many chunks, it returns a cheapest: against an enumeration of every cut of
// up to 12 blocks, with random costs (some equal, for ties).
TEST(RowChunks, CheapestOfTheFewestChunks) {
    Rng rng(11);
    for (int trial = 0; trial < 200; trial++) {
        const int align = 8, blocks = 1 + (int)rng.below(12), total = blocks * align - (int)rng.below(align);
        const int cap = align * (1 + (int)rng.below(blocks));
        std::map<int, double> table;
        auto cost = [&](int rows) { return table.count(rows) ? table[rows] : table[rows] = (double)rng.below(4); };
        const std::vector<int> rows = fewest_row_chunks(total, align, cap, cost);
        double got = 0;
        for (int r : rows) got += cost(r);
        // every cut: a chunk ends after block j where bit j - 1 of `mask` is set (and after the last)
        size_t fewest = SIZE_MAX;
        double least = 0;
        for (int mask = 0; mask < (1 << (blocks - 1)); mask++) {
            std::vector<int> cut;
            int begin = 0;
            bool fits = true;
            for (int j = 1; j <= blocks; j++) {
                if (j < blocks && !(mask >> (j - 1) & 1)) continue;
                const int end = std::min(j * align, total);
                cut.push_back(end - begin);
                fits = fits && end - begin <= cap;
                begin = end;
            }
            if (!fits) continue;
            double c = 0;
            for (int r : cut) c += cost(r);
            if (cut.size() < fewest || (cut.size() == fewest && c < least)) fewest = cut.size(), least = c;
        }
        EXPECT_EQ(rows.size(), fewest) << "total " << total << " cap " << cap;
        EXPECT_EQ(got, least) << "total " << total << " cap " << cap;
    }
}

// The case it exists for: the 350M LM head's 16384 rows, a 1024-wide dX GEMM in 128 x 128 tiles (8
// a row of tiles) on 132 SMs, chunks of at most 6336 rows (49 rows of tiles), each costing its rounds
// of tiles over the SMs. Three chunks at least; 1024 tiles take 8 rounds at least, and a cut into
// three takes 8 only with chunks of at most 49, 33 or 16 rows of tiles for 3, 2 or 1 rounds. The
// even cut, 3 x 5464 rows (43 rows of tiles, 344 tiles: 3 rounds each), takes 9.
TEST(RowChunks, FillRoundsOfTiles) {
    auto rounds = [](int rows) { return std::ceil((rows + 127) / 128 * 8 / 132.0); };
    const std::vector<int> rows = fewest_row_chunks(16384, 128, 6336, rounds);
    double total = 0;
    for (int r : rows) total += rounds(r);
    EXPECT_EQ(rows.size(), 3u);
    EXPECT_EQ(total, 8.0);
    EXPECT_EQ(3 * rounds(5464), 9.0);
}

TEST(RowChunks, RefusesEmptyRowsOrACapBelowTheAlignment) {
    auto one = [](int) { return 1.0; };
    EXPECT_THROW(fewest_row_chunks(0, 128, 4096, one), Error);
    EXPECT_THROW(fewest_row_chunks(100, 128, 64, one), Error);
    EXPECT_EQ(fewest_row_chunks(100, 128, 128, one), std::vector<int>{100});
}
