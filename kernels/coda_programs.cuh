// The epilogue programs of the GPT-2 schedule (CODA_GPT2.md), forward and backward, and the tiny
// finalize functions that merge their partials. Each program is the one place its formula lives;
// the contract they follow is in epilogue.cuh. Notation: rows i are tokens (for the dW GEMM, rows
// k are input channels), columns j output features; r = rstd, b~ = b_folded.
// Activations are Act: bf16 in training; float lets tests check the algebra at fp32 precision.
// Vectors, partials and parameter gradients are fp32.
#pragma once
#include "epilogue.cuh"

namespace codagpt::coda {

constexpr float kLnEps = 1e-5f;

// LayerNorm folded into the consuming GEMM (A = raw residual x, B = W~ = diag(gamma) W):
// z = LN(x) W + b = r*(acc - mu*c) + b~, with c the column sums of the bf16 W~ and b~ = beta W + b.
struct LnFold {
    RowVec mu, rstd;
    ColVec c, b_folded;
    template <class E>
    CODA_HD float operator()(const E& e) const { return rstd(e) * (e.acc - mu(e) * c(e)) + b_folded(e); }
};

// The outputs a dz producer writes for the backward of a folded GEMM, from values already in
// registers. dz is the gradient of z as the producer stored it (or, for the qkv fold, as attention
// backward did): the A operand of the fold's dX GEMM and the B operand of its dW GEMM. Row
// partials m1 = sum_j dz c_j and m2 = sum_j dz (z - b~_j) (the 1/K of their means is applied by
// finalize_row_sum), column partials db = sum_i dz (the folded GEMM's bias gradient; none where
// it has no bias, kBias = false: the LM head). All three from the stored dz, the exact operand of
// both GEMMs: with c the column sums of diag(gamma) W (the GPU's W~ is rounded to bf16, so its
// forward c and this one differ), m1 and m2 are the projections of gamma*acc of the dX GEMM onto 1
// and xhat, up to the rounding of z.
template <bool kBias = true>
struct FoldGradient {
    ColVec c, b_folded;
    RowPartials<Sum> m1, m2;
    ColPartials<Sum> db;  // unused without kBias

    struct Row {
        Sum m1, m2;
        CODA_HD void combine(const Row& o) { m1.combine(o.m1); m2.combine(o.m2); }
    };
    struct BiasCol {
        Sum db;
        CODA_HD void combine(const BiasCol& o) { db.combine(o.db); }
    };
    // NoPartials: the engine then takes no column partials at all
    using Col = std::conditional_t<kBias, BiasCol, NoPartials>;
    // dz: the stored gradient of the stored pre-activation z at this element.
    template <class E>
    CODA_HD void element(const E& e, float dz, float z, Row& row, Col& col) const {
        row.m1.add(dz, c(e));
        row.m2.add(dz, z - b_folded(e));
        if constexpr (kBias) col.db.add(dz);
    }
    CODA_HD void write_row(const Row& row, RowSlot s) const { m1.write(row.m1, s); m2.write(row.m2, s); }
    CODA_HD void write_col(const Col& col, ColSlot s) const {
        if constexpr (kBias) db.write(col.db, s);
    }
};

// ================================================================ forward

// (1) qkv GEMM, A = x, B = W~qkv.
// z = r*(acc - mu*c) + b~
template <class Act = bf16>
struct QkvForward : NoRowPartials, NoColPartials {
    LnFold ln;
    StoreTile<Act> z;
    template <class E>
    CODA_HD void element(const E& e, Row&, Col&) const { z.store(e, ln(e)); }
};

// (2) fc GEMM, A = x', B = W~fc; dual output.
// f = r*(acc - mu*c) + b~ ; g = gelu(f)
// g is taken from the stored f, as GeluBackward recomputes it, so both passes see the same g.
template <class Act = bf16>
struct FcForward : NoRowPartials, NoColPartials {
    LnFold ln;
    StoreTile<Act> f, g;
    template <class E>
    CODA_HD void element(const E& e, Row&, Col&) const { g.store(e, gelu(f.store(e, ln(e)))); }
};

// (2') The fc GEMM again in backward (--recompute mlp, where forward kept no f): f alone, the same
// bits as (2) stored (same GEMM, same operands, the same rounding of the same formula).
// f = r*(acc - mu*c) + b~      (QkvForward's formula and program, on the fc fold)
template <class Act = bf16>
using FcPreactivation = QkvForward<Act>;

// (3) proj / fcproj GEMM, A = y (or g), B = Wo (or Wp).
// x' = acc + b + x ;  row partials of x': Welford (count, mean, M2) of the stored bf16 values
// x_out may alias residual (each element is read before it is written, by the same thread).
template <class Act = bf16>
struct ResidualForward : NoColPartials {
    // Faster on the 128 x 320 tile than on ping-pong 128 x 128 where its plain GEMM is not, where
    // K is long: the 1.5B fcproj forward (K = 6400) 25.34 -> 23.92 ms a traced step; the proj
    // forward (K = 1600) lost, 8.51 -> 8.74, and stays on ping-pong (kWideProgramMinKBlocks,
    // bench/NOTES_gemm_sm90.md, nineteenth and twentieth sessions).
    static constexpr bool kWideTile = true;
    // Its residual tile copied into shared memory a chunk at a time (on tiles of at most 128
    // accumulators a thread: ping-pong), where reading it two segments ahead left each segment
    // waiting for it: the proj forward 1.38-1.45x -> 1.31x its plain GEMM at 350M, 1.21x -> 1.09x
    // at 1.5B (bench_gemm on an H100, forty-fourth session); with no row vector and one column
    // vector, its epilogue leaves the ring 4 stages. GeluBackward's f copied the same way lost on
    // 3 stages (1.37x -> 1.51x at 1.5B) and was level on 4 (forty-fifth session: its epilogue is
    // bound by its instructions, not its loads). The 128 x 320 tile reads it a segment ahead.
    static constexpr int kTileCopies = 1, kRowVectors = 0, kColumnVectors = 1;
    // Its passes unrolled: the proj forward 3-5% faster at both sizes alone (an H100, forty-fifth
    // session), where every other program lost or spilled; with the whole-segment loop, 7.5% at
    // 350M and 2.3% at 1.5B (forty-sixth).
    static constexpr bool kUnrollPasses = true;
    ColVec bias;
    LoadTile<Act> residual;
    StoreTile<Act> x_out;
    RowPartials<Welford> row_stats;

