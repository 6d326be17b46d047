// The unfused GPU model: forward and backward as a sequence of kernel launches, in the order of
// the CPU reference (src/model_cpu.cpp), one op per kernel. Host code only: the device code lives
// in kernels/, one file per kernel family.
#include "model_gpu.hpp"

#include <algorithm>
#include <cstdio>

#include "adamw.cuh"
#include "attention.cuh"
#include "bias.cuh"
#include "classifier.cuh"
#include "decode.cuh"
#include "encoder.cuh"
#include "gelu.cuh"
#include "gpu_training.hpp"
#include "layernorm.cuh"
#include "matmul.cuh"

namespace codagpt {

struct GPT2GPU::Impl {
    ModelConfig cfg;
    GPUModelOptions opt;
    int B, T;
    size_t n_params = 0;

    Matmul matmul;
    Attention attention;
    cudaStream_t stream = nullptr;
    EncoderBuckets* buckets = nullptr;

    // parameters, gradients, optimizer state (flat, param_layout order); the master weights are
    // read by the optimizer only, so a rank of a data-parallel job keeps just its shard of them
    DeviceBuffers mem;  // declared before every pointer into it
    std::unique_ptr<TrainableParams> state;
    bf16* params = nullptr;
    float* grads = nullptr;
    GPT2Params<bf16> p;
    GPT2Params<float> g;

    // activations kept for backward, stacked over layers
    bf16 *encoded, *ln1, *qkv, *atty, *residual2, *ln2, *fch, *fch_gelu, *residual3, *lnf, *logits;
    float *ln1_mean, *ln1_rstd, *lse, *ln2_mean, *ln2_rstd, *lnf_mean, *lnf_rstd, *losses;
    std::vector<float> host_losses;  // of the last forward
    // scratch: gradients flowing backward, GEMM outputs consumed at once, reduction partials
    bf16 *dresidual, *dbtc, *dbt4c, *dqkv, *btc;
    float* reduce_scratch;
    int *inputs, *targets;

    // What the model needs at this B x T and the largest batch_size that would fit (an estimate:
    // attention and cuBLASLt workspaces and the allocator's rounding come on top): the out-of-memory
    // message's advice. fixed: weights, gradients and AdamW state; per_token: the activations of one token.
    std::string memory_advice(size_t free_at_start, size_t fixed, size_t per_token) const {
        const double gib = 1024.0 * 1024.0 * 1024.0;
        char msg[256];
        const size_t need = fixed + per_token * (size_t)B * T;
        const long fit = free_at_start > fixed ? (long)((free_at_start - fixed) / (per_token * (size_t)T)) : 0;
        std::snprintf(msg, sizeof msg,
                      "batch_size %d x seq_len %d needs about %.2f GiB (%.2f GiB weights, gradients and AdamW state, "
                      "%.2f GiB activations) and %.2f GiB were free at the start",
                      B, T, need / gib, fixed / gib, (need - fixed) / gib, free_at_start / gib);
        std::string s = msg;
        if (fit >= 1)
            s += "; try --batch_size " + std::to_string(std::min<long>(fit, B - 1 > 0 ? B - 1 : 1)) +
                 " (with --grad_accum to keep the tokens per step) or --recompute gelu|mlp";
        else
            s += "; even batch_size 1 does not fit: use a smaller model or a larger GPU";
        return s;
    }

