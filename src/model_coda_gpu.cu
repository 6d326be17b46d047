// The fused (CODA) GPT-2 schedule on the GPU, step by step as ../shared/design/CODA_GPT2.md
// numbers it (but for the backward's departure that model_coda_cpu.cpp's header describes: dz
// stored as is; each fold's dX GEMM, on the unfolded W, before its dW GEMM, a plain GEMM on the
// LayerNorm output the dX GEMM wrote)
// and as GPT2CodaCPU (model_coda_cpu.cpp) runs it through the emulator: each GEMM is one
// coda::gemm call with its epilogue program, each "tiny reduce" one finalize kernel of
// kernels/coda_kernels.cuh. The formulas live in kernels/coda_programs.cuh, not here.
//
// A .cu file because the GEMM engine is header-only templates, instantiated here once per program.
// Built without --use_fast_math: the epilogue programs' expf, logf and sqrtf round as the CPU
// emulator's do.
#include "model_coda_gpu.hpp"

#include <algorithm>
#include <string>

#include "adamw.cuh"
#include "attention.cuh"
#include "coda_kernels.cuh"
#include "coda_programs.cuh"
#include "encoder.cuh"
#include "gemm.cuh"
#include "gpu_training.hpp"
#include "matmul.cuh"
#include "row_chunks.hpp"

namespace codagpt {

using namespace coda;

namespace {

// The smallest tile any mainloop uses (gemm_sm80.cuh: 128 x 128; gemm_sm90.cuh: 128 or 256 a
// side): partials buffers are sized with it, so they hold every tile shape the engine picks.
constexpr int kMinTile = 128;

// Rows [begin, begin + count) of the M tokens: the LM head works a chunk of them at a time.
struct RowRange {
    int begin, count;
};

// The most rows a default LM head chunk takes: as many as the backward's scratch (8 M C, which the
// logits share) holds as logits, or where that is fewer, enough for three waves of 128 x 128 tiles
// of the chunk's dX GEMM ([rows, C] from K = Vp, its longest GEMM) on this GPU, the logits buffer
// then grown to hold them.
int lm_head_cap_rows(int M, int C, int Vp) {
    int device = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const long fit = 8L * M * C / Vp, waves = ceil_div(3L * sms * 128 * 128, C);
    return (int)std::min<long>(M, std::max(fit, waves));
}

// The LM head's row chunks, first to last. chunks > 0: that many equal chunks (multiples of 8 rows,
// as M is; the last takes the rest). chunks = 0: as few chunks of at most lm_head_cap_rows rows
// (multiples of 128 but the last) as there can be, cut where their dX GEMMs (LnBackwardX, [rows, C]
// from K = Vp) cost least in all by the engine's plan: where the tiles of the chunks fill the SMs'
// rounds best. Fewest first: a chunk's other GEMMs cost nearly as much for fewer rows (on the 1.5B
// step on an H100 a fifth chunk, 4 x 3840 + 1024 rows instead of 4 x 4096, took 0.74 ms off the dX
// GEMMs and put 0.81 ms on the LM head forward, cross-entropy and dW kernels). 350M on 132 SMs:
// 6272 + 5888 + 4224 rows, 8 rounds of ping-pong tiles in the dX GEMMs against 9 for 3 x ~5464.
std::vector<RowRange> lm_head_chunks(int M, int C, int Vp, int chunks) {
    if (chunks < 0) throw Error("fused GPU model: lm_head_chunks must be >= 0, got " + std::to_string(chunks));
    std::vector<int> rows;
    if (chunks > 0) {
        const int each = std::min(M, (ceil_div(M, chunks) + 7) / 8 * 8);
        for (int r = 0; r < M; r += each) rows.push_back(std::min(each, M - r));
    } else {
        rows = fewest_row_chunks(M, kMinTile, std::max(kMinTile, lm_head_cap_rows(M, C, Vp)), [&](int n) {
            return gemm_plan_cost<LnBackwardX<bf16>>(GemmProblem{n, C, Vp, {}, {}});
        });
    }
    std::vector<RowRange> out;
    for (int n : rows) out.push_back({out.empty() ? 0 : out.back().begin + out.back().count, n});
    return out;
}

// Operands: the logical matrix p [rows, ld] row-major, and the transpose of p [cols, ld] (element
// (r, c) at p[c*ld + r]): A = x^T of a dW GEMM, B = W^T of a dX GEMM, wte^T of the LM head.
DeviceOperand matrix(const bf16* p, int ld) { return {p, {ld}}; }
DeviceOperand transposed(const bf16* p, int ld) { return {p, {ld, true}}; }

// The vectors of a LayerNorm folded into its consuming GEMM (one layer's slice): c = column sums
// of W~ = diag(gamma) W (bf16, the forward's B operand, made into w_folded before the GEMM),
// c_bwd = column sums of diag(gamma) W (the backward's), b~ = beta W + b.
struct Fold {
    const float *c, *c_bwd, *b_folded;
};

}  // namespace

struct GPT2CodaGPU::Impl {
    ModelConfig cfg;
    int B, T, M;  // M = B*T tokens
    std::vector<RowRange> lm_chunks;  // the LM head's row chunks (lm_head_chunks)
    // --recompute mlp: layers [0, f_slots.r) keep no f (they share one buffer): backward recomputes
    // it by the fc GEMM
    LayerSlots f_slots;
    size_t n_params = 0;
    DeviceBuffers mem;  // declared before every pointer into it
    Attention attention;
    // The GEMMs with no epilogue work (dY and every dW: out = acc, dw += acc) run on cuBLASLt, as the
    // unfused path's do: fusion has nothing to add to them, and cuBLASLt picks its tile per shape
    // (in the 1.5B step dW_o took 0.12 ms on cuBLASLt's 128 x 160 tiles, 0.17 on our engine, whose
    // 128 x 128 tiles make 169 of its 1600 x 1600 output for 132 SMs; the three 35.7 ms against
    // 39.6). Every GEMM with an epilogue program runs on the CODA engine.
    Matmul matmul;
    cudaStream_t stream = nullptr;
    EncoderBuckets* buckets = nullptr;