    struct Row {
        Welford x;
        CODA_HD void combine(const Row& o) { x.combine(o.x); }
    };
    template <class E>
    CODA_HD void element(const E& e, Row& row, Col&) const {
        row.x.add(x_out.store(e, e.acc + bias(e) + residual(e)));
    }
    CODA_HD void write_row(const Row& row, RowSlot s) const { row_stats.write(row.x, s); }
};

// (3') The row statistics of a residual stream that no GEMM produced (the embedding output,
// which layer 0's LN1 reads): a pass with no GEMM (acc = 0) over the stored x.
// row partials of x: Welford (count, mean, M2), merged by finalize_row_stats like (3)'s
template <class Act = bf16>
struct ResidualStats : NoColPartials {
    static constexpr bool kPass = true;
    LoadTile<Act> x;
    RowPartials<Welford> row_stats;

    using Row = typename ResidualForward<Act>::Row;
    template <class E>
    CODA_HD void element(const E& e, Row& row, Col&) const { row.x.add(x(e)); }
    CODA_HD void write_row(const Row& row, RowSlot s) const { row_stats.write(row.x, s); }
};

// (4) LM head GEMM, A = x, B = W~e = diag(gamma_f) wte^T (no bias: b~ = beta_f wte^T).
// z = r*(acc - mu*c) + b~ ;  row partials (max, sum exp) of z over j < vocab ;  z_target = z[i, target_i]
// Statistics and target come from the stored logits, which the cross-entropy kernel turns into
// softmax - onehot: so its softmax sums to one. Padded columns (j >= vocab) are stored, not counted.
template <class Act = bf16>
struct LmHeadForward : NoColPartials {
    LnFold ln;
    StoreTile<Act> logits;
    int vocab = 0;
    RowPartials<MaxSumExp> lse_partials;
    Gather target_logit;

    struct Row {
        MaxSumExp z;
        CODA_HD void combine(const Row& o) { z.combine(o.z); }
    };
    template <class E>
    CODA_HD void element(const E& e, Row& row, Col&) const {
        const float z = logits.store(e, ln(e));
        row.z.add_if(z, e.j < vocab);
        target_logit.take(e, z);
    }
    CODA_HD void write_row(const Row& row, RowSlot s) const { lse_partials.write(row.z, s); }
};

// ================================================================ backward

// (4') The cross-entropy pass over the stored logits (no GEMM: acc = 0): dlogits, written in place
// of the logits, then the dz-producer outputs of the LN_f fold.
// dz = (exp(z - lse) - [j == target]) * scale for j < vocab, 0 on padded columns ;
// m1 += dz*c, m2 += dz*(z - b~), db += dz
// scale = 1/(B T) times the micro-batch's share of an accumulated gradient. dz may alias logits.
template <class Act = bf16>
struct CrossEntropyGradient {
    static constexpr bool kPass = true;
    LoadTile<Act> logits;
    RowVec lse;
    const int* target = nullptr;
    int vocab = 0;
    float scale = 0.f;
    StoreTile<Act> dz;
    FoldGradient<false> fold;  // of the LM head: LN_f's c, b~ (no bias)