    Impl(const ModelConfig& c, int B_, int T_, const GPUModelOptions& o)
        : cfg(c), opt(o), B(B_), T(T_), attention(o.prefer_cudnn, o.deterministic_attention) {
        CUDA_CHECK(cudaStreamCreate(&stream));
        for (const ParamInfo& t : param_layout(c)) n_params += t.size;
        const size_t L = c.n_layer, C = c.n_embd, NH = c.n_head, Vp = c.padded_vocab();
        const size_t BT = (size_t)B * T, BTC = BT * C;
        // Bytes of the allocations below: per parameter (bf16 weights, the masters' low halves, gradients, m, v)
        // and per token (the sizes below with BT = 1), for the out-of-memory message.
        size_t free_at_start = 0, total = 0;
        CUDA_CHECK(cudaMemGetInfo(&free_at_start, &total));
        const size_t fixed_bytes = TrainableParams::device_bytes(c, opt.data_parallel.get());
        const size_t bytes_per_token =
            sizeof(bf16) * (C + L * C * (1 + 3 + 1 + 1 + 1 + 1) +
                            (fch_slots().count(L) + gelu_slots().count(L)) * 4 * C + C + Vp + C * (1 + 1 + 1 + 4 + 3)) +
            sizeof(float) * (L * 4 + L * NH + 2 + 1) + sizeof(int) * 2;
        mem.hint = memory_advice(free_at_start, fixed_bytes, bytes_per_token);

        state = std::make_unique<TrainableParams>(c, opt.data_parallel, stream,
                                                  [this](size_t bytes) { return (void*)mem.alloc<char>(bytes); });
        params = state->params();
        grads = state->grads();
        p = param_views(params, cfg);
        g = param_views(grads, cfg);

        encoded = mem.alloc<bf16>(BTC);
        ln1 = mem.alloc<bf16>(L * BTC);
        ln1_mean = mem.alloc<float>(L * BT);
        ln1_rstd = mem.alloc<float>(L * BT);
        qkv = mem.alloc<bf16>(L * 3 * BTC);
        atty = mem.alloc<bf16>(L * BTC);
        lse = mem.alloc<float>(L * B * NH * T);
        residual2 = mem.alloc<bf16>(L * BTC);
        ln2 = mem.alloc<bf16>(L * BTC);
        ln2_mean = mem.alloc<float>(L * BT);
        ln2_rstd = mem.alloc<float>(L * BT);
        fch = mem.alloc<bf16>(fch_slots().count(L) * 4 * BTC);
        fch_gelu = mem.alloc<bf16>(gelu_slots().count(L) * 4 * BTC);
        residual3 = mem.alloc<bf16>(L * BTC);
        lnf = mem.alloc<bf16>(BTC);
        lnf_mean = mem.alloc<float>(BT);
        lnf_rstd = mem.alloc<float>(BT);
        logits = mem.alloc<bf16>(BT * Vp);
        losses = mem.alloc<float>(BT);

        dresidual = mem.alloc<bf16>(BTC);
        dbtc = mem.alloc<bf16>(BTC);
        btc = mem.alloc<bf16>(BTC);
        dbt4c = mem.alloc<bf16>(4 * BTC);
        dqkv = mem.alloc<bf16>(3 * BTC);
        const size_t reduce = std::max({layernorm_backward_scratch_floats((int)BT, (int)C),
                                        bias_backward_scratch_floats((int)BT, (int)(4 * C)),
                                        bias_backward_scratch_floats((int)BT, (int)(3 * C))});
        reduce_scratch = mem.alloc<float>(reduce);
        inputs = mem.alloc<int>(BT);
        targets = mem.alloc<int>(BT);
        buckets = encoder_buckets_create((int)BT);
        attention.reserve(B, T, (int)NH, (int)(C / NH));
    }

    ~Impl() {
        encoder_buckets_destroy(buckets);
        if (stream) cudaStreamDestroy(stream);
    }

    // Residual stream entering layer l.
    bf16* residual_in(size_t l) const { return l == 0 ? encoded : residual3 + (l - 1) * (size_t)B * T * cfg.n_embd; }
    // The fc output and the GELU output of each layer but those backward recomputes them for.
    LayerSlots fch_slots() const { return opt.fc_slots(cfg.n_layer); }
    LayerSlots gelu_slots() const { return opt.gelu_slots(cfg.n_layer); }
    bf16* fch_out(int l) const { return fch + fch_slots().of(l) * 4 * (size_t)B * T * cfg.n_embd; }
    bf16* gelu_out(int l) const { return fch_gelu + gelu_slots().of(l) * 4 * (size_t)B * T * cfg.n_embd; }