    // parameters (flat, param_layout order): bf16 weights (all of them on every rank: the folds and
    // the LayerNorm gradients read them), fp32 gradients; the master weights and AdamW moments of
    // this rank's shard live in `state`.
    std::unique_ptr<TrainableParams> state;
    bf16* params;
    float* grads;
    GPT2Params<bf16> p;
    GPT2Params<float> g;    // gradients
    GPT2Params<float> v32;  // fp32 copies of the vector weights (LayerNorms, biases: what the epilogues
                            // and folds read as fp32 vectors), widened with every fold; matrices null

    // LayerNorms folded into their GEMMs: LN1 into qkv (W [C, 3C] a layer), LN2 into fc ([C, 4C]),
    // LN_f into the LM head (W = wte^T). Their vectors (c, c_bwd, b~: [L, 3C], [L, 4C], [Vp])
    // are refolded after every optimizer step; each W~ is made into the one buffer w_folded just
    // before the GEMM that reads it (sized for the largest, the LM head's, stored as wte is:
    // [Vp, C]). Keeping no layer's W~ saves 1,640 MiB on 1.5B (336 on 350M) for one more read of
    // the folded weights a step (the vectors' pass), and a W~ pass a forward, not a step.
    bf16* w_folded;
    float *qkv_c, *qkv_cb, *qkv_bf, *fc_c, *fc_cb, *fc_bf, *lm_c, *lm_cb, *lm_bf;

    // activations kept for backward. residual: x entering layer l, [L+1, M, C] (l = L: entering
    // LN_f); in backward each x (and x_mid) becomes its LayerNorm's output
    bf16 *residual, *qkv, *y, *x_mid, *f;             // [L+1, M, C], [L, M, 3C], [L, M, C] x2, [L or 1, M, 4C]
    float *mu, *rstd, *mu_mid, *rstd_mid, *att_lse;  // [L+1, M], [L+1, M], [L, M], [L, M], [L, B, NH, T]
    // scratch. g: gelu(f) in forward, re-emitted g then dqkv in backward. df: the fc fold's dz,
    // then dy in its place. logits: an LM head chunk's output [rows, Vp], then its dz in place.
    // The logits and g, df, dy share one buffer of 8 M C (or of the largest chunk's logits where
    // those are more): the logits live from an LM head GEMM to its dX GEMM (forward's end), when
    // none of the others is in use.
    bf16 *g_buf, *df, *logits, *dres, *dy;
    float *lse, *losses, *target_logit;
    std::vector<float> host_losses;  // of the last forward
    // epilogue partials and their finalized values
    float *stats_partials, *lse_partials;           // Welford [M, tiles(C), 3]; (max, sum-exp) [M, tiles(Vp), 2]
    float *m1_partials, *m2_partials, *db_partials;  // [M, tiles(Vp)]; [tiles(M), 4C] (the LM head has no bias)
    float *m1_, *m2_;                                // [M]
    float *bias_partials, *dgamma_partials, *dbeta_partials;  // [tiles(M), C]
    int *inputs, *targets;
    bool backward_ready = false;
    float grad_scale = 1.f;