    using Row = FoldGradient<false>::Row;
    using Col = FoldGradient<false>::Col;
    template <class E>
    CODA_HD void element(const E& e, Row& row, Col& col) const {
        const float z = logits(e), lse_i = lse(e);
        const float onehot = e.j == e.row_input(target) ? 1.f : 0.f;
        fold.element(e, dz.store(e, e.j < vocab ? (exp_fast(z - lse_i) - onehot) * scale : 0.f), z, row, col);
    }
    CODA_HD void write_row(const Row& row, RowSlot s) const { fold.write_row(row, s); }
    CODA_HD void write_col(const Col& col, ColSlot s) const { fold.write_col(col, s); }
};

// (5) dG GEMM, A = dres, B = Wp^T: GELU backward, then the dz-producer outputs of the fc fold.
// df = acc * gelu'(f) ; g = gelu(f) ; m1 += df*c, m2 += df*(f - b~), db += df
// g is re-emitted for the dW_p GEMM so the forward need not keep it. kBias = false leaves db out
// (the trainer always takes it; bench_gemm --ablate times what it costs).
template <class Act = bf16, bool kBias = true>
struct GeluBackward {
    LoadTile<Act> f;
    StoreTile<Act> g, df;
    FoldGradient<kBias> fold;  // of the fc GEMM: its c, b~

    using Row = typename FoldGradient<kBias>::Row;
    using Col = typename FoldGradient<kBias>::Col;
    template <class E>
    CODA_HD void element(const E& e, Row& row, Col& col) const {
        const float fv = f(e);
        const GeluValues gv = gelu_values(fv);
        g.store(e, gv.g);
        fold.element(e, df.store(e, e.acc * gv.grad), fv, row, col);
    }
    CODA_HD void write_row(const Row& row, RowSlot s) const { fold.write_row(row, s); }
    CODA_HD void write_col(const Col& col, ColSlot s) const { fold.write_col(col, s); }
};

// (5') The one elementwise pass after attention backward (no GEMM: the engine runs it with
// acc = 0): the dz-producer outputs of the qkv fold from dqkv and the stored qkv. It writes no
// tile: both GEMMs of the fold read dqkv itself.
// m1 += dqkv*c, m2 += dqkv*(qkv - b~), db += dqkv
template <class Act = bf16>
struct QkvGradient {
    static constexpr bool kPass = true;
    LoadTile<Act> dqkv, qkv;
    FoldGradient<> fold;  // of the qkv GEMM

    using Row = FoldGradient<>::Row;
    using Col = FoldGradient<>::Col;
    template <class E>
    CODA_HD void element(const E& e, Row& row, Col& col) const { fold.element(e, dqkv(e), qkv(e), row, col); }
    CODA_HD void write_row(const Row& row, RowSlot s) const { fold.write_row(row, s); }
    CODA_HD void write_col(const Col& col, ColSlot s) const { fold.write_col(col, s); }
};

// (6) dX GEMM through a fold, A = dz [M, N] (as its producer stored it), B = W^T (the unfolded
// weight, not W~): LayerNorm backward plus the residual gradient, the LayerNorm's gamma and beta
// gradients, and the LayerNorm output for the fold's dW GEMM, which runs after this one as a plain
// GEMM (dW += LN(x)^T dz, as on the unfused path). acc = dz W^T is the gradient of LN(x).
// xhat = (x - mu)*r ;  dx = r*(gamma*acc - m1 - xhat*m2) + dres ;  ln = xhat*gamma + beta
// column partials: sum_i dx, sum_i xhat*acc (dgamma), sum_i acc (dbeta)
// m1, m2 are the finalized means (finalize_row_sum with 1/K) of the dz producer, whose c is then
// the column sums of diag(gamma) W as this GEMM multiplies by it. The column sums of dx are the
// bias gradient of the GEMM that produced x (proj / fcproj). dres is null where no gradient passes
// through (the final LayerNorm). ln_out may alias x and dx_out dres (each element is read before it
// is written, by the same thread): backward needs x no more once its LayerNorm output is stored.
template <class Act = bf16>
struct LnBackwardX : NoRowPartials {
    // Three column partials beside the 128 x 320 tile's 160 accumulators: the 1.5B LM head's dX
    // (K = 50304, where the plan would pick that tile) took 6.63 ms a step there against 3.75 with
    // one partial (abb5321, bench/NOTES_gemm_sm90.md, twenty-sixth session); ping-pong instead.
    static constexpr bool kNoWideTile = true;
    // With both segment loops in its kernels ptxas spills (124 bytes on ping-pong 128 x 128, nvcc
    // 13.0); with either alone, none. It keeps the general one.
    static constexpr bool kNoWholeVariant = true;
    RowVec mu, rstd, m1, m2;
    ColVec gamma, beta;
    LoadTile<Act> x, dres;
    StoreTile<Act> ln_out, dx_out;
    ColPartials<Sum> bias_grad, dgamma, dbeta;

