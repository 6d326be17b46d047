// The CPU reference GPT-2, in the shape of llm.c's train_gpt2.c: parameters, activations, and the
// forward and backward passes written as calls to the per-op functions of ops_cpu.hpp.
//
// Determinism: every op computes each output element in one thread, in a fixed order (see
// ops_cpu.cpp), so results are bit-identical across runs and OpenMP thread counts.
#include "model_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <stdexcept>
#include <type_traits>

#include "ops_cpu.hpp"
#include "rng.hpp"
#include "tensor_dump.hpp"

namespace codagpt {

namespace {

// ---------------------------------------------------------------- parameter and activation lists

// Activations kept by forward for backward; the gradient buffer uses the same layout (its
// mean/rstd/att/inv_sum/losses slots stay unused). Layer tensors are stacked over layers.
template <typename F>
struct Acts {
    F* encoded;    // [B, T, C]  token + position embedding: the residual entering layer 0
    F* ln1;        // [L, B, T, C]
    F* ln1_mean;   // [L, B, T]
    F* ln1_rstd;   // [L, B, T]
    F* qkv;        // [L, B, T, 3C]
    F* atty;       // [L, B, T, C]  attention output, heads side by side
    F* att;        // [L, B, NH, T, T]  softmax probabilities, zero above the diagonal
    F* attproj;    // [L, B, T, C]
    F* residual2;  // [L, B, T, C]
    F* ln2;        // [L, B, T, C]
    F* ln2_mean;   // [L, B, T]
    F* ln2_rstd;   // [L, B, T]
    F* fch;        // [L, B, T, 4C]  pre-GELU
    F* fch_gelu;   // [L, B, T, 4C]
    F* fcproj;     // [L, B, T, C]
    F* residual3;  // [L, B, T, C]  the layer's output
    F* lnf;        // [B, T, C]
    F* lnf_mean;   // [B, T]
    F* lnf_rstd;   // [B, T]
    F* inv_sum;    // [B, T]  1 / sum of the row's softmax exponentials
    F* losses;     // [B, T]
};

// CODAGPT_DUMP (tensor_dump.hpp): one of layer l's tensors, as fp32.
template <typename F>
void dump(const char* name, long l, const F* data, size_t n) {
    if (!dump_layer((int)l)) return;
    if constexpr (std::is_same_v<F, float>)
        dump_tensor(name, (int)l, data, n);
    else
        dump_tensor(name, (int)l, std::vector<float>(data, data + n).data(), n);
}

template <typename F, typename Fn>
void for_each_act(Acts<F>& a, const ModelConfig& m, size_t B, size_t T, Fn&& fn) {
    const size_t L = m.n_layer, C = m.n_embd, NH = m.n_head, BT = B * T;
    fn(a.encoded, BT * C);
    fn(a.ln1, L * BT * C);
    fn(a.ln1_mean, L * BT);
    fn(a.ln1_rstd, L * BT);
    fn(a.qkv, L * BT * 3 * C);
    fn(a.atty, L * BT * C);
    fn(a.att, L * B * NH * T * T);
    fn(a.attproj, L * BT * C);
    fn(a.residual2, L * BT * C);
    fn(a.ln2, L * BT * C);
    fn(a.ln2_mean, L * BT);
    fn(a.ln2_rstd, L * BT);
    fn(a.fch, L * BT * 4 * C);
    fn(a.fch_gelu, L * BT * 4 * C);
    fn(a.fcproj, L * BT * C);
    fn(a.residual3, L * BT * C);
    fn(a.lnf, BT * C);
    fn(a.lnf_mean, BT);
    fn(a.lnf_rstd, BT);
    fn(a.inv_sum, BT);
    fn(a.losses, BT);
}

template <typename F>
size_t acts_size(const ModelConfig& m, size_t B, size_t T) {
    Acts<F> unused{};
    size_t n = 0;
    for_each_act(unused, m, B, T, [&](F*&, size_t size) { n += size; });
    return n;
}

template <typename F>
Acts<F> acts_view(F* base, const ModelConfig& m, size_t B, size_t T) {
    Acts<F> a{};
    for_each_act(a, m, B, T, [&](F*& ptr, size_t size) {
        ptr = base;
        base += size;
    });
    return a;
}

// One layer's slice of the stacked activations.
template <typename F>
struct LayerActs {
    F *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *attproj, *residual2, *ln2, *ln2_mean, *ln2_rstd,
        *fch, *fch_gelu, *fcproj, *residual3;
};

template <typename F>
LayerActs<F> layer_acts(const Acts<F>& a, const ModelConfig& m, size_t l, size_t B, size_t T) {
    const size_t C = m.n_embd, NH = m.n_head, BT = B * T, BTC = BT * C;
    return {a.ln1 + l * BTC,        a.ln1_mean + l * BT,  a.ln1_rstd + l * BT,  a.qkv + l * 3 * BTC,
            a.atty + l * BTC,       a.att + l * B * NH * T * T, a.attproj + l * BTC, a.residual2 + l * BTC,
            a.ln2 + l * BTC,        a.ln2_mean + l * BT,  a.ln2_rstd + l * BT,  a.fch + l * 4 * BTC,
            a.fch_gelu + l * 4 * BTC, a.fcproj + l * BTC, a.residual3 + l * BTC};
}

}  // namespace

// ---------------------------------------------------------------- the model

std::vector<ParamInfo> param_layout(const ModelConfig& m) {
    std::vector<ParamInfo> layout;
    GPT2Params<float> unused{};
    for_each_param(unused, m, [&](const char* name, float*& field, size_t size, bool decay, Init) {
        // The layers' tensors are the fields from ln1_w to fcproj_b (LayerParams'), declared in a row.
        const bool stacked = &field >= &unused.ln1_w && &field <= &unused.fcproj_b;
        layout.push_back({name, size, decay, stacked ? m.n_layer : 1});
    });
    return layout;
}

std::vector<float> gpt2_init_params(const ModelConfig& m, uint64_t seed) {
    constexpr size_t kChunk = size_t(1) << 20;
    const double std_normal = 0.02, std_residual = 0.02 / std::sqrt(2.0 * m.n_layer);
    const size_t real_wte = (size_t)m.vocab_size * m.n_embd;
    size_t total = 0;
    for (const ParamInfo& p : param_layout(m)) total += p.size;
    std::vector<float> w(total);
    GPT2Params<float> pv = param_views(w.data(), m);
    uint64_t tensor = 0;
    for_each_param(pv, m, [&](const char*, float*& ptr, size_t size, bool, Init init) {
        std::fill(ptr, ptr + size, init == Init::ones ? 1.0f : 0.0f);
        const uint64_t index = tensor++;
        if (init != Init::normal && init != Init::normal_residual) return;
        const double sigma = init == Init::normal ? std_normal : std_residual;
        const size_t drawn = ptr == pv.wte ? real_wte : size;
        float* const out = ptr;
        const long chunks = (long)((drawn + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(dynamic)
        for (long k = 0; k < chunks; k++) {
            Rng rng(seed ^ ((index + 1) << 48) ^ ((uint64_t)k * 0x9E3779B97F4A7C15ull));
            const size_t end = std::min(drawn, (size_t)(k + 1) * kChunk);
            for (size_t i = (size_t)k * kChunk; i < end; i++) out[i] = (float)(sigma * rng.normal());
        }
    });
    return w;
}

template <typename F>
GPT2CPU<F>::GPT2CPU(const ModelConfig& cfg) : cfg_(cfg), layout_(param_layout(cfg)) {
    size_t n = 0;
    for (const ParamInfo& t : layout_) n += t.size;
    params.assign(n, F(0));
    grads.assign(n, F(0));
    wte_t_.resize((size_t)cfg.n_embd * cfg.padded_vocab());
}

template <typename F>
GPT2Params<F> GPT2CPU<F>::view(F* base) const {
    return param_views(base, cfg_);
}

template <typename F>
void GPT2CPU<F>::init(uint64_t seed) {
    const std::vector<float> w = gpt2_init_params(cfg_, seed);
    std::copy(w.begin(), w.end(), params.begin());
}

template <typename F>
void GPT2CPU<F>::zero_grad() {
    std::fill(grads.begin(), grads.end(), F(0));
}

template <typename F>
void GPT2CPU<F>::ensure_activations(int B, int T) {
    if (B == B_ && T == T_) return;
    B_ = B;
    T_ = T;
    const size_t n = acts_size<F>(cfg_, B, T), nlogits = (size_t)B * T * cfg_.padded_vocab();
    acts_.assign(n, F(0));
    dacts_.assign(n, F(0));
    logits_.assign(nlogits, F(0));
    dlogits_.assign(nlogits, F(0));
    scratch_.resize((size_t)std::max(B * T, cfg_.n_embd) * 4 * cfg_.n_embd);  // max(M, N) * K of any product
    inputs_.resize((size_t)B * T);
    targets_.resize((size_t)B * T);
}

template <typename F>
F GPT2CPU<F>::forward(const int* inputs, const int* targets, int B, int T) {
    if (B < 1 || T < 1 || T > cfg_.max_seq_len)
        throw std::invalid_argument("GPT2CPU::forward: bad batch shape " + std::to_string(B) + "x" +
                                    std::to_string(T));
    ensure_activations(B, T);
    const long L = cfg_.n_layer, C = cfg_.n_embd, NH = cfg_.n_head, V = cfg_.vocab_size,
               Vp = cfg_.padded_vocab(), BT = (long)B * T;
    std::copy(inputs, inputs + BT, inputs_.begin());
    const GPT2Params<F> pv = p();
    const Acts<F> a = acts_view(acts_.data(), cfg_, B, T);

    cpu::encoder_forward(a.encoded, inputs, pv.wte, pv.wpe, B, T, C);
    for (long l = 0; l < L; l++) {
        const LayerParams<F> lp = layer_params(pv, l, C);
        const LayerActs<F> la = layer_acts(a, cfg_, l, B, T);
        const F* residual = l == 0 ? a.encoded : layer_acts(a, cfg_, l - 1, B, T).residual3;
        cpu::layernorm_forward(la.ln1, la.ln1_mean, la.ln1_rstd, residual, lp.ln1_w, lp.ln1_b, BT, C);
        cpu::matmul_forward(la.qkv, la.ln1, lp.qkv_w, lp.qkv_b, BT, C, 3 * C);
        cpu::attention_forward(la.atty, la.att, la.qkv, B, T, C, NH);
        dump("x", l, residual, BT * C);
        dump("qkv", l, la.qkv, BT * 3 * C);
        dump("y", l, la.atty, BT * C);
        cpu::matmul_forward(la.attproj, la.atty, lp.proj_w, lp.proj_b, BT, C, C);
        cpu::residual_forward(la.residual2, residual, la.attproj, BT * C);
        cpu::layernorm_forward(la.ln2, la.ln2_mean, la.ln2_rstd, la.residual2, lp.ln2_w, lp.ln2_b, BT, C);
        cpu::matmul_forward(la.fch, la.ln2, lp.fc_w, lp.fc_b, BT, C, 4 * C);
        cpu::gelu_forward(la.fch_gelu, la.fch, BT * 4 * C);
        cpu::matmul_forward(la.fcproj, la.fch_gelu, lp.fcproj_w, lp.fcproj_b, BT, 4 * C, C);
        cpu::residual_forward(la.residual3, la.residual2, la.fcproj, BT * C);
    }
    const F* last = layer_acts(a, cfg_, L - 1, B, T).residual3;
    cpu::layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, last, pv.lnf_w, pv.lnf_b, BT, C);
    cpu::lm_head_forward(logits_.data(), wte_t_.data(), a.lnf, pv.wte, BT, C, Vp);

    backward_ready_ = has_losses_ = targets != nullptr;
    if (!targets) return F(0);
    std::copy(targets, targets + BT, targets_.begin());
    cpu::softmax_crossentropy_forward(dlogits_.data(), a.inv_sum, a.losses, logits_.data(), targets, BT, V, Vp);
    double sum = 0;
    for (long i = 0; i < BT; i++) sum += a.losses[i];
    return F(sum / BT);
}

template <typename F>
std::vector<F> GPT2CPU<F>::token_losses() const {
    if (!has_losses_) throw std::logic_error("GPT2CPU::token_losses needs a forward() with targets first");
    const F* losses = acts_view(const_cast<F*>(acts_.data()), cfg_, B_, T_).losses;
    return {losses, losses + (size_t)B_ * T_};
}

template <typename F>
void GPT2CPU<F>::backward(F grad_scale) {
    if (!backward_ready_) throw std::logic_error("GPT2CPU::backward needs a forward() with targets first");
    backward_ready_ = false;
    const long L = cfg_.n_layer, C = cfg_.n_embd, NH = cfg_.n_head, V = cfg_.vocab_size,
               Vp = cfg_.padded_vocab(), B = B_, T = T_, BT = B * T;
    const GPT2Params<F> pv = p(), gv = g();
    const Acts<F> a = acts_view(acts_.data(), cfg_, B, T);
    std::fill(dacts_.begin(), dacts_.end(), F(0));
    const Acts<F> d = acts_view(dacts_.data(), cfg_, B, T);

    F* dlogits = dlogits_.data();
    cpu::softmax_crossentropy_backward(dlogits, a.inv_sum, targets_.data(), BT, V, Vp, grad_scale / F(BT));
    cpu::lm_head_backward(d.lnf, gv.wte, wte_t_.data(), scratch_.data(), dlogits, a.lnf, pv.wte, BT, C, Vp);
    const LayerActs<F> last = layer_acts(a, cfg_, L - 1, B, T), dlast = layer_acts(d, cfg_, L - 1, B, T);
    cpu::layernorm_backward(dlast.residual3, gv.lnf_w, gv.lnf_b, d.lnf, last.residual3, pv.lnf_w, a.lnf_mean,
                       a.lnf_rstd, BT, C);
    for (long l = L - 1; l >= 0; l--) {
        const LayerParams<F> lp = layer_params(pv, l, C), lg = layer_params(gv, l, C);
        const LayerActs<F> la = layer_acts(a, cfg_, l, B, T), ld = layer_acts(d, cfg_, l, B, T);
        const F* residual = l == 0 ? a.encoded : layer_acts(a, cfg_, l - 1, B, T).residual3;
        F* dresidual = l == 0 ? d.encoded : layer_acts(d, cfg_, l - 1, B, T).residual3;
        dump("dout", l, ld.residual3, BT * C);
        cpu::residual_backward(ld.residual2, ld.fcproj, ld.residual3, BT * C);
        cpu::matmul_backward(ld.fch_gelu, lg.fcproj_w, lg.fcproj_b, ld.fcproj, la.fch_gelu, lp.fcproj_w, scratch_.data(),
                        BT, 4 * C, C);
        cpu::gelu_backward(ld.fch, la.fch, ld.fch_gelu, BT * 4 * C);
        cpu::matmul_backward(ld.ln2, lg.fc_w, lg.fc_b, ld.fch, la.ln2, lp.fc_w, scratch_.data(), BT, C, 4 * C);
        cpu::layernorm_backward(ld.residual2, lg.ln2_w, lg.ln2_b, ld.ln2, la.residual2, lp.ln2_w, la.ln2_mean,
                           la.ln2_rstd, BT, C);
        cpu::residual_backward(dresidual, ld.attproj, ld.residual2, BT * C);
        cpu::matmul_backward(ld.atty, lg.proj_w, lg.proj_b, ld.attproj, la.atty, lp.proj_w, scratch_.data(), BT, C, C);
        cpu::attention_backward(ld.qkv, ld.atty, la.qkv, la.att, B, T, C, NH);
        dump("dy", l, ld.atty, BT * C);
        dump("dqkv", l, ld.qkv, BT * 3 * C);
        cpu::matmul_backward(ld.ln1, lg.qkv_w, lg.qkv_b, ld.qkv, la.ln1, lp.qkv_w, scratch_.data(), BT, C, 3 * C);
        cpu::layernorm_backward(dresidual, lg.ln1_w, lg.ln1_b, ld.ln1, residual, lp.ln1_w, la.ln1_mean, la.ln1_rstd,
                           BT, C);
    }
    cpu::encoder_backward(gv.wte, gv.wpe, d.encoded, inputs_.data(), B, T, C);
}

template class GPT2CPU<float>;
template class GPT2CPU<double>;

}  // namespace codagpt