    double forward(const int* in_host, const int* tgt_host, bool backward_next, float grad_scale) {
        const int L = cfg.n_layer, C = cfg.n_embd, NH = cfg.n_head, HS = C / NH, V = cfg.vocab_size;
        const int Vp = cfg.padded_vocab(), BT = B * T;
        const size_t BTC = (size_t)BT * C;
        CUDA_CHECK(cudaMemcpyAsync(inputs, in_host, BT * sizeof(int), cudaMemcpyHostToDevice, stream));
        CUDA_CHECK(cudaMemcpyAsync(targets, tgt_host, BT * sizeof(int), cudaMemcpyHostToDevice, stream));

        encoder_forward(encoded, inputs, p.wte, p.wpe, B, T, C, stream);
        for (int l = 0; l < L; l++) {
            const LayerParams<bf16> w = layer_params(p, l, C);
            bf16* const l_ln1 = ln1 + l * BTC;
            bf16* const l_qkv = qkv + l * 3 * BTC;
            bf16* const l_atty = atty + l * BTC;
            bf16* const l_res2 = residual2 + l * BTC;
            bf16* const l_ln2 = ln2 + l * BTC;
            bf16* const l_fch = fch_out(l);
            layernorm_forward(l_ln1, ln1_mean + l * BT, ln1_rstd + l * BT, residual_in(l), w.ln1_w, w.ln1_b, BT, C, stream);
            matmul.forward(l_qkv, l_ln1, w.qkv_w, w.qkv_b, BT, C, 3 * C, stream);
            attention.forward(l_atty, lse + (size_t)l * B * NH * T, l_qkv, B, T, NH, HS, stream);
            dump(l, {{"x", residual_in(l), BTC}, {"qkv", l_qkv, 3 * BTC}, {"y", l_atty, BTC}}, stream);
            matmul.forward(btc, l_atty, w.proj_w, w.proj_b, BT, C, C, stream);
            residual_forward(l_res2, residual_in(l), btc, BTC, stream);
            layernorm_forward(l_ln2, ln2_mean + l * BT, ln2_rstd + l * BT, l_res2, w.ln2_w, w.ln2_b, BT, C, stream);
            matmul.forward(l_fch, l_ln2, w.fc_w, w.fc_b, BT, C, 4 * C, stream);
            gelu_forward(gelu_out(l), l_fch, 4 * BTC, stream);
            matmul.forward(btc, gelu_out(l), w.fcproj_w, w.fcproj_b, BT, 4 * C, C, stream);
            residual_forward(residual3 + l * BTC, l_res2, btc, BTC, stream);
        }
        layernorm_forward(lnf, lnf_mean, lnf_rstd, residual_in(L), p.lnf_w, p.lnf_b, BT, C, stream);
        matmul.forward_nt(logits, lnf, p.wte, BT, C, Vp, stream);
        fused_classifier(logits, losses, targets, BT, V, Vp, grad_scale / BT, backward_next, stream);

        // The embedding backward's token buckets are sorted on the host while the GPU runs the
        // forward queued above, instead of idling it at the start of the step (~1.3 ms on 16K tokens).
        if (backward_next) encoder_buckets_build(buckets, in_host, B, T, stream);
        return mean_device_loss(losses, BT, stream, host_losses);
    }