    Impl(const ModelConfig& c, int B_, int T_, const GPUModelOptions& opt)
        : cfg(c),
          B(B_),
          T(T_),
          M(B_ * T_),
          f_slots(opt.fc_slots(c.n_layer)),
          attention(opt.prefer_cudnn, opt.deterministic_attention) {
        if (B < 1 || T < 1 || T > c.max_seq_len || M % 8 != 0)
            throw Error("fused GPU model: needs 1 <= seq_len <= max_seq_len and batch_size * seq_len a multiple of 8, got " +
                        std::to_string(B) + " x " + std::to_string(T));
        lm_chunks = lm_head_chunks(M, c.n_embd, c.padded_vocab(), opt.lm_head_chunks);
        // the largest chunk's rows size its logits and partials
        const size_t lm_rows = std::max_element(lm_chunks.begin(), lm_chunks.end(), [](RowRange a, RowRange b) {
                                   return a.count < b.count;
                               })->count;
        CUDA_CHECK(cudaStreamCreate(&stream));
        mem.hint = "try a smaller --batch_size (with --grad_accum to keep the tokens per step) or --recompute mlp";
        for (const ParamInfo& t : param_layout(c)) n_params += t.size;
        const size_t L = c.n_layer, C = c.n_embd, NH = c.n_head, Vp = c.padded_vocab(), MC = (size_t)M * C;
        const size_t tiles_m = n_tiles(M, kMinTile), tiles_c = n_tiles((int)C, kMinTile), tiles_v = n_tiles((int)Vp, kMinTile);

        state = std::make_unique<TrainableParams>(c, opt.data_parallel, stream,
                                                  [this](size_t bytes) { return (void*)mem.alloc<char>(bytes); });
        params = state->params();
        grads = state->grads();
        p = param_views(params, cfg);
        g = param_views(grads, cfg);
        for_each_param(v32, cfg, [&](const char*, float*& v, size_t size, bool matrix, Init) {
            v = matrix ? nullptr : mem.alloc<float>(size);  // AdamW decays exactly the matrices and embeddings
        });

        w_folded = mem.alloc<bf16>(std::max(4 * C, Vp) * C);
        qkv_c = mem.alloc<float>(L * 3 * C);
        qkv_cb = mem.alloc<float>(L * 3 * C);
        qkv_bf = mem.alloc<float>(L * 3 * C);
        fc_c = mem.alloc<float>(L * 4 * C);
        fc_cb = mem.alloc<float>(L * 4 * C);
        fc_bf = mem.alloc<float>(L * 4 * C);
        lm_c = mem.alloc<float>(Vp);
        lm_cb = mem.alloc<float>(Vp);
        lm_bf = mem.alloc<float>(Vp);

        residual = mem.alloc<bf16>((L + 1) * MC);
        qkv = mem.alloc<bf16>(L * 3 * MC);
        y = mem.alloc<bf16>(L * MC);
        x_mid = mem.alloc<bf16>(L * MC);
        f = mem.alloc<bf16>(f_slots.count(L) * 4 * MC);
        mu = mem.alloc<float>((L + 1) * M);
        rstd = mem.alloc<float>((L + 1) * M);
        mu_mid = mem.alloc<float>(L * M);
        rstd_mid = mem.alloc<float>(L * M);
        att_lse = mem.alloc<float>(L * B * NH * T);

        logits = mem.alloc<bf16>(std::max((size_t)lm_rows * Vp, 8 * MC));
        g_buf = logits;
        df = logits + 4 * MC;
        dy = df;  // df is read last by a layer's dW_fc GEMM (its step 4), dy written first by its dY GEMM (5)
        dres = mem.alloc<bf16>(MC);
        lse = mem.alloc<float>(M);
        losses = mem.alloc<float>(M);
        target_logit = mem.alloc<float>(M);

        stats_partials = mem.alloc<float>(M * tiles_c * Welford::kWords);
        lse_partials = mem.alloc<float>(lm_rows * tiles_v * MaxSumExp::kWords);
        // the dz producers' row partials: a layer's folds (M rows, 4C columns at most) or an LM head chunk's
        const size_t producer_partials = std::max((size_t)M * n_tiles(4 * (int)C, kMinTile), lm_rows * tiles_v);
        m1_partials = mem.alloc<float>(producer_partials);
        m2_partials = mem.alloc<float>(producer_partials);
        db_partials = mem.alloc<float>(tiles_m * 4 * C);
        m1_ = mem.alloc<float>(M);
        m2_ = mem.alloc<float>(M);
        bias_partials = mem.alloc<float>(tiles_m * C);
        dgamma_partials = mem.alloc<float>(tiles_m * C);
        dbeta_partials = mem.alloc<float>(tiles_m * C);
        inputs = mem.alloc<int>(M);
        targets = mem.alloc<int>(M);
        buckets = encoder_buckets_create(M);
        attention.reserve(B, T, (int)NH, (int)(C / NH));
    }