    struct Col {
        Sum dx, dgamma, dbeta;
        CODA_HD void combine(const Col& o) {
            dx.combine(o.dx);
            dgamma.combine(o.dgamma);
            dbeta.combine(o.dbeta);
        }
    };
    template <class E>
    CODA_HD void element(const E& e, Row&, Col& col) const {
        const float r = rstd(e), xhat = (x(e) - mu(e)) * r, gamma_j = gamma(e);
        const float dx = r * (gamma_j * e.acc - m1(e) - xhat * m2(e)) + (dres ? dres(e) : 0.f);
        ln_out.store(e, fmaf(xhat, gamma_j, beta(e)));
        dx_out.store(e, dx);
        col.dx.add(dx);
        col.dgamma.add(xhat, e.acc);
        col.dbeta.add(e.acc);
    }
    CODA_HD void write_col(const Col& col, ColSlot s) const {
        bias_grad.write(col.dx, s);
        dgamma.write(col.dgamma, s);
        dbeta.write(col.dbeta, s);
    }
};

// (7) The fold's dW GEMM, A = LN(x)^T (stored by its LnBackwardX), B = dz: a plain GEMM,
// dW += acc (PlainAccumulate below; cuBLASLt on the GPU, as the unfused path's).

// (8) Plain GEMMs of the backward: dY = dres' Wo^T (stored), and the weight gradients
// dW_o = y^T dres', dW_p = g^T dres and the folds' (7) (accumulated into the fp32 gradient).
// out = acc
template <class Act = bf16>
struct PlainStore : NoRowPartials, NoColPartials {
    static constexpr bool kPlainGemm = true;
    StoreTile<Act> out;
    template <class E>
    CODA_HD void element(const E& e, Row&, Col&) const { out.store(e, e.acc); }
};
// dw += acc
struct PlainAccumulate : NoRowPartials, NoColPartials {
    static constexpr bool kPlainGemm = true;
    AccumulateTile<float> dw;
    template <class E>
    CODA_HD void element(const E& e, Row&, Col&) const { dw.add(e, e.acc); }
};

// ================================================================ finalize
// Each takes a row's merged state; the host merges with merge_row, the GPU's finalize kernels
// with a group of lanes a row in the same order (coda_kernels.cu).

// LayerNorm statistics of a row from ResidualForward's Welford partials.
struct RowStats {
    float mu, rstd;
};
CODA_HD inline RowStats row_stats_of(const Welford& w) { return {w.mean, 1.f / sqrtf(w.m2 / w.n + kLnEps)}; }
CODA_HD inline RowStats finalize_row_stats(const float* partials, int i, int n_tiles) {
    return row_stats_of(merge_row<Welford>(partials, i, n_tiles));
}

// Cross-entropy of a row from LmHeadForward's partials: lse = log sum_j exp(z_ij), loss = lse - z_target.
struct TokenLoss {
    float lse, loss;
};
CODA_HD inline TokenLoss token_loss_of(const MaxSumExp& z, float target_logit) {
    const float lse = z.lse();
    return {lse, lse - target_logit};
}
CODA_HD inline TokenLoss finalize_loss(const float* partials, int i, int n_tiles, float target_logit) {
    return token_loss_of(merge_row<MaxSumExp>(partials, i, n_tiles), target_logit);
}

// scale * (sum over N-tiles of row i): m1, m2 with scale 1/K.
CODA_HD inline float row_sum_of(const Sum& s, float scale = 1.f) { return scale * s.s; }
CODA_HD inline float finalize_row_sum(const float* partials, int i, int n_tiles, float scale = 1.f) {
    return row_sum_of(merge_row<Sum>(partials, i, n_tiles), scale);
}
// Sum over M-tiles of column j (db, bias gradients, dgamma, dbeta).
CODA_HD inline float finalize_col_sum(const float* partials, int j, int n_tiles, int n) {
    return merge_col<Sum>(partials, j, n_tiles, n).s;
}

}  // namespace codagpt::coda