    void backward() {
        const int L = cfg.n_layer, C = cfg.n_embd, NH = cfg.n_head, HS = C / NH;
        const int Vp = cfg.padded_vocab(), BT = B * T;
        const size_t BTC = (size_t)BT * C;
        // The dW GEMMs write the weights' gradients in a step's first backward, then add to them
        // (TrainableParams::first_backward).
        const bool add = !state->first_backward();
        // LM head (tied): logits now hold dlogits
        matmul.backward_nt_weight(g.wte, lnf, logits, BT, C, Vp, add, stream);
        matmul.backward_nt_input(dbtc, logits, p.wte, BT, C, Vp, /*accumulate=*/false, stream);
        CUDA_CHECK(cudaMemsetAsync(dresidual, 0, BTC * sizeof(bf16), stream));
        layernorm_backward(dresidual, g.lnf_w, g.lnf_b, reduce_scratch, dbtc, residual_in(L), p.lnf_w, lnf_mean,
                           lnf_rstd, BT, C, stream);

        for (int l = L - 1; l >= 0; l--) {
            const LayerParams<bf16> w = layer_params(p, l, C);
            const LayerParams<float> dw = layer_params(g, l, C);
            bf16* const l_ln1 = ln1 + l * BTC;
            bf16* const l_qkv = qkv + l * 3 * BTC;
            bf16* const l_atty = atty + l * BTC;
            bf16* const l_res2 = residual2 + l * BTC;
            bf16* const l_ln2 = ln2 + l * BTC;
            bf16* const l_fch = fch_out(l);
            // dresidual is the gradient of residual3[l] = residual2 + fcproj(gelu(fc(ln2)))
            dump(l, {{"dout", dresidual, BTC}}, stream);
            if (l < fch_slots().r) matmul.forward(l_fch, l_ln2, w.fc_w, w.fc_b, BT, C, 4 * C, stream);
            if (l < gelu_slots().r) gelu_forward(gelu_out(l), l_fch, 4 * BTC, stream);
            matmul.backward_weight(dw.fcproj_w, gelu_out(l), dresidual, BT, 4 * C, C, add, stream);
            bias_backward(dw.fcproj_b, reduce_scratch, dresidual, BT, C, stream);
            matmul.backward_input(dbt4c, dresidual, w.fcproj_w, BT, 4 * C, C, false, stream);
            gelu_backward(dbt4c, l_fch, dbt4c, 4 * BTC, stream);
            matmul.backward_weight(dw.fc_w, l_ln2, dbt4c, BT, C, 4 * C, add, stream);
            bias_backward(dw.fc_b, reduce_scratch, dbt4c, BT, 4 * C, stream);
            matmul.backward_input(dbtc, dbt4c, w.fc_w, BT, C, 4 * C, false, stream);
            layernorm_backward(dresidual, dw.ln2_w, dw.ln2_b, reduce_scratch, dbtc, l_res2, w.ln2_w,
                               ln2_mean + l * BT, ln2_rstd + l * BT, BT, C, stream);
            // dresidual is now the gradient of residual2 = residual_in + proj(attention(qkv(ln1)))
            matmul.backward_weight(dw.proj_w, l_atty, dresidual, BT, C, C, add, stream);
            bias_backward(dw.proj_b, reduce_scratch, dresidual, BT, C, stream);
            matmul.backward_input(dbtc, dresidual, w.proj_w, BT, C, C, false, stream);
            attention.backward(dqkv, dbtc, l_qkv, l_atty, lse + (size_t)l * B * NH * T, B, T, NH, HS, stream);
            dump(l, {{"dy", dbtc, BTC}, {"dqkv", dqkv, 3 * BTC}}, stream);
            matmul.backward_weight(dw.qkv_w, l_ln1, dqkv, BT, C, 3 * C, add, stream);
            bias_backward(dw.qkv_b, reduce_scratch, dqkv, BT, 3 * C, stream);
            matmul.backward_input(dbtc, dqkv, w.qkv_w, BT, C, 3 * C, false, stream);
            layernorm_backward(dresidual, dw.ln1_w, dw.ln1_b, reduce_scratch, dbtc, residual_in(l), w.ln1_w,
                               ln1_mean + l * BT, ln1_rstd + l * BT, BT, C, stream);
            state->layer_grads_done(l);
        }
        encoder_backward(g.wte, g.wpe, dresidual, buckets, B, T, C, stream);
        state->layer_grads_done(-1);
    }