    ~Impl() {
        encoder_buckets_destroy(buckets);
        if (stream) cudaStreamDestroy(stream);
    }

    // The fp32 vector copies, then c, c_bwd, b~ of every fold, from the current bf16 weights (the
    // same on every rank): after set_params and every AdamW step.
    void fold() {
        const int L = cfg.n_layer, C = cfg.n_embd, Vp = cfg.padded_vocab();
        const bf16* src = params;
        for_each_param(v32, cfg, [&](const char*, float*& v, size_t size, bool, Init) {
            if (v) coda_widen(v, src, (long)size, stream);
            src += size;
        });
        coda_fold_layernorm(qkv_c, qkv_cb, qkv_bf, p.qkv_w, false, v32.ln1_w, v32.ln1_b, v32.qkv_b, C, 3 * C, L,
                            stream);
        coda_fold_layernorm(fc_c, fc_cb, fc_bf, p.fc_w, false, v32.ln2_w, v32.ln2_b, v32.fc_b, C, 4 * C, L, stream);
        coda_fold_layernorm(lm_c, lm_cb, lm_bf, p.wte, true, v32.lnf_w, v32.lnf_b, nullptr, C, Vp, 1, stream);
    }
    // W~ = diag(gamma) W of one folded GEMM (W [C, N], or W^T stored: the LM head's wte) into
    // w_folded, for the GEMM the caller runs next.
    const bf16* fold_weight(const bf16* w, bool transposed, const float* gamma, int N) {
        coda_fold_weight(w_folded, w, transposed, gamma, cfg.n_embd, N, stream);
        return w_folded;
    }
    bf16* f_of(int l) const { return f + f_slots.of(l) * 4 * M * cfg.n_embd; }
    Fold qkv_fold(int l) const {
        const size_t C = cfg.n_embd;
        return {qkv_c + l * 3 * C, qkv_cb + l * 3 * C, qkv_bf + l * 3 * C};
    }
    Fold fc_fold(int l) const {
        const size_t C = cfg.n_embd;
        return {fc_c + l * 4 * C, fc_cb + l * 4 * C, fc_bf + l * 4 * C};
    }

    // Runs a program on the engine; returns the tile shape it used, which the partials' finalize needs.
    template <class P>
    TileShape run(const P& program, const GemmProblem& prob) {
        const TileShape s = gemm_tile_shape<P>(prob);
        if (s.bm < kMinTile || s.bn < kMinTile)
            throw Error("fused GPU model: the GEMM engine chose a " + std::to_string(s.bm) + " x " +
                        std::to_string(s.bn) + " tile; partials are sized for tiles of at least " +
                        std::to_string(kMinTile));
        gemm(program, prob, stream);
        return s;
    }
    // A pass without a GEMM (acc = 0) over a rows x N output.
    template <class P>
    TileShape pass(const P& program, int N, int rows) { return run(program, GemmProblem{rows, N, 0, {}, {}}); }
    template <class P>
    TileShape pass(const P& program, int N) { return pass(program, N, M); }
    RowRange all_rows() const { return {0, M}; }

    // Row statistics of the M x C residual stream whose Welford partials the last run left.
    void finalize_stats(const TileShape& s, float* mu_out, float* rstd_out) {
        coda_row_stats(mu_out, rstd_out, stats_partials, M, n_tiles(cfg.n_embd, s.bn), stream);
    }

    // The dz-producer outputs of a fold with N outputs (FoldGradient) and their finalize; the
    // folded GEMM's bias gradient (null for the LM head, which has none: kBias = false) accumulates db.
    template <bool kBias = true>
    FoldGradient<kBias> producer(const Fold& fold) {
        FoldGradient<kBias> pr;
        pr.c = {fold.c_bwd}, pr.b_folded = {fold.b_folded};
        pr.m1 = {m1_partials}, pr.m2 = {m2_partials};
        if constexpr (kBias) pr.db = {db_partials};
        return pr;
    }
    void finalize_producer(const TileShape& s, int N, float* bias_grad, RowRange rows) {
        coda_fold_gradient_finalize(m1_ + rows.begin, m2_ + rows.begin, bias_grad, m1_partials, m2_partials,
                                    db_partials, rows.count, N, cfg.n_embd, n_tiles(N, s.bn), n_tiles(rows.count, s.bm),
                                    stream);
    }
    void finalize_producer(const TileShape& s, int N, float* bias_grad) { finalize_producer(s, N, bias_grad, all_rows()); }