    double grad_norm() { return state->grad_norm(); }
    void apply_update(double lr, const TrainConfig& c) {
        state->apply_update(lr, c);
        CUDA_CHECK(cudaStreamSynchronize(stream));
    }
};

GPT2GPU::GPT2GPU(const ModelConfig& cfg, int B, int T, const GPUModelOptions& opt)
    : impl_(std::make_unique<Impl>(cfg, B, T, opt)) {
    num_params_ = impl_->n_params;
}
GPT2GPU::~GPT2GPU() = default;

void GPT2GPU::set_params(const std::vector<float>& params) { impl_->state->set_params(params); }
std::vector<float> GPT2GPU::master_params() const { return impl_->state->master_params(); }
GPT2GPU::OptimizerState GPT2GPU::optimizer_state() const {
    return {impl_->state->m(), impl_->state->v(), impl_->state->step()};
}
void GPT2GPU::set_optimizer_state(const std::vector<float>& m, const std::vector<float>& v, long t) {
    impl_->state->set_optimizer_state(m, v, t);
}
std::vector<float> GPT2GPU::grads() const { return impl_->state->local_grads(); }

double GPT2GPU::forward(const int* inputs, const int* targets, bool backward_next, float grad_scale) {
    return impl_->forward(inputs, targets, backward_next, grad_scale);
}
void GPT2GPU::backward() { impl_->backward(); }
void GPT2GPU::zero_grad() { impl_->state->zero_grad(); }
double GPT2GPU::update(double lr, const TrainConfig& c) {
    const double norm = impl_->grad_norm();
    impl_->apply_update(lr, c);
    return norm;
}
double GPT2GPU::grad_norm() { return impl_->grad_norm(); }
void GPT2GPU::apply_update(double lr, const TrainConfig& c) { impl_->apply_update(lr, c); }
void GPT2GPU::time_phases() { impl_->state->time_phases(); }
StepPhases GPT2GPU::phases() const { return impl_->state->phases(); }

const std::vector<float>& GPT2GPU::token_losses() const { return impl_->host_losses; }

std::vector<float> GPT2GPU::logits() const {
    return download_bf16(impl_->logits, (size_t)impl_->B * impl_->T * impl_->cfg.padded_vocab(), impl_->stream);
}

const char* GPT2GPU::attention_backend() const { return impl_->attention.backend(); }

// ---- decoding with a KV cache

struct GPT2GPUDecoder::Impl {
    ModelConfig cfg;
    DeviceBuffers mem;  // declared before every pointer into it
    const bf16* params = nullptr;
    bf16* owned_params = nullptr;  // when the decoder holds its own copy of the weights
    GPT2Params<const bf16> p{};
    Matmul matmul;
    cudaStream_t stream = nullptr;
    bool own_stream = false;
    int* tokens;
    // Rows of the positions fed in one call (up to max_seq_len: a whole prompt), then the caches.
    bf16 *x, *ln, *qkv, *atty, *proj, *fch, *fch_gelu;
    float *mean, *rstd, *logits;
    bf16 *k_cache, *v_cache;  // [L, max_seq_len, C] each
    std::vector<float> host_logits;

    // weights: bf16 on the device in param_layout order, or null to allocate them (set by the caller).
    // stream: the weights' owner's, so that decoding is ordered after its updates; null for an own one.
    Impl(const ModelConfig& c, const bf16* weights, cudaStream_t s) : cfg(c), params(weights), stream(s) {
        const size_t L = c.n_layer, C = c.n_embd, T = c.max_seq_len;
        if (!params) params = owned_params = mem.alloc<bf16>(c.num_params());
        p = param_views(params, cfg);
        tokens = mem.alloc<int>(T);
        x = mem.alloc<bf16>(T * C);
        ln = mem.alloc<bf16>(T * C);
        qkv = mem.alloc<bf16>(T * 3 * C);
        atty = mem.alloc<bf16>(T * C);
        proj = mem.alloc<bf16>(T * C);
        fch = mem.alloc<bf16>(T * 4 * C);
        fch_gelu = mem.alloc<bf16>(T * 4 * C);
        mean = mem.alloc<float>(T);
        rstd = mem.alloc<float>(T);
        logits = mem.alloc<float>(c.vocab_size);
        k_cache = mem.alloc<bf16>(L * T * C);
        v_cache = mem.alloc<bf16>(L * T * C);
        host_logits.resize(c.vocab_size);
        if (!stream) {
            CUDA_CHECK(cudaStreamCreate(&stream));
            own_stream = true;
        }
    }
    ~Impl() {
        if (own_stream) cudaStreamDestroy(stream);
    }