    // The backward of a folded GEMM after its dz producer, on the rows `rows` (all, but for the LM
    // head's chunks); dz [rows, N] as the producer stored it, its first row the range's first:
    // the dX GEMM, A = dz, B = W^T (the unfolded weight; LnBackwardX): LayerNorm backward of x plus
    // the pass-through dres (null for LN_f) into dres, in place; the LayerNorm output written over
    // x (backward reads x no more), the operand of the fold's dW GEMM, which the caller runs next
    // on cuBLASLt; gamma, beta += their gradients from its column partials, and bias_grad, the bias
    // of the GEMM that produced x (null: the embedding did, which has no bias), += the column sums of dx.
    // x, mu_in and rstd_in are the whole [M, ...] arrays.
    void ln_backward_x(const bf16* dz, int N, DeviceOperand w_t, bf16* x, const float* mu_in, const float* rstd_in,
                       const float* gamma, const float* beta, bool pass_through, float* bias_grad, float* dgamma,
                       float* dbeta, RowRange rows) {
        const int C = cfg.n_embd;
        const size_t r = rows.begin;
        bf16* const x_rows = x + r * C;
        bf16* const dres_rows = dres + r * C;
        LnBackwardX<bf16> pr;
        pr.mu = {mu_in + r}, pr.rstd = {rstd_in + r}, pr.m1 = {m1_ + r}, pr.m2 = {m2_ + r};
        pr.gamma = {gamma}, pr.beta = {beta};
        pr.x = {x_rows, {C}}, pr.dres = {pass_through ? dres_rows : nullptr, {C}};
        pr.ln_out = {x_rows, {C}}, pr.dx_out = {dres_rows, {C}};
        pr.bias_grad = {bias_partials}, pr.dgamma = {dgamma_partials}, pr.dbeta = {dbeta_partials};
        const TileShape s = run(pr, GemmProblem{rows.count, C, N, matrix(dz, N), w_t});
        coda_ln_backward_finalize(bias_grad, dgamma, dbeta, bias_partials, dgamma_partials, dbeta_partials, C,
                                  n_tiles(rows.count, s.bm), stream);
    }

    // The LM head's backward on one row chunk, its dz made in place of the logits the forward just
    // wrote: the cross-entropy pass, dz = (softmax - onehot) * grad_scale / (B T), plus the
    // dz-producer partials of the LN_f fold; the dX GEMM, B = wte (W = wte^T): LN_f backward
    // (nothing passes through) -> the rows of dres, LN_f's output over x_L, the LN_f gamma and beta
    // gradients, and as its column sums of dres the last layer's fcproj bias gradient; the dW GEMM,
    // A = LN_f(x)^T, B = dz (cuBLASLt): tied embeddings, so it adds into the wte gradient (the
    // first chunk of a step's first backward writes it: TrainableParams::first_backward).
    void lm_head_backward(RowRange rows) {
        const int L = cfg.n_layer, C = cfg.n_embd, Vp = cfg.padded_vocab();
        const size_t MC = (size_t)M * C;
        bf16* const x_final = residual + L * MC;  // becomes LN_f's output
        {
            CrossEntropyGradient<bf16> pr;
            pr.logits = {logits, {Vp}};
            pr.lse = {lse + rows.begin};
            pr.target = targets + rows.begin;
            pr.vocab = cfg.vocab_size;
            pr.scale = grad_scale / M;
            pr.dz = {logits, {Vp}};
            pr.fold = producer<false>(Fold{lm_c, lm_cb, lm_bf});
            finalize_producer(pass(pr, Vp, rows.count), Vp, nullptr, rows);
        }
        ln_backward_x(logits, Vp, matrix(p.wte, C), x_final, mu + (size_t)L * M, rstd + (size_t)L * M, v32.lnf_w,
                      v32.lnf_b, false, layer_params(g, L - 1, C).fcproj_b, g.lnf_w, g.lnf_b, rows);
        const bool add = !state->first_backward() || rows.begin > 0;
        matmul.backward_nt_weight(g.wte, x_final + (size_t)rows.begin * C, logits, rows.count, C, Vp, add, stream);
    }