    // The unfused forward (GPT2GPU::Impl::forward) for n rows at positions pos..pos+n-1, with the
    // attention of each row against the cache; the logits of the last row only.
    const float* forward(const int* host_tokens, int n, int pos) {
        const int L = cfg.n_layer, C = cfg.n_embd, NH = cfg.n_head, HS = C / NH, T = cfg.max_seq_len;
        const long nC = (long)n * C;
        CUDA_CHECK(cudaMemcpyAsync(tokens, host_tokens, n * sizeof(int), cudaMemcpyHostToDevice, stream));
        // Row r gets wpe[pos + r]: the encoder adds wpe row (r mod T) of the table it is given.
        encoder_forward(x, tokens, p.wte, p.wpe + (size_t)pos * C, 1, n, C, stream);
        for (int l = 0; l < L; l++) {
            const LayerParams<const bf16> w = layer_params(p, l, C);
            bf16* const kc = k_cache + (size_t)l * T * C;
            bf16* const vc = v_cache + (size_t)l * T * C;
            layernorm_forward(ln, mean, rstd, x, w.ln1_w, w.ln1_b, n, C, stream);
            matmul.forward(qkv, ln, w.qkv_w, w.qkv_b, n, C, 3 * C, stream);
            // The rows' keys and values (columns C..2C and 2C..3C of qkv) join the cache at their positions.
            for (int part = 1; part <= 2; part++)
                CUDA_CHECK(cudaMemcpy2DAsync((part == 1 ? kc : vc) + (size_t)pos * C, C * sizeof(bf16),
                                             qkv + part * C, 3 * C * sizeof(bf16), C * sizeof(bf16), n,
                                             cudaMemcpyDeviceToDevice, stream));
            decode_attention(atty, qkv, 3 * C, kc, vc, n, pos, NH, HS, stream);
            matmul.forward(proj, atty, w.proj_w, w.proj_b, n, C, C, stream);
            residual_forward(x, x, proj, nC, stream);
            layernorm_forward(ln, mean, rstd, x, w.ln2_w, w.ln2_b, n, C, stream);
            matmul.forward(fch, ln, w.fc_w, w.fc_b, n, C, 4 * C, stream);
            gelu_forward(fch_gelu, fch, 4 * nC, stream);
            matmul.forward(proj, fch_gelu, w.fcproj_w, w.fcproj_b, n, 4 * C, C, stream);
            residual_forward(x, x, proj, nC, stream);
        }
        layernorm_forward(ln, mean, rstd, x + (size_t)(n - 1) * C, p.lnf_w, p.lnf_b, 1, C, stream);
        decode_logits(logits, ln, p.wte, cfg.vocab_size, C, stream);
        CUDA_CHECK(cudaMemcpyAsync(host_logits.data(), logits, host_logits.size() * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));
        return host_logits.data();
    }
};

GPT2GPUDecoder::GPT2GPUDecoder(const GPT2GPU& model)
    : impl_(std::make_unique<Impl>(model.impl_->cfg, model.impl_->params, model.impl_->stream)) {}

GPT2GPUDecoder::GPT2GPUDecoder(const ModelConfig& m, const bf16* weights, cudaStream_t stream)
    : impl_(std::make_unique<Impl>(m, weights, stream)) {}

GPT2GPUDecoder::GPT2GPUDecoder(const ModelConfig& m, const std::vector<float>& params) {
    if (params.size() != m.num_params())
        throw Error("GPT2GPUDecoder: expected " + std::to_string(m.num_params()) + " weights, got " +
                    std::to_string(params.size()));
    impl_ = std::make_unique<Impl>(m, nullptr, nullptr);
    upload_bf16(impl_->owned_params, params);
}

GPT2GPUDecoder::~GPT2GPUDecoder() = default;

const ModelConfig& GPT2GPUDecoder::config() const { return impl_->cfg; }

const float* GPT2GPUDecoder::forward(const int* tokens, int n) { return impl_->forward(tokens, n, pos_); }

}  // namespace codagpt