    double forward(const int* in_host, const int* tgt_host, bool backward_next, float scale) {
        const int L = cfg.n_layer, C = cfg.n_embd, NH = cfg.n_head, HS = C / NH, V = cfg.vocab_size;
        const int Vp = cfg.padded_vocab(), C3 = 3 * C, C4 = 4 * C;
        const size_t MC = (size_t)M * C;
        CUDA_CHECK(cudaMemcpyAsync(inputs, in_host, M * sizeof(int), cudaMemcpyHostToDevice, stream));
        CUDA_CHECK(cudaMemcpyAsync(targets, tgt_host, M * sizeof(int), cudaMemcpyHostToDevice, stream));

        // Embedding, and the row statistics of its output for layer 0's LN1: no GEMM produced it,
        // so a pass over the stored x writes the Welford partials (as GPT2CodaCPU).
        encoder_forward(residual, inputs, p.wte, p.wpe, B, T, C, stream);
        {
            ResidualStats<bf16> pr;
            pr.x = {residual, {C}}, pr.row_stats = {stats_partials};
            finalize_stats(pass(pr, C), mu, rstd);
        }

        for (int l = 0; l < L; l++) {
            const LayerParams<bf16> w = layer_params(p, l, C);
            const LayerParams<float> wv = layer_params(v32, l, C);
            const bf16* x = residual + l * MC;
            const float *mu_l = mu + (size_t)l * M, *rstd_l = rstd + (size_t)l * M;
            bf16 *qkv_l = qkv + l * 3 * MC, *y_l = y + l * MC, *x_mid_l = x_mid + l * MC, *f_l = f_of(l);
            float *mu_mid_l = mu_mid + (size_t)l * M, *rstd_mid_l = rstd_mid + (size_t)l * M;
            bf16* x_out = residual + (l + 1) * MC;
            const Fold qf = qkv_fold(l), ff = fc_fold(l);

            {  // 1. qkv GEMM, A = x, B = W~qkv (made now): z = r(acc - mu c) + b~
                QkvForward<bf16> pr;
                pr.ln = {{mu_l}, {rstd_l}, {qf.c}, {qf.b_folded}};
                pr.z = {qkv_l, {C3}};
                const bf16* w_folded_qkv = fold_weight(w.qkv_w, false, wv.ln1_w, C3);
                run(pr, GemmProblem{M, C3, C, matrix(x, C), matrix(w_folded_qkv, C3)});
            }
            // 2. attention (CODA leaves it alone)
            attention.forward(y_l, att_lse + (size_t)l * B * NH * T, qkv_l, B, T, NH, HS, stream);
            dump(l, {{"x", x, MC}, {"qkv", qkv_l, 3 * MC}, {"y", y_l, MC}}, stream);
            auto residual_gemm = [&](const bf16* a, int K, const bf16* weight, const float* bias, const bf16* res,
                                     bf16* out) {
                ResidualForward<bf16> pr;
                pr.bias = {bias}, pr.residual = {res, {C}}, pr.x_out = {out, {C}}, pr.row_stats = {stats_partials};
                return run(pr, GemmProblem{M, C, K, matrix(a, K), matrix(weight, C)});
            };
            // 3. proj GEMM, A = y, B = Wo: x' = acc + bo + x, row partials; 4. tiny reduce -> mu', r'
            finalize_stats(residual_gemm(y_l, C, w.proj_w, wv.proj_b, x, x_mid_l), mu_mid_l, rstd_mid_l);
            {  // 5. fc GEMM, A = x', B = W~fc (made now): f = r'(acc - mu' c) + b~ ; g = gelu(f)
                FcForward<bf16> pr;
                pr.ln = {{mu_mid_l}, {rstd_mid_l}, {ff.c}, {ff.b_folded}};
                pr.f = {f_l, {C4}}, pr.g = {g_buf, {C4}};
                const bf16* w_folded_fc = fold_weight(w.fc_w, false, wv.ln2_w, C4);
                run(pr, GemmProblem{M, C4, C, matrix(x_mid_l, C), matrix(w_folded_fc, C4)});
            }
            // 6. fcproj GEMM, A = g, B = Wp: x'' = acc + bp + x', row partials; 7. tiny reduce ->
            //    the statistics of the next layer's LN1 (or of LN_f)
            finalize_stats(residual_gemm(g_buf, C4, w.fcproj_w, wv.fcproj_b, x_mid_l, x_out), mu + (size_t)(l + 1) * M,
                           rstd + (size_t)(l + 1) * M);
        }

        // LM head GEMM with LN_f folded, A = x_L, B = W~e = (diag(gamma_f) wte^T, made now), a chunk
        // of rows at a time (lm_chunks): logits, (max, sum-exp) partials and the target logit; a
        // tiny reduce gives lse and the loss; before a backward, the chunk's LM head backward.
        grad_scale = scale;
        const bf16* w_folded_lm = fold_weight(p.wte, true, v32.lnf_w, Vp);
        for (const RowRange& rows : lm_chunks) {
            const int r = rows.begin;
            LmHeadForward<bf16> pr;
            pr.ln = {{mu + (size_t)L * M + r}, {rstd + (size_t)L * M + r}, {lm_c}, {lm_bf}};
            pr.logits = {logits, {Vp}};
            pr.vocab = V;
            pr.lse_partials = {lse_partials};
            pr.target_logit = {targets + r, target_logit + r};
            const bf16* x_rows = residual + L * MC + (size_t)r * C;
            const TileShape s = run(pr, GemmProblem{rows.count, Vp, C, matrix(x_rows, C), transposed(w_folded_lm, C)});
            coda_token_loss(lse + r, losses + r, lse_partials, target_logit + r, rows.count, n_tiles(Vp, s.bn), stream);
            if (backward_next) lm_head_backward(rows);
        }
        backward_ready = backward_next;

        // The embedding backward's token buckets are sorted on the host while the GPU runs the
        // forward queued above, instead of idling it at the start of the step (~1.3 ms on 16K tokens).
        if (backward_next) encoder_buckets_build(buckets, in_host, B, T, stream);
        return mean_device_loss(losses, M, stream, host_losses);
    }

    void backward() {
        if (!backward_ready) throw Error("fused GPU model: backward() needs a forward(..., backward_next = true) first");
        backward_ready = false;
        const int L = cfg.n_layer, C = cfg.n_embd, NH = cfg.n_head, HS = C / NH;
        const int C3 = 3 * C, C4 = 4 * C;
        const size_t MC = (size_t)M * C;
        // The LM head's backward ran in forward, a chunk at a time (lm_head_backward): dres is the
        // gradient of x_L, and the wte, LN_f and last fcproj bias gradients have their LM head parts.
        // The dW GEMMs write the weights' gradients in a step's first backward, then add to them.
        const bool add = !state->first_backward();
        for (int l = L - 1; l >= 0; l--) {
            const LayerParams<bf16> w = layer_params(p, l, C);
            const LayerParams<float> wv = layer_params(v32, l, C), lg = layer_params(g, l, C);
            bf16 *x = residual + l * MC, *x_mid_l = x_mid + l * MC;  // each becomes its LayerNorm's output
            const float *mu_l = mu + (size_t)l * M, *rstd_l = rstd + (size_t)l * M;
            const bf16 *qkv_l = qkv + l * 3 * MC, *y_l = y + l * MC, *f_l = f_of(l);
            const float *mu_mid_l = mu_mid + (size_t)l * M, *rstd_mid_l = rstd_mid + (size_t)l * M;
            const Fold qf = qkv_fold(l), ff = fc_fold(l);

            dump(l, {{"dout", dres, MC}}, stream);
            if (l < f_slots.r) {  // --recompute mlp: f again, by the fc GEMM of forward (step 5) without g
                FcPreactivation<bf16> pr;
                pr.ln = {{mu_mid_l}, {rstd_mid_l}, {ff.c}, {ff.b_folded}};
                pr.z = {f_of(l), {C4}};
                const bf16* w_folded_fc = fold_weight(w.fc_w, false, wv.ln2_w, C4);
                run(pr, GemmProblem{M, C4, C, matrix(x_mid_l, C), matrix(w_folded_fc, C4)});
            }
            {  // 1. dG GEMM, A = dres, B = Wp^T: df = acc gelu'(f), g = gelu(f) re-emitted, fc fold partials;
               //    the fc bias gradient is the producer's db
                GeluBackward<bf16> pr;
                pr.f = {f_l, {C4}}, pr.g = {g_buf, {C4}}, pr.df = {df, {C4}};
                pr.fold = producer(ff);
                finalize_producer(run(pr, GemmProblem{M, C4, C, matrix(dres, C), transposed(w.fcproj_w, C)}), C4,
                                  lg.fc_b);
            }
            // 2. dW_p GEMM, A = g^T, B = dres (cuBLASLt). (The fcproj bias gradient was taken from the
            //    column partials of the epilogue that produced dres: step 9 above, or the LM head dX GEMM.)
            matmul.backward_weight(lg.fcproj_w, g_buf, dres, M, C4, C, add, stream);
            // 3. dX GEMM, A = df, B = Wfc^T: LN2 backward + dres pass-through -> dres' (in place),
            //    LN2's output over x'; column partials -> proj bias, gamma2 and beta2 gradients
            ln_backward_x(df, C4, transposed(w.fc_w, C4), x_mid_l, mu_mid_l, rstd_mid_l, wv.ln2_w, wv.ln2_b, true,
                          lg.proj_b, lg.ln2_w, lg.ln2_b, all_rows());
            // 4. dW_fc GEMM, A = LN2(x')^T, B = df (cuBLASLt)
            matmul.backward_weight(lg.fc_w, x_mid_l, df, M, C, C4, add, stream);
            // 5. dY GEMM, A = dres', B = Wo^T -> dy (cuBLASLt)
            matmul.backward_input(dy, dres, w.proj_w, M, C, C, /*accumulate=*/false, stream);
            // 6. dW_o GEMM, A = y^T, B = dres' (cuBLASLt)
            matmul.backward_weight(lg.proj_w, y_l, dres, M, C, C, add, stream);
            // 7. attention backward -> dqkv (into g_buf: g was consumed by step 2)
            bf16* const dqkv = g_buf;
            attention.backward(dqkv, dy, qkv_l, y_l, att_lse + (size_t)l * B * NH * T, B, T, NH, HS, stream);
            dump(l, {{"dy", dy, MC}, {"dqkv", dqkv, 3 * MC}}, stream);
            {  // 8. the one small pass over dqkv, qkv: dz-producer partials of the qkv fold (no tile
               //    written: both GEMMs read dqkv); the qkv bias gradient is its db
                QkvGradient<bf16> pr;
                pr.dqkv = {dqkv, {C3}}, pr.qkv = {qkv_l, {C3}};
                pr.fold = producer(qf);
                finalize_producer(pass(pr, C3), C3, lg.qkv_b);
            }
            // 9. dX GEMM, A = dqkv, B = Wqkv^T: LN1 backward + dres' pass-through -> dres for the
            //    layer below (in place), LN1's output over x; column partials -> gamma1 and beta1
            //    gradients and that layer's fcproj bias gradient
            ln_backward_x(dqkv, C3, transposed(w.qkv_w, C3), x, mu_l, rstd_l, wv.ln1_w, wv.ln1_b, true,
                          l > 0 ? layer_params(g, l - 1, C).fcproj_b : nullptr, lg.ln1_w, lg.ln1_b, all_rows());
            // 10. dW_qkv GEMM, A = LN1(x)^T, B = dqkv (cuBLASLt)
            matmul.backward_weight(lg.qkv_w, x, dqkv, M, C, C3, add, stream);
            // Layer l's gradients are complete: its fcproj bias gradient came from step 9 of layer
            // l+1 (for the last layer, from the LM head dX GEMM), the rest from this iteration.
            state->layer_grads_done(l);
        }
        // Embedding backward: its own kernel, adding into the wte gradient beside the LM head's.
        encoder_backward(g.wte, g.wpe, dres, buckets, B, T, C, stream);
        state->layer_grads_done(-1);
    }
};

GPT2CodaGPU::GPT2CodaGPU(const ModelConfig& cfg, int B, int T, const GPUModelOptions& opt)
    : impl_(std::make_unique<Impl>(cfg, B, T, opt)) {
    num_params_ = impl_->n_params;
}
GPT2CodaGPU::~GPT2CodaGPU() = default;

void GPT2CodaGPU::set_params(const std::vector<float>& params) {
    impl_->state->set_params(params);
    impl_->fold();
    CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
}
std::vector<float> GPT2CodaGPU::master_params() const { return impl_->state->master_params(); }
std::vector<float> GPT2CodaGPU::grads() const { return impl_->state->local_grads(); }
GPT2GPU::OptimizerState GPT2CodaGPU::optimizer_state() const {
    return {impl_->state->m(), impl_->state->v(), impl_->state->step()};
}
void GPT2CodaGPU::set_optimizer_state(const std::vector<float>& m, const std::vector<float>& v, long t) {
    impl_->state->set_optimizer_state(m, v, t);
}

double GPT2CodaGPU::forward(const int* inputs, const int* targets, bool backward_next, float grad_scale) {
    return impl_->forward(inputs, targets, backward_next, grad_scale);
}
void GPT2CodaGPU::backward() { impl_->backward(); }
void GPT2CodaGPU::zero_grad() { impl_->state->zero_grad(); }
double GPT2CodaGPU::grad_norm() { return impl_->state->grad_norm(); }
void GPT2CodaGPU::apply_update(double lr, const TrainConfig& c) {
    impl_->state->apply_update(lr, c);  // every rank's shard, all-gathered: the folds read all weights
    impl_->fold();
    CUDA_CHECK(cudaStreamSynchronize(impl_->stream));
}
void GPT2CodaGPU::time_phases() { impl_->state->time_phases(); }
StepPhases GPT2CodaGPU::phases() const { return impl_->state->phases(); }

const std::vector<float>& GPT2CodaGPU::token_losses() const { return impl_->host_losses; }

std::vector<float> GPT2CodaGPU::logits() const {
    if (impl_->lm_chunks.size() > 1)
        throw Error("fused GPU model: logits() needs the LM head in one chunk (GPUModelOptions::lm_head_chunks = 1)");
    return download_bf16(impl_->logits, (size_t)impl_->M * impl_->cfg.padded_vocab(), impl_->stream);
}

const char* GPT2CodaGPU::attention_backend() const { return impl_->attention.backend(); }

std::vector<int> GPT2CodaGPU::lm_head_chunk_rows() const {
    std::vector<int> rows;
    for (const RowRange& r : impl_->lm_chunks) rows.push_back(r.count);
    return rows;
}

std::unique_ptr<GPT2GPUDecoder> GPT2CodaGPU::make_decoder() const {
    return std::make_unique<GPT2GPUDecoder>(impl_->cfg, impl_->params, impl_->stream);
}

}  // namespace codagpt
